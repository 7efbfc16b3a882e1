"""Run one function in a fresh, limited child process and bring back its JSON result.

Every piece of untrusted code (a candidate's import, build, forward) runs through `run_isolated`. The
child is a new interpreter (`python -m cudal1.eval._child`), never a fork of a process that initialised
CUDA, started in its own session so that the whole process group can be killed.

Covered:
- wall-clock limit (`timeout_s`): the process group is killed, the outcome says `timed_out`;
- host memory limit (`memory_bytes`): RSS of the process group is polled and the group killed when it
  exceeds the limit (RLIMIT_AS is unusable with CUDA, which reserves terabytes of address space);
  RLIMIT_DATA is also set when `hard_data_limit` is on (CPU-only work);
- crashes: a signal (segfault in C++, abort on an illegal memory access) or an early `os._exit`
  leave no signed result; the outcome says how the process ended;
- scrubbed environment (only what CUDA, compilers and Python need), a private temporary working
  directory and HOME, no core dumps, stdin closed after the handshake;
- forged results: the child reads a random key from stdin before running anything untrusted and signs
  its result with HMAC-SHA256; an unsigned or wrongly signed result file is rejected.

Not covered (documented limits): the candidate runs in the same process as the worker harness, so code
that walks the interpreter's memory (gc, frames, ctypes) could in principle subvert the in-process
checks; the static analysis rejects those tools and the runtime guards check the identity of timing
functions, but this is defence in depth, not a sandbox. No network or filesystem isolation beyond the
working directory, and no separate user: a grandchild that calls `setsid` escapes the process-group
kill and the memory accounting, and a child could signal other processes of the same user. Run the
evaluator in a container (or as a dedicated user) for hostile workloads.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

# Rationale: the variables a CUDA/compiler/Python process needs; everything else (tokens, proxies,
# the caller's PYTHON* settings) stays out of the child.
PASSTHROUGH_ENV = (
    "PATH", "LANG", "LC_ALL", "TZ", "TMPDIR", "LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_PATH",
    "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "TORCH_CUDA_ARCH_LIST", "TORCH_EXTENSIONS_DIR",
    "CUDAL1_CACHE_DIR", "CC", "CXX", "NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST",
    "NVSHMEM_DISABLE_NVLS", "OMP_NUM_THREADS", "MAX_JOBS",
)

MEMORY_POLL_S = 0.05


@dataclass(frozen=True)
class Limits:
    """Resource limits of one isolated run."""

    timeout_s: float = field(default=300.0, metadata={"help": "Wall-clock limit of the child process."})
    memory_bytes: int | None = field(
        default=32 * 2**30, metadata={"help": "Host RSS limit of the child's process group (None: none)."})
    hard_data_limit: bool = field(
        default=False, metadata={"help": "Also set RLIMIT_DATA to memory_bytes (CPU-only work)."})


@dataclass(frozen=True)
class IsolatedOutcome:
    """How the child ended and what it returned."""

    value: dict[str, Any] | None  # the entry function's return value, None when it did not report
    exit_code: int | None  # None when killed by a signal
    signal: int | None
    timed_out: bool
    memory_exceeded: bool
    duration_s: float
    stderr_tail: str
    error: str | None = None  # unexpected exception inside the child's harness (type: message)

    @property
    def ok(self) -> bool:
        return self.value is not None

    def describe_failure(self) -> str:
        """One line: why no result came back."""
        if self.timed_out:
            return f"timed out after {self.duration_s:.1f} s"
        if self.memory_exceeded:
            return "exceeded the host memory limit"
        if self.error:
            return self.error
        if self.signal is not None:
            name = signal.Signals(self.signal).name if self.signal in signal.Signals._value2member_map_ else ""
            return f"crashed with signal {self.signal} {name}".strip()
        if self.exit_code not in (None, 0):
            return f"exited with code {self.exit_code} before reporting a result"
        return "exited before reporting a result"


def sign(key: bytes, body: bytes) -> str:
    return hmac.new(key, body, hashlib.sha256).hexdigest()


def child_environment(extra: dict[str, str] | None, workdir: Path) -> dict[str, str]:
    """The scrubbed environment of a child: passthrough variables, a private HOME, our import path."""
    env = {k: os.environ[k] for k in PASSTHROUGH_ENV if k in os.environ}
    env["HOME"] = str(workdir)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(extra or {})
    return env


def _group_rss_bytes(pgid: int) -> int:
    """Sum of resident memory of every process in a process group (Linux /proc)."""
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[2]) != pgid:  # field 5 of stat (pgrp), 3rd after the command name
                continue
            with open(f"/proc/{entry}/statm") as f:
                total += int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, IndexError, ValueError):
            continue
    return total


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        logger.warning("child %d did not exit after SIGKILL", proc.pid)


def _tail(path: Path, n_bytes: int = 4000) -> str:
    """The last `n_bytes` of a file, read without loading what a chatty child wrote before them."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - n_bytes))
            data = f.read()
    except OSError:
        return ""
    return data.decode(errors="replace")


