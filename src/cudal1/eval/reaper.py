"""The reaper: a small process that cleans up after a process that starts runners (a CLI, a pool slot, the
server), the moment that process ends, however it ends (SIGKILL included).

Runners die with their parent (bubblewrap's `--die-with-parent`, PR_SET_PDEATHSIG for unsandboxed ones), but a
runner frozen by a cgroup v1 freezer (the other model was running) cannot act on its SIGKILL until it is
thawed, and the runners' folders and control groups stay: a CLI killed with SIGKILL left a frozen sandbox and
its folders until the next evaluation on the machine. The reaper blocks on a pipe whose only write end its
parent holds; at end of file (the parent's exit, by any means) it thaws and empties the control groups the
parent made, ends whatever still runs in the parent's runner folders (a bubblewrap killed while it set a
sandbox up leaves its idle init) and removes them, then exits.

`ensure_reaper()` starts one per process, before that process's first runner (a forked child gets its own).
What a run leaves is known here too: its folders (`FOLDER_PREFIX`, an `owner` file naming the parent) and the
processes whose command line names them (`reap_stale_folders`, also run once by every evaluating process for
parents that are gone, `evaluation.reap_once`).
The reaper runs in a session of its own: Ctrl-C in a terminal reaches the CLI, not its reaper.

    python -m cudal1.eval.reaper PARENT_PID PIPE_FD TMPDIR      # started by ensure_reaper, not by hand

Not covered: a reaper killed with its parent (`kill -9` of both); the next evaluation on the machine, or the
server's restart, removes what they left (`evaluation.reap_once`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

_lock = threading.Lock()
#: The process that started the reaper, the write end of its pipe, and the reaper (kept: a running child's
#: `Popen` that is garbage-collected warns).
_state: dict[str, Any] = {"pid": None, "write_fd": None, "process": None}


def ensure_reaper() -> None:
    """Start this process's reaper unless it runs already (idempotent, thread-safe; a forked child starts its
    own). Never raises: without a reaper, the next evaluation on the machine cleans up instead."""
    with _lock:
        if _state["pid"] == os.getpid():
            return
        try:
            read_fd, write_fd = os.pipe()  # both ends close on exec: only the reaper is handed the read end
        except OSError as exc:
            logger.warning("no reaper for this process's runners (%s): a killed run is cleaned by the next one", exc)
            return
        try:
            process = subprocess.Popen([sys.executable, "-m", "cudal1.eval.reaper", str(os.getpid()), str(read_fd),
                              tempfile.gettempdir()], pass_fds=(read_fd,), stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        except OSError as exc:
            os.close(write_fd)
            logger.warning("no reaper for this process's runners (%s): a killed run is cleaned by the next one", exc)
            return
        finally:
            os.close(read_fd)
        _state.update(pid=os.getpid(), write_fd=write_fd, process=process)


def _forget_in_child() -> None:
    """A forked child holds a copy of the pipe's write end, which would keep its parent's reaper waiting: it
    closes it, and starts a reaper of its own if it starts runners."""
    fd = _state["write_fd"]
    if fd is not None:
        try:
            os.close(fd)
        except OSError:
            pass
    _state.update(pid=None, write_fd=None, process=None)


os.register_at_fork(after_in_child=_forget_in_child)


#: Prefix of the parent-side folders of runners (stderr log, scratch); `reap_stale_folders` knows them by it.
FOLDER_PREFIX = "cudal1-run-"


#: How long a runner folder without a readable `owner` is taken for one being made (the owner is written just
#: after the folder): a concurrent reap must not remove another process's folder in between.
NO_OWNER_GRACE_S = 60.0


def _younger_than(folder: Path, seconds: float) -> bool:
    try:
        return time.time() - folder.stat().st_mtime < seconds
    except OSError:
        return False


def reap_stale_folders(owner_pid: int | None = None, root: str | os.PathLike | None = None) -> int:
    """Remove the runner folders of parents that are gone (a killed CLI or server), and end what still runs
    in them; returns how many folders. `owner_pid`: only that parent's, which the caller knows is gone (the
    reaper); `root`: where the folders are (default: this process's temporary folder)."""
    root = Path(root or tempfile.gettempdir())
    stale = []
    for folder in root.glob(FOLDER_PREFIX + "*"):
        try:
            owner = int((folder / "owner").read_text())
        except (OSError, ValueError):
            owner = -1
            if _younger_than(folder, NO_OWNER_GRACE_S):
                continue  # another process made it a moment ago and is writing its owner now
        if owner_pid is not None:
            if owner == owner_pid:
                stale.append(folder)
            continue
        if owner > 0 and owner != os.getpid():
            try:
                os.kill(owner, 0)
                continue  # its parent still runs
            except ProcessLookupError:
                pass
            except PermissionError:
                continue
        elif owner == os.getpid():
            continue
        stale.append(folder)
    _kill_processes_naming(stale)
    for folder in stale:
        shutil.rmtree(folder, ignore_errors=True)
        if folder.exists():  # a process that held a file in it was still dying: once more, after a moment
            time.sleep(0.2)
            shutil.rmtree(folder, ignore_errors=True)
    return len(stale)


def _kill_processes_naming(folders: list[Path]) -> None:
    """SIGKILL every process whose command line names one of `folders`. A parent killed while bubblewrap
    was still setting a sandbox up can leave bubblewrap's own init behind (its parent-death signal was not
    armed yet): it idles, holding the folder's mounts, until something ends it."""
    if not folders:
        return
    names = [str(f).encode() for f in folders]
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        if any(name in cmdline for name in names):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(entry), signal.SIGKILL)


def reap(parent_pid: int, tmpdir: str) -> int:
    """Thaw and empty the control groups `parent_pid` made, end what runs in its runner folders under `tmpdir`
    and remove them; returns how many groups and folders went."""
    from cudal1.eval.cgroups import reap_stale_groups

    groups = reap_stale_groups(owner_pid=parent_pid)  # first: a frozen runner dies only once thawed
    return groups + reap_stale_folders(owner_pid=parent_pid, root=tmpdir)


def main(argv: list[str]) -> int:
    parent_pid, read_fd, tmpdir = int(argv[0]), int(argv[1]), argv[2]
    # Imported now, while the parent runs: at its end the clean-up starts at once.
    import cudal1.eval.cgroups  # noqa: F401

    while True:
        try:
            if not os.read(read_fd, 4096):
                break  # every write end is closed: the parent has ended
        except InterruptedError:
            continue
        except OSError:
            break
    reap(parent_pid, tmpdir)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
