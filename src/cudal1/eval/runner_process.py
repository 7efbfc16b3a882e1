"""Runner processes: started in the sandbox, spoken to over a channel, watched, frozen and killed.

A `RunnerProcess` is one `python -m cudal1.eval.inside.runner` in its own sandbox (`sandbox.wrap_command`).
It is started ahead of its work (interpreter, torch import and CUDA context overlap other work), takes a role
when the parent sets it up, and serves typed requests (`shared.protocol`) until the parent closes it. The
parent enforces:

- a deadline on every request (`ChannelTimeout` -> the runner is killed);
- a memory limit: the resident memory of the runner's whole process tree (shared memory included) is read
  about every 0.1 s while the parent waits, and the tree is killed when it exceeds the limit; a GPU memory
  limit the same way through NVML where it is installed; the sandbox's /tmp and /dev/shm are size-limited
  tmpfs;
- `freeze()` / `thaw()`: SIGSTOP/SIGCONT of the runner (every thread of it) while the other model runs, so
  nothing the candidate left running competes with the reference for the CPU;
- death: every process of the sandbox dies with the runner's tree (`kill`), with the parent (bwrap
  `--die-with-parent`; a plain child gets PR_SET_PDEATHSIG), and the parent's reaper (`reaper.py`), the moment
  the parent ends however it ends (SIGKILL included), thaws the runners' frozen control groups (a frozen
  process cannot act on its SIGKILL), ends what still runs in their folders and removes them; a restart
  removes what a killed run left when its reaper was killed too (`reap_stale_folders`: a parent killed while
  bubblewrap sets a sandbox up can leave bubblewrap's idle init behind);
- its output: stdout and stderr go through a pipe of which the parent keeps the first and last few KB
  (`OutputTail`), whatever the runner writes;
- its replies: each is decoded as its request's reply class; anything else is a `RunnerFailed` with
  `malformed` set. A progress note (a build started) is accepted only where the caller allows it, and
  extends the wait once, to the caller's limit for builds.

Not covered: a runner started from a thread that exits dies with that thread (Linux's parent-death signal
follows the thread): start runners from long-lived threads.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cudal1.eval.cgroups import RunnerGroup
from cudal1.eval.reaper import FOLDER_PREFIX, ensure_reaper, reap_stale_folders  # noqa: F401 (re-exported)
from cudal1.eval.sandbox import SandboxInfo, SandboxSpec, detect_sandbox, sandbox_environment, wrap_command
from cudal1.eval.shared.channel import Channel, ChannelClosed, ChannelTimeout, ProtocolError, socket_pair
from cudal1.eval.shared.protocol import (
    MALFORMED,
    Hello,
    MalformedMessage,
    MalformedReply,
    Message,
    decode_reply,
    reply_limit,
)

logger = logging.getLogger(__name__)

#: Where a runner sees its scratch folder (a candidate's prepared build is copied there before setup).
SCRATCH_INSIDE = "/tmp/ext"
MEMORY_POLL_S = 0.1
#: What one runner may send over its life (an evaluation's worth of replies): bytes, and the parent's time spent
#: parsing and checking them. An honest evaluation's runner sends well under a tenth of each (docs/sandbox.md);
#: beyond them the runner's replies are the candidate's `runtime_error`, at once.
CHANNEL_BUDGET_BYTES = 64 * 2**20
CHANNEL_BUDGET_DECODE_S = 10.0
GPU_MEMORY_POLL_S = 0.5
START_TIMEOUT_S = 180.0


class RunnerFailed(Exception):
    """A request got no valid reply: the runner died, timed out, exceeded a limit or broke the protocol.

    The kind is in the typed fields (`timed_out`, `memory`, `malformed`, `signal_number`, ...), never to be
    read from `reason`, which is for people. A malformed reply's `reason` is given as its detail and always
    reads `protocol.malformed: <detail>`."""

    def __init__(self, reason: str, *, timed_out: bool = False, memory: bool = False, signal_number: int | None = None,
                 exit_code: int | None = None, killed_by_parent: bool = False, stderr_tail: str = "",
                 malformed: bool = False):
        if malformed:
            reason = f"{MALFORMED}: {reason}"
        super().__init__(reason)
        self.reason, self.timed_out, self.memory = reason, timed_out, memory
        self.signal_number, self.exit_code, self.killed_by_parent = signal_number, exit_code, killed_by_parent
        self.stderr_tail, self.malformed = stderr_tail, malformed

    @property
    def killed_from_outside(self) -> bool:
        """SIGKILL that the parent did not send: the OOM killer, an operator (or the candidate itself)."""
        return self.signal_number == signal.SIGKILL and not self.killed_by_parent


def _set_parent_death_signal() -> None:
    """preexec for unsandboxed runners: SIGKILL when the parent (thread) dies."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def process_tree(root: int) -> list[int]:
    """`root` and all its descendants (Linux /proc children lists)."""
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