class WorkerProcess:
    """A child started ahead of its payload, so its interpreter start, imports and CUDA context creation
    overlap with other work. `run` sends the payload and supervises from then on; a worker runs once.

    The payload may carry `"__env__": {...}`: variables set in the child before the entry is called
    (e.g. the build cache directory of the candidate it will import).
    """

    def __init__(self, entry: str, *, env: dict[str, str] | None = None, warm_device: str | None = None,
                 data_limit_bytes: int | None = None):
        self.key = secrets.token_bytes(32)
        # A stray grandchild may still write there; cleanup must never crash the parent.
        self._tmp = tempfile.TemporaryDirectory(prefix="cudal1-child-", ignore_cleanup_errors=True)
        tmp_path = Path(self._tmp.name)
        self.run_dir = tmp_path / "work"
        self.run_dir.mkdir()
        self.out_path, self.err_path = tmp_path / "out.json", tmp_path / "stderr.txt"
        cmd = [sys.executable, "-m", "cudal1.eval._child", entry, str(self.out_path), warm_device or "-",
               str(data_limit_bytes or 0)]
        self._err_file = open(self.err_path, "wb")  # noqa: SIM115 - closed in _finish
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=self._err_file, stderr=subprocess.STDOUT,
                                     cwd=self.run_dir, env=child_environment(env, self.run_dir),
                                     start_new_session=True)
        assert self.proc.stdin is not None
        self.proc.stdin.write(self.key.hex().encode() + b"\n")
        self.proc.stdin.flush()

    def run(self, payload: dict[str, Any], limits: Limits = Limits()) -> IsolatedOutcome:
        """Send the payload, wait under `limits`, and return how the child ended and what it returned."""
        start = time.monotonic()
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(json.dumps(payload).encode() + b"\n")
            self.proc.stdin.close()
        except (BrokenPipeError, OSError):
            pass  # the child already died; supervision reports how
        timed_out, memory_exceeded = _supervise(self.proc, limits, start)
        duration_s = time.monotonic() - start
        value, error = _read_signed(self.out_path, self.key)
        code = self.proc.returncode
        outcome = IsolatedOutcome(
            value=None if (timed_out or memory_exceeded) else value,
            exit_code=code if code is not None and code >= 0 else None,
            signal=-code if code is not None and code < 0 else None,
            timed_out=timed_out, memory_exceeded=memory_exceeded, duration_s=duration_s,
            stderr_tail=_tail(self.err_path), error=error)
        self._finish()
        return outcome

    def discard(self) -> None:
        """Kill an unused worker and remove its files."""
        _kill_group(self.proc)
        self._finish()

    def _finish(self) -> None:
        self._err_file.close()
        self._tmp.cleanup()


