"""What every trusted-time experiment shares: the JSON-lines recorder, statistics, the client processes
(started plain, as uid 65534, or in the project's sandbox) and the socket protocol to them.

An experiment's main process (root, no CUDA context of its own) starts *clients*: `tt_client.py` processes
that each own one CUDA context and obey JSON commands over an AF_UNIX SOCK_SEQPACKET socket, descriptors
(VMM allocations) riding along as SCM_RIGHTS. Clients run from a world-readable copy of their modules under
the work folder, so that uid 65534 can read them wherever the checkout lies.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
SANDBOX_UID = 65534
CLIENT_MODULES = ("tt_client.py", "tt_cuda.py")
#: What the clients import of cudal1, with every package face on the way (`cudal1.eval`'s imports its lazy lookup).
PROJECT_MODULES = ("cudal1/__init__.py", "cudal1/core/__init__.py", "cudal1/core/lazy.py", "cudal1/eval/__init__.py",
                   "cudal1/eval/shared/__init__.py", "cudal1/eval/shared/cuda_vmm.py")
MAX_MESSAGE = 1 << 20


# --------------------------------------------------------------------------- records


class Recorder:
    """Appends one JSON object per line to the run's results file, flushed at once (a killed experiment
    keeps what it wrote)."""

    def __init__(self, path: str | os.PathLike, exp: str):
        self.path, self.exp = Path(path), exp
        self.t0 = time.monotonic()

    def write(self, kind: str, **data: Any) -> dict[str, Any]:
        row = {"exp": self.exp, "kind": kind, "t_s": round(time.monotonic() - self.t0, 3), **data}
        line = json.dumps(row, default=_jsonable, allow_nan=False) + "\n"
        with open(self.path, "a") as f:
            f.write(line)
            f.flush()
        return row

    def note(self, text: str) -> None:
        print(f"[{self.exp} {time.monotonic() - self.t0:6.1f}s] {text}", flush=True)


def _jsonable(value: Any) -> Any:
    if isinstance(value, float):
        return None if not math.isfinite(value) else value
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, (set, tuple)):
        return list(value)
    return str(value)


def clean(value: Any) -> Any:
    """NaN and infinities to None, recursively (JSON has no NaN)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    return value


# --------------------------------------------------------------------------- statistics