def tree_rss_bytes(pids: list[int]) -> int:
    total = 0
    page = os.sysconf("SC_PAGE_SIZE")
    for pid in pids:
        try:
            with open(f"/proc/{pid}/statm") as f:
                total += int(f.read().split()[1]) * page
        except (OSError, IndexError, ValueError):
            continue
    return total


def _gpu_memory_of(pids: list[int]) -> int | None:
    """GPU memory used by these processes (NVML), None when NVML is not available."""
    try:
        import pynvml  # noqa: PLC0415 - optional: nvidia-ml-py, present on GPU hosts
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        wanted, used = set(pids), 0
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                if proc.pid in wanted and proc.usedGpuMemory:
                    used += int(proc.usedGpuMemory)
        return used
    except Exception:  # noqa: BLE001 - NVML refusing (no driver, container) means no GPU watchdog
        return None


class OutputTail:
    """A runner's stdout and stderr through a pipe: the first `head` and last `tail` bytes are kept, the
    rest counted and dropped (a runner that prints without end costs the parent nothing but the reading)."""

    def __init__(self, head: int = 16 << 10, tail: int = 64 << 10):
        read_fd, self.write_fd = os.pipe()
        self.head_limit, self.tail_limit = head, tail
        self.head, self.tail = bytearray(), bytearray()
        self.total = 0
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._drain, args=(read_fd,), name="cudal1-runner-output", daemon=True)
        self._thread.start()

    def _drain(self, fd: int) -> None:
        try:
            while chunk := os.read(fd, 1 << 16):
                with self._lock:
                    self.total += len(chunk)
                    room = self.head_limit - len(self.head)
                    if room > 0:
                        self.head += chunk[:room]
                        chunk = chunk[room:]
                    self.tail += chunk
                    del self.tail[:-self.tail_limit]
        except OSError:
            pass
        finally:
            os.close(fd)

    def text(self, n_bytes: int = 4000) -> str:
        """The last `n_bytes` kept (what a failure's message quotes)."""
        with self._lock:
            data = bytes(self.head if not self.tail else self.tail)
        return data[-n_bytes:].decode(errors="replace")

    def close_writer(self) -> None:
        if self.write_fd >= 0:
            os.close(self.write_fd)
            self.write_fd = -1


@dataclass
class RunnerLimits:
    """Limits the parent enforces on one runner."""

    memory_bytes: int | None = None
    gpu_memory_bytes: int | None = None


