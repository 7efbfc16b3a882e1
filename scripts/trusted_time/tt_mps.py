"""A private MPS control daemon for one experiment: a user-space process, no GPU setting is touched.

`MpsDaemon.start` runs `nvidia-cuda-mps-control -d` with its own pipe and log folders under a fresh temp
folder, and (where `unshare` and a bind mount work) its own /dev/shm: a folder bound over /dev/shm in a
mount namespace of the daemon's own, which the server it spawns inherits and which the clients' sandboxes
bind at /dev/shm. Every daemon is registered under WORK/mps/ so that the orchestrator can quit it after an
experiment that timed out; `quit` sends `quit` and then kills, by pid, whatever of this daemon (control or
server, found by its pipe folder in its environment or as the control's child) is still alive.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

SEARCH_DIRS = ("/usr/bin", "/usr/local/nvidia/bin", "/usr/local/cuda/bin", "/usr/local/bin", "/usr/sbin", "/bin",
               "/opt/nvidia/bin")
CONTROL = "nvidia-cuda-mps-control"


def find_control() -> tuple[str | None, list[str]]:
    """The control program: on PATH or in the usual driver folders; (path or None, folders searched)."""
    searched = ["PATH"]
    found = shutil.which(CONTROL)
    if found:
        return found, searched
    for folder in SEARCH_DIRS:
        searched.append(folder)
        candidate = os.path.join(folder, CONTROL)
        if os.access(candidate, os.X_OK):
            return candidate, searched
    return None, searched


def _environ(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f.read()
    except OSError:
        return b""


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def _ppid(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return -1


def daemon_pids(pipe: str) -> list[int]:
    """Processes of the daemon that serves `pipe`: MPS programs with that pipe folder in their environment,
    and MPS programs whose parent is one of them."""
    marker = f"CUDA_MPS_PIPE_DIRECTORY={pipe}".encode()
    mps, found = [], set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        if not _comm(pid).startswith("nvidia-cuda-mps"):
            continue
        mps.append(pid)
        if marker in _environ(pid).split(b"\0"):
            found.add(pid)
    found.update(p for p in mps if _ppid(p) in found)
    return sorted(found)


class MpsDaemon:
    """One private control daemon (module docstring)."""

    def __init__(self, work: str | os.PathLike, control: str, private_shm: bool = True):
        self.control = control
        self.base = tempfile.mkdtemp(prefix="ttmps-", dir="/tmp")
        os.chmod(self.base, 0o755)
        self.pipe, self.log, self.shm = (os.path.join(self.base, d) for d in ("pipe", "log", "shm"))
        for d, mode in ((self.pipe, 0o777), (self.log, 0o777), (self.shm, 0o1777)):
            os.mkdir(d)
            os.chmod(d, mode)
        self.private_shm = private_shm
        self.shm_mode = "none"
        registry = Path(work) / "mps"
        registry.mkdir(parents=True, exist_ok=True)
        self.registration = registry / f"{os.path.basename(self.base)}.json"
        self.registration.write_text(json.dumps({"pipe": self.pipe, "control": control, "base": self.base}))

    def env(self) -> dict[str, str]:
        folder = os.path.dirname(self.control)
        env = {"PATH": f"{folder}:{os.environ.get('PATH', '/usr/bin:/bin')}", "CUDA_MPS_PIPE_DIRECTORY": self.pipe,
               "CUDA_MPS_LOG_DIRECTORY": self.log}
        for key in ("CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH"):
            if key in os.environ:
                env[key] = os.environ[key]
        return env

    @property
    def clients_shm(self) -> str:
        """The folder the clients bind at /dev/shm: the daemon's own, or the host's where that failed."""
        return self.shm if self.shm_mode == "private" else "/dev/shm"

    def start(self, timeout_s: float = 10.0) -> dict[str, Any]:
        attempts = []
        plans = []
        unshare = shutil.which("unshare")
        if self.private_shm and unshare and os.geteuid() == 0:
            script = f"mount --bind {self.shm} /dev/shm && exec {self.control} -d"
            plans.append(("private", [unshare, "-m", "--propagation", "private", "sh", "-c", script]))
        plans.append(("host", [self.control, "-d"]))
        for shm_mode, cmd in plans:
            t0 = time.monotonic()
            # output to a file, not a pipe: a daemon that kept a pipe open would hold us until the timeout
            out_path = os.path.join(self.base, f"start-{shm_mode}.out")
            try:
                with open(out_path, "w") as out:
                    p = subprocess.run(cmd, env=self.env(), stdout=out, stderr=subprocess.STDOUT, timeout=timeout_s,
                                       stdin=subprocess.DEVNULL)
                rc, err = p.returncode, Path(out_path).read_text(errors="replace")[-500:]
            except (OSError, subprocess.SubprocessError) as exc:
                rc, err = None, str(exc)
            up = self._wait_up(min(8.0, timeout_s))
            attempts.append({"shm": shm_mode, "rc": rc, "stderr": err, "up": up,
                             "s": round(time.monotonic() - t0, 3)})
            if up:
                self.shm_mode = shm_mode
                return {"ok": True, "shm": shm_mode, "attempts": attempts, "pids": daemon_pids(self.pipe),
                        "pipe": self.pipe}
            self.quit(timeout_s=3.0)
        return {"ok": False, "attempts": attempts, "logs": self.logs()}

    def _wait_up(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if daemon_pids(self.pipe) and os.path.exists(os.path.join(self.pipe, "control")):
                return True
            time.sleep(0.05)
        return False

    def command(self, text: str, timeout_s: float = 10.0) -> dict[str, Any]:
        """One control command as the trusted side sends it."""
        try:
            p = subprocess.run([self.control], input=text + "\n", env=self.env(), capture_output=True, text=True,
                               timeout=timeout_s)
            return {"rc": p.returncode, "out": p.stdout.strip()[-2000:], "err": p.stderr.strip()[-500:]}
        except subprocess.TimeoutExpired:
            return {"rc": None, "timeout": True}
        except OSError as exc:
            return {"rc": None, "error": str(exc)}

    def server_pids(self) -> list[int]:
        out = self.command("get_server_list", 5.0).get("out") or ""
        return [int(t) for t in out.split() if t.isdigit()]

    def client_pids(self, server: int) -> list[int]:
        out = self.command(f"get_client_list {server}", 5.0).get("out") or ""
        return [int(t) for t in out.split() if t.isdigit()]

    def logs(self, limit: int = 4000) -> dict[str, str]:
        out = {}
        for name in ("control.log", "server.log"):
            try:
                out[name] = Path(self.log, name).read_text(errors="replace")[-limit:]
            except OSError:
                pass
        return out

    def quit(self, timeout_s: float = 10.0) -> dict[str, Any]:
        return quit_daemon(self.pipe, self.control, timeout_s, self.env(), self.registration)


def quit_daemon(pipe: str, control: str, timeout_s: float = 10.0, env: dict[str, str] | None = None,
                registration: Path | None = None) -> dict[str, Any]:
    """`quit` through the pipe, then SIGKILL by pid for what of this daemon is left."""
    env = env or {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "CUDA_MPS_PIPE_DIRECTORY": pipe}
    before = daemon_pids(pipe)
    result: dict[str, Any] = {"pids_before": before}
    if before:
        try:
            subprocess.run([control], input="quit\n", env=env, capture_output=True, text=True, timeout=timeout_s)
        except (OSError, subprocess.SubprocessError) as exc:
            result["quit_error"] = str(exc)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and daemon_pids(pipe):
            time.sleep(0.1)
    left = daemon_pids(pipe)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    result["killed"] = left
    if registration is not None:
        try:
            registration.unlink()
        except OSError:
            pass
    base = os.path.dirname(pipe.rstrip("/"))
    if os.path.basename(base).startswith("ttmps-"):
        shutil.rmtree(base, ignore_errors=True)
    return result


def cleanup_registered(work: str | os.PathLike) -> list[dict[str, Any]]:
    """Quit every daemon an experiment registered and did not quit itself (it timed out or crashed)."""
    out = []
    for path in sorted((Path(work) / "mps").glob("*.json")):
        try:
            entry = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        out.append({"pipe": entry["pipe"], **quit_daemon(entry["pipe"], entry["control"], 10.0, registration=path)})
    return out
