"""One trusted function (a build, a peak measurement) in a fresh sandboxed runner: `run_isolated`.

The function runs in a runner of its own (`runner_process.RunnerProcess`, the same sandbox as a model's) and
returns a JSON object; whatever the child does (crash, hang, exceed its memory) comes back as an
`IsolatedOutcome`, never as an exception in the caller.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from dataclasses import dataclass, field
from typing import Any

from cudal1.eval.runner_process import RunnerFailed, RunnerProcess, copy_into_scratch
from cudal1.eval.sandbox import SandboxInfo, SandboxSpec
from cudal1.eval.shared.protocol import EntryResult, ErrorReply, RunEntry


@dataclass(frozen=True)
class Limits:
    """Resource limits of one isolated run."""

    timeout_s: float = field(default=300.0, metadata={"help": "Wall-clock limit of the child process."})
    memory_bytes: int | None = field(
        default=16 * 2**30, metadata={"help": "Resident memory limit of the child's process tree (None: none)."})


@dataclass(frozen=True)
class IsolatedOutcome:
    """How a one-shot isolated run ended and what its function returned."""

    value: dict[str, Any] | None
    exit_code: int | None
    signal: int | None
    timed_out: bool
    memory_exceeded: bool
    duration_s: float
    stderr_tail: str
    error: str | None = None

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


def run_isolated(entry: str, payload: dict[str, Any], *, limits: Limits = Limits(), env: dict[str, str] | None = None,
                 device: str = "cpu", spec: SandboxSpec | None = None, info: SandboxInfo | None = None,
                 scratch_from: str | os.PathLike | None = None,
                 scratch_out: str | os.PathLike | None = None) -> IsolatedOutcome:
    """Run trusted `entry` ("package.module:function", called with `payload`, returning a JSON dict) in a
    fresh sandboxed runner; never raises for anything the child does. `env` is set in the child before the
    call; `scratch_from` is copied into the runner's scratch folder first (a prepared build) and the scratch
    folder is copied to `scratch_out` after (what a build wrote)."""
    start = time.monotonic()
    runner = RunnerProcess(device, warm=False, spec=spec, info=info)
    try:
        runner.set_memory_limit(limits.memory_bytes)
        if scratch_from is not None:
            copy_into_scratch(runner, scratch_from)
        try:
            runner.wait_ready(timeout_s=limits.timeout_s)
            reply = runner.ask(RunEntry(entry=entry, payload=payload, env=env or {}),
                               timeout_s=max(1.0, limits.timeout_s - (time.monotonic() - start)))
        except RunnerFailed as failure:
            return IsolatedOutcome(None, failure.exit_code, failure.signal_number, failure.timed_out, failure.memory,
                                   time.monotonic() - start, failure.stderr_tail,
                                   None if (failure.timed_out or failure.memory or failure.signal_number)
                                   else failure.reason)
        error = str(reply.message or reply.kind) if isinstance(reply, ErrorReply) else None
        value = reply.value if isinstance(reply, EntryResult) and isinstance(reply.value, dict) else None
        if value is None and error is None:
            error = "the function returned no JSON object"
        return IsolatedOutcome(value, 0, None, False, False, time.monotonic() - start, runner.output.text(), error)
    finally:
        if scratch_out is not None:
            runner.kill("done")
            runner.proc.wait()
            shutil.copytree(runner.scratch, scratch_out, dirs_exist_ok=True, symlinks=True, copy_function=shutil.copy2)
        runner.close()