def quantile(values: Sequence[float], q: float) -> float:
    xs = sorted(v for v in values if v is not None and math.isfinite(v))
    if not xs:
        return float("nan")
    pos = q * (len(xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def describe(values: Sequence[float], digits: int = 3) -> dict[str, Any]:
    """n, median, quartiles, IQR, 1st/99th percentile, min, max, mean of the finite values."""
    xs = [v for v in values if v is not None and math.isfinite(v)]
    if not xs:
        return {"n": 0}
    r = lambda v: round(v, digits)  # noqa: E731
    p25, p50, p75 = quantile(xs, 0.25), quantile(xs, 0.5), quantile(xs, 0.75)
    return {"n": len(xs), "median": r(p50), "p25": r(p25), "p75": r(p75), "iqr": r(p75 - p25),
            "p01": r(quantile(xs, 0.01)), "p99": r(quantile(xs, 0.99)), "min": r(min(xs)), "max": r(max(xs)),
            "mean": r(sum(xs) / len(xs))}


# --------------------------------------------------------------------------- experiment arguments


def experiment_args(description: str, extra: Any = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--out", required=True, help="results file (JSON lines, appended)")
    p.add_argument("--work", required=True, help="work folder (built cubins, client modules, state)")
    p.add_argument("--timeout", type=float, default=60.0, help="this experiment's budget (s)")
    p.add_argument("--dry", action="store_true", help="no GPU: clients use the host-memory stand-in")
    if extra is not None:
        extra(p)
    return p.parse_args()


def guarded(main: Any, exp: str) -> None:
    """Run an experiment's main; a crash (a bug, not a GPU result) leaves a `crash` line with its traceback."""
    try:
        main()
    except SystemExit:
        raise
    except BaseException as exc:
        argv = sys.argv
        if "--which" in argv[:-1]:
            exp = argv[argv.index("--which") + 1]
        if "--out" in argv[:-1]:
            Recorder(argv[argv.index("--out") + 1], exp).write("crash", error=describe_error(exc))
        raise


class Deadline:
    """The experiment's budget: parts ask how long is left and skip themselves when too little is."""

    def __init__(self, seconds: float, reserve: float = 5.0):
        self.end = time.monotonic() + seconds
        self.reserve = reserve

    def left(self) -> float:
        return self.end - time.monotonic() - self.reserve

    def enough(self, seconds: float) -> bool:
        return self.left() >= seconds


def read_state(work: str | os.PathLike) -> dict[str, Any]:
    path = Path(work) / "state.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def update_state(work: str | os.PathLike, **values: Any) -> None:
    state = read_state(work)
    state.update(values)
    path = Path(work) / "state.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=1, default=_jsonable))
    tmp.replace(path)


def cubin(work: str | os.PathLike, name: str) -> str:
    return str(Path(work) / "build" / f"{name}.cubin")


def tool(name: str) -> str | None:
    """A CUDA tool on PATH or in the usual toolkit folders."""
    found = shutil.which(name)
    if found:
        return found
    for folder in ("/usr/local/cuda/bin", *sorted(glob.glob("/usr/local/cuda-*/bin"), reverse=True)):
        if os.access(os.path.join(folder, name), os.X_OK):
            return os.path.join(folder, name)
    return None


def pass_descriptors(reply: dict[str, Any]) -> list[int]:
    """The descriptors a reply carried (the caller closes them once passed on)."""
    return list(reply.get("_fds", []))


def close_fds(fds: Sequence[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def gpu_snapshot() -> dict[str, Any]:
    """Clocks, temperature, power and memory as nvidia-smi reads them (a read-only query)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return {"nvidia_smi": None}
    fields = "name,driver_version,clocks.sm,clocks.mem,clocks.max.sm,temperature.gpu,power.draw,memory.used,compute_mode,pstate"
    try:
        out = subprocess.run([smi, f"--query-gpu={fields}", "--format=csv,noheader,nounits"], capture_output=True,
                             text=True, timeout=15).stdout.strip().splitlines()
    except (OSError, subprocess.SubprocessError) as exc:
        return {"nvidia_smi_error": str(exc)}
    if not out:
        return {"nvidia_smi": "no output"}
    return dict(zip(fields.split(","), [v.strip() for v in out[0].split(",")], strict=False))


# --------------------------------------------------------------------------- processes


def process_tree(root: int) -> list[int]:
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        try:
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except OSError:
            continue
    return out


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def prepare_client_modules(work: str | os.PathLike) -> Path:
    """Copy the client's modules (and the few project modules they import) into WORK/py, world-readable."""
    dest = Path(work) / "py"
    for name in CLIENT_MODULES:
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(HERE / name, dest / name)
    for rel in PROJECT_MODULES:
        target = dest / "src" / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / "src" / rel, target)
    for dirpath, _dirnames, filenames in os.walk(work):
        os.chmod(dirpath, 0o755)
        for name in filenames:
            path = os.path.join(dirpath, name)
            if not os.path.islink(path):
                os.chmod(path, 0o644 if not os.access(path, os.X_OK) else 0o755)
    return dest


class ClientError(RuntimeError):
    """A client answered with an error, died, or did not answer in time."""


def describe_error(exc: BaseException) -> str:
    """A failure as recorded: a client's own message, or any other exception with the end of its traceback."""
    if isinstance(exc, ClientError):
        return str(exc)
    import traceback

    return f"{type(exc).__name__}: {exc} | " + traceback.format_exc()[-1200:]


#: How a client process is started: the project's sandbox (bwrap, uid 65534, its namespaces), the same
#: without the PID namespace or without the PID and IPC namespaces, uid 65534 with no namespaces, or root.
MODES = ("sandbox", "sandbox_hostipc", "sandbox_hostpid", "uid", "plain")


class Client:
    """One client process (module docstring). `mps` = (pipe dir, shm dir) makes it an MPS client."""

    def __init__(self, name: str, work: str | os.PathLike, *, mode: str = "plain", dry: bool = False,
                 mps: tuple[str, str] | None = None, env: dict[str, str] | None = None, log: Any = None):
        if mode not in MODES:
            raise ValueError(f"unknown client mode {mode}")
        self.name, self.mode, self.work = name, mode, Path(work)
        py = self.work / "py"
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        parent.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, MAX_MESSAGE)
        self.sock = parent
        argv = [sys.executable, str(py / "tt_client.py"), str(child.fileno()), name] + (["--dry"] if dry else [])
        extra = {"PYTHONPATH": f"{py}{os.pathsep}{py / 'src'}", "PYTHONUNBUFFERED": "1",
                 "CUDA_SCALE_LAUNCH_QUEUES": "4x", "HOME": str(self.work), "TMPDIR": "/tmp"}
        for key in ("CUDA_VISIBLE_DEVICES", "NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS"):
            if key in os.environ:
                extra[key] = os.environ[key]
        if mps is not None:
            extra["CUDA_MPS_PIPE_DIRECTORY"] = mps[0]
        extra.update(env or {})
        self.mps = mps
        preexec = None
        if mode.startswith("sandbox"):
            from cudal1.eval.sandbox import SandboxSpec, detect_sandbox, wrap_command

            info = detect_sandbox()
            if info.level == "none":
                raise ClientError(f"no sandbox on this host: {info.mechanism}")
            # writable folders get their parents made readable (a bind alone would make them 0700)
            writable = [str(self.work)] + ([mps[0]] if mps is not None else [])
            binds = [(mps[1], "/dev/shm")] if mps is not None else []
            spec = SandboxSpec(gpu=True, writable=writable, binds=binds, env=extra)
            cmd = wrap_command(argv, spec, info)
            drop = {"sandbox_hostipc": {"--unshare-ipc"}, "sandbox_hostpid": {"--unshare-ipc", "--unshare-pid"}}
            cmd = [a for a in cmd if a not in drop.get(mode, set())]
            env_proc = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        else:
            from cudal1.eval.sandbox import sandbox_environment

            env_proc = sandbox_environment(extra)
            env_proc["TMPDIR"] = str(self.work)
            if mode == "uid":
                setpriv = shutil.which("setpriv") or "setpriv"
                cmd = [setpriv, f"--reuid={SANDBOX_UID}", f"--regid={SANDBOX_UID}", "--clear-groups",
                       "--inh-caps=-all", "--", *argv]
            else:
                cmd = argv
            preexec = _die_with_parent
        self.cmd = cmd
        out = log if log is not None else sys.stderr
        try:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                         pass_fds=(child.fileno(),), env=env_proc, cwd=str(self.work),
                                         start_new_session=True, preexec_fn=preexec)
        finally:
            child.close()
        self._host_pid: int | None = None
        self.info: dict[str, Any] = {}
        self._next_id = 0
        self._expect = 0

    # ------------------------------------------------------------------ identity

    def host_pid(self, timeout_s: float = 5.0) -> int | None:
        """The client's pid as this process sees it (inside a sandbox it has another)."""
        if self._host_pid is not None:
            return self._host_pid
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for pid in process_tree(self.proc.pid):
                if "tt_client.py" in cmdline(pid) and "bwrap" not in cmdline(pid).split(" ")[0]:
                    self._host_pid = pid
                    return pid
            time.sleep(0.02)
        return None

    def alive(self) -> bool:
        return self.proc.poll() is None

    # ------------------------------------------------------------------ messages

    def send(self, op: str, fds: Sequence[int] = (), **kw: Any) -> int:
        """Send a request; its id (replies to requests that timed out earlier are skipped by `recv`)."""
        self._next_id += 1
        self._expect = self._next_id
        data = json.dumps({"op": op, "id": self._next_id, **kw}, default=_jsonable).encode()
        if len(data) > MAX_MESSAGE:
            raise ClientError(f"{self.name}: request {op} too large")
        try:
            if fds:
                socket.send_fds(self.sock, [data], list(fds))
            else:
                self.sock.send(data)
        except OSError as exc:
            raise ClientError(f"{self.name}: cannot send {op}: {exc}") from None
        return self._next_id

    def recv(self, timeout_s: float, op: str = "?") -> tuple[dict[str, Any], list[int]]:
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ClientError(f"{self.name}: no answer to {op} within {timeout_s:.1f} s")
            self.sock.settimeout(min(left, 0.5))
            try:
                data, fds, _flags, _addr = socket.recv_fds(self.sock, MAX_MESSAGE, 8)
            except TimeoutError:
                if not self.alive():
                    raise ClientError(f"{self.name}: exited with {self.proc.returncode} during {op}") from None
                continue
            except OSError as exc:
                raise ClientError(f"{self.name}: socket failed during {op}: {exc}") from None
            if not data:
                self.proc.poll()
                raise ClientError(f"{self.name}: exited with {self.proc.returncode} during {op}")
            reply = json.loads(data)
            if reply.get("id") != self._expect:  # the late answer to a request given up on
                for fd in fds:
                    os.close(fd)
                continue
            if not reply.get("ok", False):
                for fd in fds:
                    os.close(fd)
                raise ClientError(f"{self.name}: {op} failed: {reply.get('error')}")
            return reply, list(fds)

    def call(self, op: str, timeout_s: float = 60.0, fds: Sequence[int] = (), **kw: Any) -> dict[str, Any]:
        self.send(op, fds, **kw)
        reply, got = self.recv(timeout_s, op)
        reply.pop("ok", None)
        reply.pop("id", None)
        if got:
            reply["_fds"] = got
        return reply

    # ------------------------------------------------------------------ end

    def close(self, timeout_s: float = 3.0) -> int | None:
        """Ask it to exit, then end its process group (its sandbox dies with it)."""
        if self.alive():
            try:
                self.send("exit")
            except ClientError:
                pass
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                pass
        if self.alive():
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except OSError:
                pass
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        self.sock.close()
        return self.proc.returncode

    def kill(self) -> None:
        if self.alive():
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except OSError:
                pass
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass


def _die_with_parent() -> None:
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def start_client(name: str, work: str, *, mode: str, dry: bool, mps: tuple[str, str] | None = None,
                 cubins: Sequence[str] = ("kernels",), timeout_s: float = 60.0,
                 env: dict[str, str] | None = None) -> Client:
    """A client that has created its context and loaded the named cubins (its `info` filled)."""
    client = Client(name, work, mode=mode, dry=dry, mps=mps, env=env)
    try:
        client.info = client.call("init", timeout_s, cubins={c: cubin(work, c) for c in cubins})
    except ClientError:
        client.close()
        raise
    client.info["host_pid"] = client.host_pid()
    return client


def close_all(clients: Sequence[Client | None]) -> None:
    for c in clients:
        if c is not None:
            try:
                c.close()
            except Exception:  # noqa: BLE001 - cleanup
                pass
