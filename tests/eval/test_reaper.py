"""Nothing is left behind by a killed CLI (cudal1.eval.reaper): SIGKILL of a running `cudal1 eval` ends its
runners and their sandboxes, frozen ones included, and removes their folders and control groups within
seconds, without waiting for the next evaluation on the machine."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cudal1.eval.cgroups import PREFIX, _layout
from cudal1.eval.runner_process import FOLDER_PREFIX, process_tree
from cudal1.eval.sandbox import detect_sandbox

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def _folders(root: Path, pid: int) -> list[Path]:
    out = []
    for folder in root.glob(FOLDER_PREFIX + "*"):
        try:
            if int((folder / "owner").read_text()) == pid:
                out.append(folder)
        except (OSError, ValueError):
            continue
    return out


def _running(pid: int) -> bool:
    """Alive and not a zombie (a zombie holds nothing but its process table entry)."""
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _groups(pid: int) -> list[Path]:
    return [g for parent in _layout().values() for g in parent.glob(f"{PREFIX}{pid}-*")]


@pytest.mark.parametrize("sandbox", ["auto", "none"])
def test_a_cli_killed_with_sigkill_leaves_no_runner_sandbox_folder_or_group(tmp_path, sandbox):
    if sandbox == "auto" and detect_sandbox().level == "none":
        pytest.skip("no sandbox on this host")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp)}
    argv = [sys.executable, "-m", "cudal1.cli.main", "eval", "--ref", str(FIXTURES / "tasks" / "tiny_scale_add.py"),
            "--candidate", str(FIXTURES / "eval" / "hanging.py"), "--device", "cpu", "--no-store", "--trials", "2",
            "--buckets", "2", "--timeout-s", "300", "--sandbox", sandbox]
    cli = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 240  # a loaded 2-core machine takes a while to start both runners
        tree: list[int] = []
        while time.monotonic() < deadline and cli.poll() is None:
            tree = process_tree(cli.pid)
            runners = [p for p in tree if b"cudal1.eval.inside.runner" in _cmdline(p)]
            if len(_folders(tmp, cli.pid)) >= 2 and len(runners) >= 2:
                break
            time.sleep(0.2)
        assert cli.poll() is None and len(_folders(tmp, cli.pid)) >= 2, "the runners never started"
        time.sleep(3.0)  # the candidate hangs in its forward; the other runner is frozen meanwhile
        tree = process_tree(cli.pid)
        assert any(b"cudal1.eval.reaper" in _cmdline(p) for p in tree)
    finally:
        cli.kill()  # SIGKILL: no handler, no atexit, nothing of the CLI runs
        cli.wait(30)
    deadline = time.monotonic() + 30  # "within a few seconds", with a loaded machine's margin
    while time.monotonic() < deadline and (any(_running(p) for p in tree) or _folders(tmp, cli.pid)
                                           or _groups(cli.pid)):
        time.sleep(0.1)
    left = [(p, _cmdline(p)[:80]) for p in tree if _running(p)]
    assert left == [] and _folders(tmp, cli.pid) == [] and _groups(cli.pid) == []


def _cmdline(pid: int) -> bytes:
    try:
        return open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ")
    except OSError:
        return b""
