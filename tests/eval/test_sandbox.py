"""The OS sandbox of every runner (cudal1.eval.sandbox), seen from inside: what a process there can see and
do. Runs the probes of tests/helpers/sandbox_probe.py through `run_isolated`, as the evaluator runs builds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cudal1.eval.isolated import Limits, run_isolated
from cudal1.eval.sandbox import SANDBOX_UID, SandboxSpec, detect_sandbox

PROBE = "tests.helpers.sandbox_probe"
needs_sandbox = pytest.mark.skipif(detect_sandbox().level == "none", reason="no sandbox on this host")


def test_this_host_has_a_full_sandbox():
    """The development and CI machines have bubblewrap (installed by .ci/run) and namespaces."""
    info = detect_sandbox()
    assert info.level == "full", info


@needs_sandbox
def test_a_sandboxed_process_sees_no_other_process_no_network_and_writes_nowhere(listener, tmp_path, monkeypatch):
    port, seen = listener
    monkeypatch.setenv("CUDAL1_SERVER_TOKEN", "s3cret-token")  # a secret of the parent's environment
    store = tmp_path / "results.sqlite"
    store.write_text("rows")
    home_file = os.path.expanduser("~/.cudal1-planted")
    site = os.path.dirname(os.__file__)
    payload = {"parent_pid": os.getpid(), "port": port,
               "write_to": [str(store), home_file, os.path.join(site, "evil.pth"), "/tmp/x", "/dev/shm/y"],
               "read": [str(store)]}
    spec = SandboxSpec(hidden_files=[str(store)])
    outcome = run_isolated(f"{PROBE}:look_around", payload, limits=Limits(timeout_s=120), spec=spec)
    assert outcome.ok, outcome.describe_failure()
    seen_inside = outcome.value
    assert "parent_environ" not in seen_inside, "the parent's environment is readable"
    assert "CUDAL1_SERVER_TOKEN" not in seen_inside["env"]
    assert os.getpid() not in seen_inside["pids"] and len(seen_inside["pids"]) <= 4
    assert seen_inside["connected"] is False and seen == []
    writes = seen_inside["writes"]
    assert writes[str(store)] != "written" and store.read_text() == "rows"
    assert writes[home_file] != "written" and not os.path.exists(home_file)
    assert writes[os.path.join(site, "evil.pth")] != "written" and not os.path.exists(os.path.join(site, "evil.pth"))
    assert writes["/tmp/x"] == "written" and writes["/dev/shm/y"] == "written"  # its own private tmpfs
    assert not os.path.exists("/dev/shm/y")
    assert seen_inside["reads"][str(store)] in ("", "PermissionError"), "the store's content is readable"
    if os.geteuid() == 0:
        assert seen_inside["uid"] == SANDBOX_UID


@needs_sandbox
def test_a_detached_grandchild_ends_with_the_sandbox():
    marker = f"cudal1-daemon-{os.getpid()}-{time.monotonic_ns()}"
    outcome = run_isolated(f"{PROBE}:leave_a_daemon", {"marker": marker, "seconds": 60},
                           limits=Limits(timeout_s=120))
    assert outcome.ok, outcome.describe_failure()
    time.sleep(0.5)
    alive = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    alive.append(pid)
        except OSError:
            continue
    assert alive == [], f"the daemon outlived its sandbox: {alive}"


def test_a_memory_hog_is_stopped_at_its_limit():
    outcome = run_isolated(f"{PROBE}:hog_memory", {"gib": 3}, limits=Limits(timeout_s=120, memory_bytes=1 * 2**30))
    assert not outcome.ok and outcome.memory_exceeded, outcome


@needs_sandbox
def test_shared_memory_inside_is_private_and_bounded():
    spec = SandboxSpec(tmp_bytes=64 * 2**20)
    outcome = run_isolated(f"{PROBE}:fill_shm", {"mib": 200}, limits=Limits(timeout_s=120), spec=spec)
    assert outcome.ok, outcome.describe_failure()
    assert outcome.value["written_mib"] <= 64 and outcome.value.get("error") == "OSError"
    assert not os.path.exists("/dev/shm/fill")


def test_a_runner_keeps_the_heap_it_freed_so_calls_do_not_fault_it_in_again():
    """Which runner's temporaries land at its heap's top depends on its history; glibc's default gave that top
    back and every call faulted its pages in again (an honest CPU twin measured 0.80x or 1.40x)."""
    outcome = run_isolated(f"{PROBE}:refault_heap", {"bytes": 100_000, "count": 200}, limits=Limits(timeout_s=60))
    assert outcome.ok, outcome.describe_failure()
    assert outcome.value["faults"] < outcome.value["pages"] // 20, outcome.value  # ~4900 faults when given back


def test_an_interpreter_under_tmp_or_home_stays_readable(monkeypatch, tmp_path):
    """A virtual environment under /tmp (as CI makes one) or a home folder must be bound back into the
    sandbox, whose /tmp and home are private."""
    from cudal1.eval import sandbox

    venv = tmp_path / "venv"
    venv.mkdir()
    monkeypatch.setattr(sandbox, "python_paths", lambda: [str(venv)])
    info = sandbox.SandboxInfo("full", "test", bwrap="/usr/bin/bwrap", drop_to_uid=SANDBOX_UID)
    cmd = sandbox.wrap_command(["python"], SandboxSpec(), info)
    i = cmd.index("--ro-bind", cmd.index("/tmp") if "/tmp" in cmd else 0)
    binds = [(cmd[j + 1], cmd[j + 2]) for j in range(len(cmd) - 2) if cmd[j] == "--ro-bind"]
    assert (str(venv), str(venv)) in binds
    assert cmd.index("--tmpfs", 0) < i  # bound after the private /tmp is mounted


def test_a_private_root_on_the_import_path_stays_private(monkeypatch):
    """A script run from /tmp or a home folder puts that folder on sys.path: binding it back would show the
    host's /tmp (other runners' files) read-only, and the runner could not start."""
    from cudal1.eval import sandbox

    home = os.path.expanduser("~")
    monkeypatch.setattr(sandbox, "python_paths", lambda: ["/tmp", home])
    monkeypatch.setattr(sandbox.sys, "path", ["/tmp", home, *sandbox.sys.path])
    info = sandbox.SandboxInfo("full", "test", bwrap="/usr/bin/bwrap", drop_to_uid=SANDBOX_UID)
    cmd = sandbox.wrap_command(["python"], SandboxSpec(), info)
    binds = [cmd[j + 1] for j in range(len(cmd) - 2) if cmd[j] in ("--ro-bind", "--bind")]
    assert "/tmp" not in binds and home not in binds
    pythonpath = cmd[cmd.index("PYTHONPATH") + 1].split(os.pathsep)
    assert "/tmp" not in pythonpath and home not in pythonpath


@needs_sandbox
def test_a_writable_folder_under_a_hidden_cache_in_tmp_is_reachable():
    """A cache root under /tmp (`CUDAL1_CACHE_DIR` there, as under pytest) is hidden; torch.compile's cache
    bound read-write beneath it must stay reachable by the sandbox's uid. Its parents were once made by
    bubblewrap, mode 0700 root: every compiled baseline failed on its first cache write."""
    import shutil
    import tempfile

    from cudal1.eval.sandbox import wrap_command

    root = Path(tempfile.mkdtemp(dir="/tmp", prefix="cudal1-test-"))
    try:
        cache, folder = root / "cache", root / "cache" / "inductor"
        folder.mkdir(parents=True)
        info = detect_sandbox()
        if info.drop_to_uid is not None:
            os.chown(folder, info.drop_to_uid, info.drop_to_uid)
        spec = SandboxSpec(writable=[str(folder)], hidden_dirs=[str(cache)])
        (cache / "secret").write_text("host")
        done = subprocess.run(wrap_command(["sh", "-c", f"touch {folder}/x && ! cat {cache}/secret"], spec, info),
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert (folder / "x").exists()
    finally:
        shutil.rmtree(root, ignore_errors=True)


@needs_sandbox
def test_a_runner_starts_from_a_script_in_tmp(tmp_path):
    """End to end: a runner started by a script whose folder is /tmp itself starts, and still cannot read
    the host's /tmp."""
    marker = tmp_path / "host-file"
    marker.write_text("host")
    script = Path("/tmp") / f"cudal1_probe_{os.getpid()}.py"
    script.write_text(
        "import json, sys\n"
        "from cudal1.eval.isolated import Limits, run_isolated\n"
        f"out = run_isolated('{PROBE}:look_around', {{'port': 9, 'read': [{str(marker)!r}]}}, "
        "limits=Limits(timeout_s=60))\n"
        "print(json.dumps({'ok': out.ok, 'why': out.describe_failure(), 'reads': (out.value or {}).get('reads')}))\n")
    try:
        done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                              cwd="/tmp", env={**os.environ, "PYTHONPATH": os.getcwd()})
    finally:
        script.unlink()
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["ok"], seen["why"]
    assert seen["reads"] == {str(marker): "FileNotFoundError"}
