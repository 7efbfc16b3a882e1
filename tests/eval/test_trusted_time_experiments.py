"""`scripts/trusted_time/`: the GPU experiments of the trusted-time study, checked where no GPU is.

The driver bindings against CUDA's own header (names, argument counts, enum values, structure layouts), the
kernels built for sm_90, the NVRTC build, the analysis of the rig's stamps, the launch-spec expressions,
the MPS daemon's start and cleanup (with a stand-in control program), an overrunning experiment being
ended, and a whole dry run through the orchestrator (processes, the sandbox, sockets, descriptors, JSON).
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TT = ROOT / "scripts" / "trusted_time"
sys.path[:0] = [str(TT)]

import exp_rig  # noqa: E402
import run_experiments  # noqa: E402
import tt_client  # noqa: E402
import tt_common  # noqa: E402
import tt_cuda  # noqa: E402
import tt_mps  # noqa: E402

CUDA_H = sorted(glob.glob("/usr/local/cuda*/include/cuda.h"))


def _header() -> str:
    if not CUDA_H:
        pytest.skip("no CUDA toolkit header (cuda.h)")
    return Path(CUDA_H[-1]).read_text(errors="replace")


def test_every_driver_call_is_declared_in_cuda_h_with_as_many_arguments():
    header = _header()
    for name, argtypes in tt_cuda.SIGNATURES.items():
        declared = name
        alias = re.search(rf"#define\s+(\w+)\s+(?:__CUDA_API_PTSZ\()?{re.escape(name)}\)?\s", header)
        if alias:  # a versioned symbol: the header declares the plain name and maps it
            declared = alias.group(1)
        match = re.search(rf"CUresult CUDAAPI {re.escape(declared)}\(([^;]*?)\);", header, re.S)
        assert match, f"{name} is not declared in cuda.h"
        params = match.group(1).strip()
        count = 0 if params in ("", "void") else params.count(",") + 1
        assert count == len(argtypes), f"{name}: {count} parameters in cuda.h, {len(argtypes)} bound"


def test_enum_values_match_cuda_h():
    header = _header()

    def value(name: str) -> int:
        m = re.search(rf"\b{name}\s*=\s*(0x[0-9a-fA-F]+|\d+)", header)
        assert m, name
        return int(m.group(1), 0)

    for const in ("CU_STREAM_NON_BLOCKING", "CU_EVENT_DISABLE_TIMING", "CU_STREAM_WAIT_VALUE_GEQ",
                  "CU_STREAM_WRITE_VALUE_DEFAULT", "CU_FUNC_ATTRIBUTE_NUM_REGS",
                  "CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES", "CU_LIMIT_PERSISTING_L2_CACHE_SIZE",
                  "CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW", "CU_ACCESS_PROPERTY_STREAMING",
                  "CU_ACCESS_PROPERTY_PERSISTING", "CUDA_ERROR_NOT_READY"):
        assert getattr(tt_cuda, const) == value(const), const
    names = {"clock_khz": "CLOCK_RATE", "sm_count": "MULTIPROCESSOR_COUNT", "cc_major": "COMPUTE_CAPABILITY_MAJOR",
             "cc_minor": "COMPUTE_CAPABILITY_MINOR", "l2_bytes": "L2_CACHE_SIZE",
             "max_threads_per_sm": "MAX_THREADS_PER_MULTIPROCESSOR",
             "smem_per_sm": "MAX_SHARED_MEMORY_PER_MULTIPROCESSOR", "cooperative_launch": "COOPERATIVE_LAUNCH",
             "smem_optin": "MAX_SHARED_MEMORY_PER_BLOCK_OPTIN", "vmm": "VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED",
             "posix_fd_handles": "HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED",
             "max_persisting_l2": "MAX_PERSISTING_L2_CACHE_SIZE",
             "max_access_policy_window": "MAX_ACCESS_POLICY_WINDOW_SIZE",
             "reserved_smem_per_block": "RESERVED_SHARED_MEMORY_PER_BLOCK",
             "stream_wait_value_nor": "CAN_USE_STREAM_WAIT_VALUE_NOR", "mps_enabled": "MPS_ENABLED"}
    assert set(names) == set(tt_cuda.ATTRIBUTES)
    for key, suffix in names.items():
        assert tt_cuda.ATTRIBUTES[key] == value(f"CU_DEVICE_ATTRIBUTE_{suffix}"), key


def test_structure_layouts_match_cuda_h(tmp_path):
    _header()
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    src = tmp_path / "sizes.c"
    src.write_text(textwrap.dedent("""
        #include <cuda.h>
        #include <stdio.h>
        #include <stddef.h>
        int main(void) {
            printf("%zu %zu %zu %zu %zu %zu %zu %zu\\n", sizeof(CUaccessPolicyWindow), sizeof(CUstreamAttrValue),
                   sizeof(CUcheckpointLockArgs), sizeof(CUcheckpointUnlockArgs), sizeof(CUmemAllocationProp),
                   sizeof(CUmemAccessDesc), offsetof(CUaccessPolicyWindow, hitRatio),
                   offsetof(CUmemAllocationProp, allocFlags));
            return 0;
        }
    """))
    exe = tmp_path / "sizes"
    subprocess.run([cc, f"-I{Path(CUDA_H[-1]).parent}", str(src), "-o", str(exe)], check=True, timeout=120)
    got = [int(x) for x in subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split()]
    import ctypes

    ours = [ctypes.sizeof(tt_cuda._AccessPolicyWindow), ctypes.sizeof(tt_cuda._StreamAttrValue),
            ctypes.sizeof(tt_cuda._CheckpointArgs), ctypes.sizeof(ctypes.c_uint64 * 8),
            ctypes.sizeof(tt_cuda._AllocationProp), ctypes.sizeof(tt_cuda._AccessDesc),
            tt_cuda._AccessPolicyWindow.hitRatio.offset, tt_cuda._AllocationProp.allocFlags.offset]
    assert ours == got


@pytest.mark.nvcc
def test_every_kernel_source_builds_for_sm_90(tmp_path):
    for name, (source, flags) in run_experiments.CUBINS.items():
        out = tmp_path / f"{name}.cubin"
        p = subprocess.run(["nvcc", "-cubin", "-arch=sm_90", *flags, "-o", str(out), str(TT / source)],
                           capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr
        assert out.stat().st_size > 0
    assert b"cudaCDP2LaunchDevice" in (tmp_path / "planted_cdp.cubin").read_bytes()


def test_the_kernel_only_source_builds_with_nvrtc():
    import tt_nvrtc

    try:
        out = tt_nvrtc.compile_source((TT / "e5_kernels.cu").read_text())
    except OSError:
        pytest.skip("no libnvrtc here")
    assert out["ok"], out.get("log")
    assert out["cubin"][:4] == b"\x7fELF"


def test_the_rig_turns_stamps_into_bracket_parts():
    s = [0] * 16
    s[0], s[1], s[2] = 100, 400, 1_000          # B1: start, all resident, end (ns)
    s[3], s[4] = 2_000, 22_000                  # K: 20 us
    s[5], s[7], s[8], s[12] = 23_500, 30_000, 64, 132
    rows = exp_rig.analyse([{"r": 0, "seq": 1, "br_ms": 0.025, "b1_ms": 0.004, "s": s}], out_words=64)
    call = rows[0]
    assert call["k_us"] == pytest.approx(20.0)
    assert call["c_us"] == pytest.approx(5.0)
    assert call["gate_us"] == pytest.approx(1.0)
    assert call["done_us"] == pytest.approx(1.5)
    assert call["b1_wait_us"] == pytest.approx(0.3)
    assert call["complete"] and not call["k_before_b1_end"]
    s[3] = exp_rig.NO_STAMP  # K never ran: no parts, only the bracket
    assert "c_us" not in exp_rig.analyse([{"r": 0, "seq": 2, "br_ms": 0.01, "b1_ms": 0.0, "s": s}], 64)[0]


def test_statistics_and_slot_runs():
    d = tt_common.describe([1.0, 2.0, 3.0, 4.0, float("nan")])
    assert d["n"] == 4 and d["median"] == 2.5 and d["iqr"] == 1.5
    assert tt_common.describe([]) == {"n": 0}
    assert tt_client.slot_runs([4095, 0, 1, 7, 8, 8]) == [(0, 2), (7, 2), (4095, 1)]


def test_launch_spec_expressions_are_arithmetic_of_the_dimensions_only():
    assert tt_client.evaluate("ceil(N / 32)", {"N": 100}) == 4
    assert tt_client.evaluate("SM * 8 + max(M, 2) // 2", {"SM": 132, "M": 7}) == 132 * 8 + 3
    for bad in ("__import__('os')", "N.bit_length()", "open('x')", "[1][0]", "X"):
        with pytest.raises(ValueError):
            tt_client.evaluate(bad, {"N": 1})


def _fake_mps_control(folder: Path) -> str:
    """A stand-in for nvidia-cuda-mps-control: `-d` daemonizes (named like the real one), `quit` ends it."""
    path = folder / "nvidia-cuda-mps-control"
    path.write_text(f"#!{sys.executable}\n" + textwrap.dedent("""
        import os, signal, sys, time
        pipe = os.environ["CUDA_MPS_PIPE_DIRECTORY"]
        pidfile = os.path.join(pipe, "fake.pid")
        if "-d" in sys.argv[1:]:
            if os.fork():
                sys.exit(0)
            os.setsid()
            if os.fork():
                os._exit(0)
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            os.execv(sys.argv[0], [sys.argv[0], "--serve"])
        if "--serve" in sys.argv[1:]:
            with open(pidfile, "w") as f:
                f.write(str(os.getpid()))
            open(os.path.join(pipe, "control"), "w").close()
            signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
            while True:
                time.sleep(0.1)
        for line in sys.stdin:
            cmd = line.strip()
            if cmd == "get_server_list":
                print("")
            elif cmd.startswith("get_default_active_thread_percentage"):
                print("100.0")
            elif cmd == "quit" and os.path.exists(pidfile):
                os.kill(int(open(pidfile).read()), signal.SIGTERM)
    """))
    path.chmod(0o755)
    return str(path)


def test_a_daemon_left_by_an_experiment_is_quit_and_killed_by_pid(tmp_path):
    control = _fake_mps_control(tmp_path)
    work = tmp_path / "work"
    daemon = tt_mps.MpsDaemon(work, control, private_shm=False)
    started = daemon.start(timeout_s=10)
    assert started["ok"] and started["pids"]
    assert daemon.command("get_default_active_thread_percentage")["out"] == "100.0"
    cleaned = tt_mps.cleanup_registered(work)  # what the orchestrator does after every experiment
    assert [c["pids_before"] for c in cleaned] == [started["pids"]]
    assert not tt_mps.daemon_pids(daemon.pipe)
    assert not os.path.exists(daemon.base) and not list((work / "mps").glob("*.json"))


def test_an_experiment_that_overruns_is_ended_with_its_process_group(tmp_path):
    script = tmp_path / "hang.py"
    marker = tmp_path / "child.pid"
    script.write_text(textwrap.dedent(f"""
        import subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        open({str(marker)!r}, "w").write(str(child.pid))
        time.sleep(120)
    """))
    work, out = tmp_path / "work", tmp_path / "out"
    work.mkdir()
    out.mkdir()
    rec = tt_common.Recorder(out / "results.jsonl", "run")
    t0 = time.monotonic()
    with open(out / "run.log", "a") as log:
        row = run_experiments.run_one("EX", str(script), [], 3.0, work, out, log, True, rec)
    assert row["status"] == "timeout"
    assert time.monotonic() - t0 < 20
    child = int(marker.read_text())
    time.sleep(0.3)
    try:  # gone, or a zombie waiting for whoever adopted it
        with open(f"/proc/{child}/stat") as f:
            assert f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        pass
    lines = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert lines[-1]["kind"] == "status" and lines[-1]["experiment"] == "EX"


def test_a_crashing_experiment_leaves_its_traceback_in_the_results(tmp_path):
    script = tmp_path / "crash.py"
    script.write_text(textwrap.dedent("""
        from tt_common import guarded

        def main():
            raise KeyError("a bug, not a GPU result")

        guarded(main, "EX")
    """))
    work, out = tmp_path / "work", tmp_path / "out"
    work.mkdir()
    out.mkdir()
    rec = tt_common.Recorder(out / "results.jsonl", "run")
    with open(out / "run.log", "a") as log:
        row = run_experiments.run_one("EX", str(script), [], 30.0, work, out, log, True, rec)
    assert row["status"] == "exit 1"
    crash = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()][0]
    assert crash["exp"] == "EX" and crash["kind"] == "crash" and "a bug, not a GPU result" in crash["error"]


def test_a_dry_run_exercises_every_process_and_file_path(tmp_path):
    """E1 (with a stand-in MPS control program), E2 and E6 through the orchestrator, no GPU: clients in the
    project's sandbox where this host has one, descriptors passed, records written, daemons quit."""
    control = _fake_mps_control(tmp_path)
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TT), str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    p = subprocess.run([sys.executable, str(TT / "run_experiments.py"), str(out), "--dry-run", "--skip-build",
                        "--only", "E1,E2,E6", "--mps-control", control, "--budget-s", "150",
                        "--exp-args", "E2=--calls 60 --batch 20"],
                       capture_output=True, text=True, timeout=240, env=env)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    files = sorted(x.name for x in out.iterdir())
    assert files == ["results.jsonl", "run.log", "summary.json", "summary.txt"]
    report = json.loads((out / "summary.json").read_text())
    assert {k: v["status"] for k, v in report.items()} == {"E1": "ok", "E2": "ok", "E6": "ok"}, p.stdout[-3000:]
    e1 = report["E1"]["summary"]
    assert e1["mps_start"] is True and e1["mps_mode"] is not None
    assert e1["mps_functional"]["vmm"] is True and e1["no_mps"]["vmm"] is True  # a descriptor crossed processes
    e2 = report["E2"]["summary"]
    assert e2["mps"]["empty"]["n"] == 60 and e2["no_mps"]["100us"]["n"] == 60
    rows = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert all({"exp", "kind", "t_s"} <= set(r) for r in rows)
    starts = [r for r in rows if r["kind"] == "mps_start"]
    quits = [r for r in rows if r["kind"] == "mps_quit"]
    assert len(starts) == len(quits) >= 2
    for r in starts:
        assert not tt_mps.daemon_pids(r["pipe"])
    assert "E1 [ok" in p.stdout and "E2 [ok" in p.stdout


@pytest.mark.gpu
def test_the_rig_measures_finite_latencies_on_a_gpu(tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TT), str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    p = subprocess.run([sys.executable, str(TT / "run_experiments.py"), str(out), "--only", "E2", "--budget-s", "120",
                        "--exp-args", "E2=--calls 100"], capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stdout[-3000:]
    e2 = json.loads((out / "summary.json").read_text())["E2"]["summary"]
    assert e2["no_mps"]["20us"]["c_med"] is not None


def teardown_module(module):
    # nothing of a test's clients may outlive it (they die with their parents; make sure)
    for entry in os.listdir("/proc"):
        if entry.isdigit() and "tt_client.py" in tt_common.cmdline(int(entry)) and "pt-" in tt_common.cmdline(int(entry)):
            try:
                os.kill(int(entry), signal.SIGKILL)
            except OSError:
                pass