def usable_cpu_count() -> int:
    """Cores this process may run on (its affinity mask: taskset, cgroups' cpusets, Slurm), not the host's."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


def set_cpu_affinity(pid: int, cpus: frozenset[int] | None) -> None:
    """Let process `pid` (every thread it has, and those it starts later) run on `cpus` only; None: every
    core this process may use. Best effort: a platform without affinity, or a process that is gone, is left."""
    if not hasattr(os, "sched_setaffinity"):
        return
    mask = cpus if cpus is not None else os.sched_getaffinity(0)
    try:
        threads = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:  # no /proc: the main thread only
        threads = [pid]
    for tid in threads:
        try:
            os.sched_setaffinity(tid, mask)
        except OSError:
            pass


class WorkerSupply:
    """Hands out warm workers, starting a replacement each time one is taken (at most `total` workers in
    all when given: a series of known length wastes no starts at its end)."""

    def __init__(self, entry: str, *, env: dict[str, str] | None = None, warm_device: str | None = None,
                 spares: int = 1, total: int | None = None):
        self.entry, self.env, self.warm_device, self.spares = entry, env, warm_device, spares
        self.total = total
        self._started = 0
        self._ready: list[WorkerProcess] = []
        self._cpus: tuple[frozenset[int], frozenset[int]] | None = None

    def pin(self, cpus: frozenset[int] | None, others: frozenset[int] | None = None) -> None:
        """From now on, a worker handed out runs on `cpus` only, and the workers waiting or starting on
        `others` (None: every core), so that a starting worker never competes with the one being timed.
        `pin(None)`: every worker on every core again."""
        self._cpus = (cpus, others) if cpus is not None else None
        for worker in self._ready:
            set_cpu_affinity(worker.proc.pid, others if cpus is not None else None)

    def take(self) -> WorkerProcess:
        """A started worker; spares that died while waiting are discarded, never handed out."""
        while self._ready and self._ready[0].proc.poll() is not None:
            self._ready.pop(0).discard()
        worker = self._ready.pop(0) if self._ready else self._spawn()
        if self._cpus is not None:
            set_cpu_affinity(worker.proc.pid, self._cpus[0])
        try:
            self.fill()
        except OSError:  # no spare now (out of processes or files): the next take starts one itself
            logger.warning("could not start a spare evaluation worker", exc_info=True)
        return worker

    def fill(self) -> None:
        """Start spares up to `spares` now (e.g. while a batch's builds run), so the first `take` is warm."""
        while len(self._ready) < self.spares and (self.total is None or self._started < self.total):
            self._ready.append(self._spawn())

    @property
    def n_ready(self) -> int:
        """Started workers waiting to be taken."""
        return len(self._ready)

    def _spawn(self) -> WorkerProcess:
        worker = WorkerProcess(self.entry, env=self.env, warm_device=self.warm_device)
        self._started += 1
        if self._cpus is not None:
            set_cpu_affinity(worker.proc.pid, self._cpus[1])
        return worker

    def close(self) -> None:
        for worker in self._ready:
            worker.discard()
        self._ready.clear()

    def __enter__(self) -> WorkerSupply:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def run_isolated(entry: str, payload: dict[str, Any], *, limits: Limits = Limits(),
                 env: dict[str, str] | None = None, worker: WorkerProcess | None = None) -> IsolatedOutcome:
    """Run `entry` ("package.module:function", called with `payload`) in a fresh limited process.

    The function must return a JSON-serialisable dict. Returns an `IsolatedOutcome`; never raises for
    anything the child does. `worker` is a pre-started `WorkerProcess` for the same entry (its own `env`
    then applies; pass per-run variables in `payload["__env__"]`).
    """
    if worker is None:
        data_limit = limits.memory_bytes if limits.hard_data_limit else None
        worker = WorkerProcess(entry, env=env, data_limit_bytes=data_limit)
    elif env:
        payload = {**payload, "__env__": {**payload.get("__env__", {}), **env}}
    return worker.run(payload, limits)


def _supervise(proc: subprocess.Popen, limits: Limits, start: float) -> tuple[bool, bool]:
    """Wait for the child, enforcing the time and memory limits. Returns (timed_out, memory_exceeded)."""
    while True:
        try:
            proc.wait(timeout=MEMORY_POLL_S)
            # The child is gone; anything it left in its group (threads are gone, stray children not).
            _kill_group(proc)
            return False, False
        except subprocess.TimeoutExpired:
            pass
        if time.monotonic() - start > limits.timeout_s:
            _kill_group(proc)
            return True, False
        if limits.memory_bytes and _group_rss_bytes(proc.pid) > limits.memory_bytes:
            _kill_group(proc)
            return False, True


def _read_signed(out_path: Path, key: bytes) -> tuple[dict[str, Any] | None, str | None]:
    """Read the child's result file; accept it only with a valid HMAC over its body."""
    try:
        envelope = json.loads(out_path.read_text())
    except (OSError, ValueError):
        return None, None
    body = envelope.get("body", "") if isinstance(envelope, dict) else ""
    if not isinstance(body, str) or not hmac.compare_digest(sign(key, body.encode()), str(envelope.get("sig"))):
        return None, "the result file was forged or corrupted (bad signature)"
    message = json.loads(body)
    if "__harness_error__" in message:
        return None, message["__harness_error__"]
    return message.get("value"), None
