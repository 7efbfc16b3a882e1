"""E5: the kernel-only form. CUDA C++ source and a launch spec (JSON data: buffers, kernels, grids as
expressions of the task's dimensions, scalar arguments) go to a trusted launcher that runs no candidate host
code: the source built by NVRTC in a child process (and by nvcc -cubin), the cubin loaded with
cuModuleLoadData, each step launched with cuLaunchKernel, each call timed by events on the launcher's
stream after a 256 MiB flush (and back to back without one), the outputs checked against numpy. The same
cubin and specs in a PyTorch process, timed by `triton.testing.do_bench` and by torch events, are the
in-process references. Pass: launcher medians within 1 % of both; `cuobjdump` flags the planted
device-side launch and the planted %globaltimer read, and nothing in the honest cubins. Not run: the
launcher's calls timed through the helper's gate (E2's rig measures that gate).
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from tt_common import (
    HERE,
    ROOT,
    Deadline,
    Recorder,
    cubin,
    describe,
    describe_error,
    experiment_args,
    guarded,
    quantile,
    start_client,
)
from tt_common import tool as find_tool

FLUSH_BYTES = 256 << 20
CDP_SYMBOLS = ("cudaCDP", "cudaLaunchDevice", "cudaGetParameterBuffer", "cudaCGGetIntrinsicHandle",
               "cudaDeviceSynchronize", "cudaStreamCreateWithFlags")
TIMER_SASS = {"globaltimer": re.compile(r"SR_GLOBALTIMER"), "clock": re.compile(r"SR_CLOCK(LO|HI)")}


def specs(path: str, sm: int, small: bool = False) -> list[dict[str, Any]]:
    """The launch specs: what a kernel-only candidate hands in besides its source (`small`: a dry run's)."""
    out = []
    reduces = (("reduce_16M", 1 << 24), ("reduce_64M", 1 << 26)) if not small else (("reduce_64K", 1 << 16),)
    gemms = (("gemm_512", 512), ("gemm_1024", 1024)) if not small else (("gemm_64", 64),)
    for name, n in reduces:
        out.append({"name": name, "cubin": path, "dims": {"N": n, "SM": sm}, "seed": 1,
                    "buffers": {"x": {"count": "N", "init": "random"}, "partial": {"count": "SM * 8"}},
                    "steps": [{"kernel": "reduce_partial", "grid": ["SM * 8", 1, 1], "block": [256, 1, 1],
                               "args": [{"buf": "x"}, {"buf": "partial"}, {"type": "u64", "value": "N"}]}],
                    "check": {"kind": "sum", "of": "x", "into": "partial"}})
    for name, n in gemms:
        out.append({"name": name, "cubin": path, "dims": {"M": n, "N": n, "K": n}, "seed": 2,
                    "buffers": {"A": {"count": "M * K", "init": "random"}, "B": {"count": "K * N", "init": "random"},
                                "C": {"count": "M * N"}},
                    "steps": [{"kernel": "sgemm_tiled", "grid": ["ceil(N / 32)", "ceil(M / 32)", 1], "block": [32, 32, 1],
                               "args": [{"buf": "A"}, {"buf": "B"}, {"buf": "C"}, {"type": "i32", "value": "M"},
                                        {"type": "i32", "value": "N"}, {"type": "i32", "value": "K"}]}],
                    "check": {"kind": "gemm", "A": "A", "B": "B", "C": "C", "M": "M", "N": "N", "K": "K"}})
    return out


def scan(path: str) -> dict[str, Any]:
    """What the static scan of a cubin finds: device-side launches and timer reads."""
    flags: set[str] = set()
    tool = find_tool("cuobjdump")
    if tool:
        env = {**os.environ, "PATH": f"{os.path.dirname(tool)}:{os.environ.get('PATH', '')}"}  # -sass runs nvdisasm
        p_sass = subprocess.run([tool, "-sass", path], capture_output=True, text=True, timeout=60, env=env)
        elf = subprocess.run([tool, "-elf", path], capture_output=True, text=True, timeout=60, env=env).stdout
        sass = p_sass.stdout
        if any(s in sass or s in elf for s in CDP_SYMBOLS):
            flags.add("device_launch")
        for flag, pattern in TIMER_SASS.items():
            if pattern.search(sass):
                flags.add(flag)
        out = {"tool": tool, "flags": sorted(flags), "sass_lines": sass.count("\n")}
        if p_sass.returncode != 0 or "fatal" in p_sass.stderr:
            out["sass_error"] = p_sass.stderr.strip()[-300:]  # e.g. nvdisasm missing: timer reads unseen
        return out
    disasm = find_tool("nvdisasm")
    raw = Path(path).read_bytes()
    if any(s.encode() in raw for s in CDP_SYMBOLS):
        flags.add("device_launch")
    if disasm:
        sass = subprocess.run([disasm, path], capture_output=True, text=True, timeout=60).stdout
        for flag, pattern in TIMER_SASS.items():
            if pattern.search(sass):
                flags.add(flag)
        return {"tool": disasm + " + symbol strings", "flags": sorted(flags)}
    return {"tool": "symbol strings only (no cuobjdump or nvdisasm: timer reads not scanned)", "flags": sorted(flags)}


def nvrtc_build(work: str, timeout_s: float) -> dict[str, Any]:
    """NVRTC in a child process (in the project's sandbox where there is one: a build child needs no GPU)."""
    argv = [sys.executable, str(Path(work) / "py" / "tt_nvrtc.py"), str(Path(work) / "build" / "e5_kernels.cu")]
    env = {**os.environ, "PYTHONPATH": f"{HERE}{os.pathsep}{ROOT / 'src'}"}
    cmd = argv
    try:
        from cudal1.eval.sandbox import SandboxSpec, detect_sandbox, wrap_command

        info = detect_sandbox()
        if info.level != "none":
            cmd = wrap_command(argv, SandboxSpec(gpu=False, binds=[(work, work)]), info)
            env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    except ImportError:
        pass
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
        out = json.loads(p.stdout.strip().splitlines()[-1]) if p.stdout.strip() else {"ok": False, "error": p.stderr[-800:]}
    except (subprocess.TimeoutExpired, ValueError, IndexError) as exc:
        return {"ok": False, "error": describe_error(exc)[-500:]}
    out["sandboxed"] = cmd is not argv
    data = out.pop("cubin_b64", None)
    if data:
        path = Path(work) / "build" / "e5_nvrtc.cubin"
        path.write_bytes(base64.b64decode(data))
        os.chmod(path, 0o644)
        out["cubin"] = str(path)
    return out


def main() -> None:
    def extra(p: Any) -> None:
        p.add_argument("--reps", type=int, default=200)

    args = experiment_args(__doc__.splitlines()[0], extra)
    rec, dl = Recorder(args.out, "E5"), Deadline(args.timeout)
    summary: dict[str, Any] = {}
    shutil.copy2(HERE / "e5_kernels.cu", Path(args.work) / "build" / "e5_kernels.cu")
    shutil.copy2(HERE / "tt_nvrtc.py", Path(args.work) / "py" / "tt_nvrtc.py")
    os.chmod(Path(args.work) / "build" / "e5_kernels.cu", 0o644)
    os.chmod(Path(args.work) / "py" / "tt_nvrtc.py", 0o644)
    built = nvrtc_build(args.work, min(60.0, max(5.0, dl.left() / 4)))
    rec.write("nvrtc", **built)
    summary["nvrtc"] = {"ok": built.get("ok"), "ms": built.get("ms"), "version": built.get("version"),
                        "sandboxed": built.get("sandboxed")}
    # static scan
    scans = {}
    for name in ("e5", "e5_nvrtc", "planted_cdp", "planted_timer", "kernels"):
        path = cubin(args.work, name)
        if os.path.exists(path):
            scans[name] = scan(path)
            rec.write("scan", cubin=name, **scans[name])
    summary["scan"] = {k: v["flags"] for k, v in scans.items()}
    if scans:
        summary["scan_pass"] = ("device_launch" in scans.get("planted_cdp", {}).get("flags", [])
                                and "globaltimer" in scans.get("planted_timer", {}).get("flags", [])
                                and not scans.get("e5", {}).get("flags", ["?"]))
    # the trusted launcher
    launcher = None
    launched: dict[str, float] = {}
    try:
        launcher = start_client("L", args.work, mode="plain", dry=args.dry)
        sm = int(launcher.info.get("sm_count", 1))
        cdp = cubin(args.work, "planted_cdp")
        if os.path.exists(cdp):
            loaded = launcher.call("e5_load", path=cdp, function="parent")
            rec.write("load_planted_cdp", **{k: v for k, v in loaded.items() if k not in ("ok", "id")})
            summary["planted_cdp_loads"] = [loaded.get("loaded"), loaded.get("function")]
        plan = specs(cubin(args.work, "e5"), sm, args.dry)
        if built.get("cubin"):
            for spec in specs(built["cubin"], sm, args.dry)[::2]:
                plan.append({**spec, "name": spec["name"] + "_nvrtc"})
        for spec in plan:
            if not dl.enough(8):
                rec.write("skipped", spec=spec["name"], reason="no time left")
                continue
            r = launcher.call("e5_run", timeout_s=max(10.0, min(90.0, dl.left())), spec=spec,
                              reps=args.reps if not args.dry else 5, flush_bytes=FLUSH_BYTES if not args.dry else 1 << 20)
            launched[spec["name"]] = quantile(r["ms"], 0.5)
            rec.write("launcher", spec=spec["name"], ms=describe(r["ms"], 5), queued_ms_per_call=r["queued_ms_per_call"],
                      check=r["check"], times_ms=[round(x, 5) for x in r["ms"]])
        with open(Path(args.work) / "e5_specs.json", "w") as f:
            json.dump(plan, f)
    except Exception as exc:  # noqa: BLE001 - recorded, the rest goes on
        rec.write("error", where="launcher", error=describe_error(exc)[-1500:])
        summary["launcher_error"] = describe_error(exc)[-300:]
    finally:
        if launcher is not None:
            launcher.close()
    summary["launcher_ms"] = {k: round(v, 5) for k, v in launched.items()}
    # the in-process references
    if args.dry:
        rec.write("skipped", part="torch", reason="dry run")
    elif launched and dl.enough(15):
        env = {**os.environ, "PYTHONPATH": f"{HERE}{os.pathsep}{ROOT / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        try:
            p = subprocess.run([sys.executable, str(HERE / "tt_torchbench.py"), str(Path(args.work) / "e5_specs.json"),
                                str(args.reps)], capture_output=True, text=True, env=env, timeout=max(10.0, dl.left() - 3))
            lines = [json.loads(x) for x in p.stdout.splitlines() if x.startswith("{")]
            if p.returncode != 0:
                rec.write("error", where="torch", rc=p.returncode, stderr=p.stderr[-1500:])
        except subprocess.TimeoutExpired as exc:
            lines = [json.loads(x) for x in (exc.stdout or b"").decode(errors="replace").splitlines() if x.startswith("{")]
            rec.write("error", where="torch", error="timeout")
        ratios = {}
        for row in lines:
            name = row["name"]
            ev = quantile(row["events_ms"], 0.5)
            rec.write("torch", spec=name, do_bench_ms=row["do_bench_ms"], events_ms=describe(row["events_ms"], 5),
                      wall_s=row.get("wall_s"), torch=row.get("torch"), triton=row.get("triton"))
            if name in launched and row["do_bench_ms"]:
                ratios[name] = {"vs_do_bench": round(launched[name] / row["do_bench_ms"], 4),
                                "vs_torch_events": round(launched[name] / ev, 4)}
        summary["ratios"] = ratios
        if ratios:
            summary["pass_1pct"] = all(abs(v["vs_do_bench"] - 1) <= 0.01 and abs(v["vs_torch_events"] - 1) <= 0.01
                                       for v in ratios.values())
    rec.write("summary", **summary)


if __name__ == "__main__":
    guarded(main, "E5")