class RunnerProcess:
    """One sandboxed runner (see the module docstring)."""

    def __init__(self, device: str = "cpu", *, warm: bool = True, spec: SandboxSpec | None = None,
                 info: SandboxInfo | None = None, cpus: frozenset[int] | None = None, model_imports: bool = True):
        self.info = info or detect_sandbox()
        self.device = device
        self.spec = spec or SandboxSpec(gpu=device.startswith("cuda"))
        ensure_reaper()  # before its first folder: whatever ends this process, its runners are cleaned up at once
        self.folder = Path(tempfile.mkdtemp(prefix=FOLDER_PREFIX))
        (self.folder / "owner").write_text(str(os.getpid()))
        self.scratch = self.folder / "scratch"
        self.scratch.mkdir()
        self._chown_for_sandbox(self.scratch)
        self.limits = RunnerLimits()
        self.killed_reason: str | None = None
        self.killed_for_memory = False  # the reason was one of its memory limits (`kill(..., memory=True)`)
        self._last_memory_check = 0.0
        self._last_gpu_check = 0.0
        self.runner_pid: int | None = None
        self.tree_root: int | None = None
        parent_sock, child_sock = socket_pair()
        self.channel = Channel(parent_sock)
        argv = [sys.executable, "-m", "cudal1.eval.inside.runner", str(child_sock.fileno()), device if warm else "-",
                *([] if model_imports else ["bare"])]
        self.output = OutputTail()
        sandboxed = self.info.level != "none"
        if sandboxed:
            spec = SandboxSpec(**{**self.spec.__dict__, "binds": [*self.spec.binds, (str(self.scratch), SCRATCH_INSIDE)]})
            info_r, info_w = os.pipe()
            cmd = wrap_command(argv, spec, self.info, info_fd=info_w)
            pass_fds = (child_sock.fileno(), info_w)
            env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
            cwd, preexec = None, None
        else:
            info_r = info_w = -1
            cmd, pass_fds = argv, (child_sock.fileno(),)
            work = self.folder / "work"
            work.mkdir()
            env = sandbox_environment({**self.spec.env, "HOME": str(work), "TMPDIR": str(work)})
            cwd, preexec = str(work), _set_parent_death_signal
        try:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=self.output.write_fd,
                                         stderr=subprocess.STDOUT, pass_fds=pass_fds, env=env, cwd=cwd,
                                         start_new_session=True, preexec_fn=preexec)
        finally:
            self.output.close_writer()
            child_sock.close()
            if info_w >= 0:
                os.close(info_w)
        self._info_r = info_r
        if cpus is not None:
            self.pin(cpus)
        self.hello: Hello | None = None
        self.received_bytes = 0  # every reply's bytes, and the parent's time reading them (the budget)
        self.decode_s = 0.0
        self.last_build_s = 0.0  # the last reply's build time (`reply`)
        self.baseline_processes = 0  # processes of its sandbox once ready (bwrap, its init, the runner)
        self.group: RunnerGroup | None = None  # its control group, where the host allows one
        self.last_request_ms = 0.0

    # ------------------------------------------------------------------ identity and tree

    def _chown_for_sandbox(self, path: Path) -> None:
        """A folder the sandbox must write belongs to its uid when a root parent drops privileges."""
        uid = self.info.drop_to_uid
        if uid is None:
            return
        for dirpath, _dirnames, filenames in os.walk(path):
            os.chown(dirpath, uid, uid)
            for name in filenames:
                os.chown(os.path.join(dirpath, name), uid, uid, follow_symlinks=False)

    def _resolve_pids(self) -> None:
        if self.tree_root is not None:
            return
        if self._info_r < 0:
            self.tree_root = self.runner_pid = self.proc.pid
            return
        try:
            data = b""
            while not data.endswith(b"}\n"):
                chunk = os.read(self._info_r, 4096)
                if not chunk:
                    break
                data += chunk
            init = int(json.loads(data)["child-pid"])
        except (OSError, ValueError, KeyError):
            init = self.proc.pid
        finally:
            os.close(self._info_r)
            self._info_r = -1
        self.tree_root = init
        kids = [p for p in process_tree(init) if p != init]
        self.runner_pid = kids[0] if kids else init

    def pids(self) -> list[int]:
        """Every process of this runner's sandbox (the runner, anything it started), outside pids."""
        self._resolve_pids()
        return process_tree(self.proc.pid)

    def pin(self, cpus: frozenset[int] | None) -> None:
        """Run every thread of the runner's tree on `cpus` (None: every core this process may use)."""
        if not hasattr(os, "sched_setaffinity"):
            return
        mask = cpus if cpus is not None else os.sched_getaffinity(0)
        for pid in process_tree(self.proc.pid):
            try:
                tasks = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
            except OSError:
                continue
            for tid in tasks:
                try:
                    os.sched_setaffinity(tid, mask)
                except OSError:
                    pass

    # ------------------------------------------------------------------ requests

    def wait_ready(self, timeout_s: float = START_TIMEOUT_S) -> Hello:
        """The runner's hello (its pid, versions, device facts); waits for its start."""
        if self.hello is None:
            raw, _ = self._receive(timeout_s, max_bytes=Hello.MAX_BYTES)
            try:
                self.hello = Hello.decode(raw)
            except MalformedMessage as exc:
                self.kill("broke the protocol")
                raise self._failure(str(exc), malformed=True) from None
            self._resolve_pids()
            tree = process_tree(self.proc.pid)
            self.baseline_processes = len(tree)
            self.group = RunnerGroup.create()
            if self.group is not None:
                self.group.add(tree)  # whatever they start from now on is in it too
                if self.limits.memory_bytes:
                    self.group.set_memory_limit(self.limits.memory_bytes)
        return self.hello

    def set_memory_limit(self, limit_bytes: int | None) -> None:
        """The host memory limit of the whole sandbox: kernel-enforced where it has a cgroup, watched always."""
        self.limits.memory_bytes = limit_bytes
        if limit_bytes and self.group is not None:
            self.group.set_memory_limit(limit_bytes)

    def cpu_ns(self) -> int | None:
        """CPU time the runner's sandbox used so far (its control group's clock), None without one."""
        return self.group.cpu_ns() if self.group is not None else None

    def send(self, request: Message, fds: tuple[int, ...] = ()) -> None:
        """Send a request without waiting (the bracket's: its reply comes after the doorbells rang)."""
        self.wait_ready()
        try:
            self.channel.send(request.encode(), fds)
        except ChannelClosed:
            raise self._failure("the runner exited") from None

    def reply(self, request: Message, timeout_s: float, *, progress_s: float | None = None,
              keep_fds: int = 0, max_bytes: int | None = None) -> Message:
        """The reply to `request` (sent): its reply class or an `ErrorReply`; `RunnerFailed` for anything
        else (`malformed`: a reply over its size limit, `max_bytes` or its class's, or outside the schema,
        or past this runner's budget). With `progress_s`, progress notes (a real build started) are accepted
        and extend the wait to `progress_s` from the first; without it a note breaks the protocol.
        `last_build_s`: the time from the first note to the reply (0 without one)."""
        deadline = time.monotonic() + timeout_s
        first_note = None
        limit = max_bytes or reply_limit(request)
        while True:
            raw, fds = self._receive(max(0.0, deadline - time.monotonic()), keep_fds=keep_fds, max_bytes=limit)
            if not self._progress_note(raw, fds, allowed=progress_s is not None):
                break
            if first_note is None:
                first_note = time.monotonic()
                deadline = max(deadline, first_note + (progress_s or 0.0))
        self.last_build_s = time.monotonic() - first_note if first_note is not None else 0.0
        return self._decode(request, raw, fds, keep_fds)

    def receive(self, request: Message, timeout_s: float, *, notes: bool,
                max_bytes: int | None = None) -> Message | None:
        """The next message for `request` (sent), one at a time: None for a progress note (a real build
        started; taken only with `notes`, else it breaks the protocol), else the decoded reply as `reply`
        decodes it. The caller owns the deadline across notes."""
        raw, fds = self._receive(timeout_s, max_bytes=max_bytes or reply_limit(request))
        if self._progress_note(raw, fds, allowed=notes):
            return None
        return self._decode(request, raw, fds, 0)

    def _progress_note(self, raw: dict[str, Any], fds: list[int], *, allowed: bool) -> bool:
        """Whether `raw` is a progress note (its descriptors closed, its bytes and reading time on the channel
        budget, which bounds a flood of them); one where none is allowed kills the runner and fails its request
        as malformed."""
        if raw.get("op") != "progress":
            return False
        for fd in fds:
            os.close(fd)
        if not allowed:
            self.kill("broke the protocol")
            raise self._failure("a progress note where none is allowed", malformed=True)
        self._check_budget([])
        return True

    def _decode(self, request: Message, raw: dict[str, Any], fds: list[int], keep_fds: int) -> Message:
        t0 = time.perf_counter()
        try:
            decoded = decode_reply(request, raw)
        except MalformedReply as exc:
            for fd in fds:
                os.close(fd)
            self.kill("broke the protocol")
            raise self._failure(exc.detail, malformed=True) from None
        finally:
            self.decode_s += time.perf_counter() - t0
        self._check_budget(fds)
        if keep_fds:
            self.last_fds = fds
        return decoded

    def _check_budget(self, fds: list[int]) -> None:
        """The runner's channel budget (`CHANNEL_BUDGET_BYTES`, `CHANNEL_BUDGET_DECODE_S`): past it, the
        runner is killed and its request failed as malformed."""
        over = ""
        if self.received_bytes > CHANNEL_BUDGET_BYTES:
            over = f"{self.received_bytes} bytes of replies, over the budget of {CHANNEL_BUDGET_BYTES}"
        elif self.decode_s > CHANNEL_BUDGET_DECODE_S:
            over = (f"replies that took {self.decode_s:.1f} s to read, over the budget of "
                    f"{CHANNEL_BUDGET_DECODE_S:.0f} s")
        if over:
            for fd in fds:
                os.close(fd)
            self.kill("broke the protocol")
            raise self._failure(f"the runner sent {over}", malformed=True)

    def ask(self, request: Message, timeout_s: float, fds: tuple[int, ...] = (), *,
            progress_s: float | None = None) -> Message:
        """Send one request and return its decoded reply (`reply`); raises `RunnerFailed`.
        `last_request_ms` is the parent's clock from the send to the reply."""
        t0 = time.perf_counter()
        self.send(request, fds)
        reply = self.reply(request, timeout_s, progress_s=progress_s)
        self.last_request_ms = (time.perf_counter() - t0) * 1e3
        self._check_memory(force=False)
        return reply

    def ask_descriptors(self, request: Message, timeout_s: float, count: int) -> tuple[Message, list[int]]:
        """A request whose reply carries up to `count` file descriptors (the trusted helper's device arenas):
        (reply, descriptors), which the caller closes. Only the helper is asked this way."""
        self.send(request)
        self.last_fds: list[int] = []
        reply = self.reply(request, timeout_s, keep_fds=count)
        return reply, self.last_fds

    def _receive(self, timeout_s: float, keep_fds: int = 0,
                 max_bytes: int | None = None) -> tuple[dict[str, Any], list[int]]:
        t0 = time.perf_counter()
        try:
            raw, fds = self.channel.recv(timeout_s, tick=self._tick, max_fds=max(keep_fds, 4), max_bytes=max_bytes)
        except ChannelTimeout:
            self.kill("timed out")
            raise self._failure(f"no answer within {timeout_s:.1f} s", timed_out=True) from None
        except ChannelClosed:
            raise self._failure(self.killed_reason or "the runner exited") from None
        except ProtocolError as exc:
            self.received_bytes += self.channel.last_bytes
            self.kill("broke the protocol")
            raise self._failure(str(exc), malformed=True) from None
        # The read and the parse are the parent's work on the runner's bytes (the wait before them is not).
        self.decode_s += max(0.0, time.perf_counter() - t0 - self.channel.last_wait_s)
        self.received_bytes += self.channel.last_bytes
        if not keep_fds:
            for fd in fds:
                os.close(fd)  # only the helper's arenas come back as descriptors
            fds = []
        if self.killed_reason is not None:
            for fd in fds:
                os.close(fd)
            raise self._failure(self.killed_reason, memory=self.killed_for_memory)
        return raw, fds

    def check_alive(self) -> None:
        """The watchdog's checks while the parent waits on something else (a doorbell); `RunnerFailed` when
        the runner is gone or was killed for a limit."""
        self._check_memory(force=False)
        if self.killed_reason is not None or self.proc.poll() is not None:
            raise self._failure(self.killed_reason or "the runner exited", memory=self.killed_for_memory)

    def _tick(self) -> None:
        self._check_memory(force=False)
        if self.proc.poll() is not None:
            raise ChannelClosed("exited")

    def _check_memory(self, force: bool) -> None:
        now = time.monotonic()
        if self.killed_reason is not None or (not force and now - self._last_memory_check < MEMORY_POLL_S):
            return
        self._last_memory_check = now
        pids = None
        if self.limits.memory_bytes:
            pids = self.pids()
            used = tree_rss_bytes(pids)
            if used > self.limits.memory_bytes:
                self.kill(memory=True, reason=f"exceeded the host memory limit ({used / 2**30:.1f} GiB > "
                          f"{self.limits.memory_bytes / 2**30:.1f} GiB)")
                return
        if self.limits.gpu_memory_bytes and now - self._last_gpu_check >= GPU_MEMORY_POLL_S:
            self._last_gpu_check = now
            used = _gpu_memory_of(pids or self.pids())
            if used is not None and used > self.limits.gpu_memory_bytes:
                self.kill(memory=True, reason=f"exceeded the GPU memory limit ({used / 2**30:.1f} GiB > "
                          f"{self.limits.gpu_memory_bytes / 2**30:.1f} GiB)")

    def _failure(self, reason: str, *, timed_out: bool = False, memory: bool = False,
                 malformed: bool = False) -> RunnerFailed:
        try:
            code = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.kill(self.killed_reason or "did not exit")
            code = self.proc.wait()
        if not timed_out and self.group is not None and self.group.oom_killed() and self.killed_reason is None:
            self.killed_for_memory = True
            self.killed_reason = (f"exceeded the host memory limit "
                                  f"({(self.limits.memory_bytes or 0) / 2**30:.1f} GiB)")
        if self.killed_reason is not None and self.killed_for_memory:
            reason, memory = self.killed_reason, True
        sig = None
        if code is not None and code < 0:
            sig = -code
        elif code is not None and self.info.level != "none" and code > 128:
            sig = code - 128  # bwrap reports a child killed by signal N as 128 + N
        if sig is not None and not timed_out and not memory and self.killed_reason is None:
            name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
            reason = f"crashed with signal {sig} {name}"
        elif code not in (None, 0) and sig is None and not timed_out and self.killed_reason is None:
            reason = f"exited with code {code} before reporting a result"
        elif sig is None and not timed_out and self.killed_reason is None:
            reason = "exited before reporting a result"
        return RunnerFailed(reason, timed_out=timed_out, memory=memory, signal_number=sig, exit_code=code,
                            killed_by_parent=self.killed_reason is not None, stderr_tail=self.output.text(),
                            malformed=malformed)

    # ------------------------------------------------------------------ control

    def freeze(self) -> None:
        """Stop the whole sandbox (its cgroup's freezer; without one, SIGSTOP to the runner's threads)."""
        if self.group is not None and self.group.freeze(True):
            return
        if self.runner_pid is not None:
            try:
                os.kill(self.runner_pid, signal.SIGSTOP)
            except OSError:
                pass

    def thaw(self) -> None:
        if self.group is not None and self.group.freeze(False):
            return
        if self.runner_pid is not None:
            try:
                os.kill(self.runner_pid, signal.SIGCONT)
            except OSError:
                pass

    def kill(self, reason: str = "killed", *, memory: bool = False) -> None:
        """SIGKILL the whole tree and its control group (the sandbox goes with it); `memory`: for one of its
        memory limits (the failure then says so, `RunnerFailed.memory`)."""
        if self.killed_reason is None:
            self.killed_reason, self.killed_for_memory = reason, memory
        pids = set(process_tree(self.proc.pid))
        if self.group is not None:
            self.group.freeze(False)  # a frozen process takes its SIGKILL only once thawed
            pids.update(self.group.pids())
        for pid in sorted(pids, reverse=True):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass

    def close(self) -> None:
        """End the runner and remove its folder (never raises)."""
        if self.proc.poll() is None:
            self.kill("closed")
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            logger.warning("runner %d did not exit after SIGKILL", self.proc.pid)
        self.channel.close()
        if self._info_r >= 0:
            os.close(self._info_r)
            self._info_r = -1
        if self.group is not None:
            for _ in range(50):  # the kernel empties a group a little after its processes die
                if not self.group.pids():
                    break
                time.sleep(0.01)
            self.group.remove()
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> RunnerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def copy_into_scratch(runner: RunnerProcess, source: str | os.PathLike) -> None:
    """Copy a prepared folder (a candidate's build) into the runner's scratch folder, times kept."""
    source = Path(source)
    if source.is_dir():
        shutil.copytree(source, runner.scratch, dirs_exist_ok=True, copy_function=shutil.copy2, symlinks=True)
        runner._chown_for_sandbox(runner.scratch)
