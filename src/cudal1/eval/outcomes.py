"""How a session ends early: a `Verdict` on the candidate, or an `InfraFailure` of the evaluation itself."""

from __future__ import annotations

from cudal1.core import flags as F
from cudal1.core.types import Mismatch, Status
from cudal1.eval.shared.protocol import ErrorReply


class Verdict(Exception):
    """Ends the session early with a status and its evidence."""

    def __init__(self, status: Status, message: str, *, flag: str | None = None, mismatch: Mismatch | None = None,
                 compile_log: str = ""):
        super().__init__(message)
        self.status, self.message, self.flag, self.mismatch, self.compile_log = status, message, flag, mismatch, compile_log


class InfraFailure(Exception):
    """The evaluation itself failed (not the candidate): retried, never stored."""


class CandidateDied(InfraFailure):
    """The candidate's runner died from a signal the parent did not send (SIGKILL) while it ran the candidate's
    code: its import and construction, a trial, a timed call. A process can send itself that signal, at any
    step it likes, so the evaluation is retried once in fresh runners and a second death, wherever it comes, is
    the candidate's `runtime_error`; only evidence that the machine killed it (its OOM killer acted during the
    attempt) makes it `infra_error` (`evaluation.run_candidate`)."""

    def __init__(self, step: str):
        super().__init__(f"the candidate's runner was killed (SIGKILL) during {step}")
        self.step = step


def reference_failure(message: str) -> Verdict:
    """The reference failed in its own runner (raised, crashed, ran out of memory): no verdict on the
    candidate (`infra_error`, never stored), named by the `reference_error` flag. Not retried: the same
    reference on the same machine fails the same way."""
    return Verdict(Status.INFRA_ERROR, f"{message} (the reference's failure, not the candidate's)",
                   flag=F.REFERENCE_ERROR)


#: Kinds of failure a candidate's runner reports for a call -> the status they mean.
CALL_FAILURES = {"raised": Status.RUNTIME_ERROR, "oom": Status.RUNTIME_ERROR, "arena_full": Status.INCORRECT,
                 "unsupported_output": Status.INCORRECT}
#: Kinds of failure at the candidate's set-up (import and construction) -> the status they mean.
SETUP_FAILURES = {"syntax": Status.COMPILE_ERROR, "import": Status.COMPILE_ERROR, "build": Status.COMPILE_ERROR,
                  "no_modelnew": Status.COMPILE_ERROR, "construct": Status.RUNTIME_ERROR, "oom": Status.RUNTIME_ERROR}
#: The message of a candidate that cannot run where it is evaluated (CUDA code on the CPU): no verdict.
NEEDS_A_GPU = "this candidate compiles CUDA code, which needs a GPU: evaluate it on a machine with one (device cuda)"


def setup_verdict(reply: ErrorReply, device: str) -> Verdict:
    """The verdict for a candidate's set-up that its runner says failed. `no_gpu` (the runner's build hooks
    refused a CUDA build: its process has no GPU) is no verdict (`infra_error`, never stored) where the
    evaluation runs on the CPU; on a GPU the runner has one, so the claim is the candidate's own failure."""
    if reply.kind == "no_gpu":
        if device.startswith("cuda"):
            return Verdict(Status.RUNTIME_ERROR, reply.message or "set-up failed")
        return Verdict(Status.INFRA_ERROR, f"{NEEDS_A_GPU} ({reply.message[:200]})")
    status = SETUP_FAILURES.get(reply.kind, Status.RUNTIME_ERROR)
    return Verdict(status, reply.message or "set-up failed", compile_log=reply.compile_log)


def call_verdict(reply: ErrorReply, where: str) -> Verdict:
    """The verdict for a call the candidate's runner says failed."""
    status = CALL_FAILURES.get(reply.kind, Status.RUNTIME_ERROR)
    if reply.kind in ("raised", "oom"):
        return Verdict(status, reply.message or "failed")
    return Verdict(status, f"{where}: {reply.message or reply.kind}")


def error_hint(stderr_tail: str) -> str:
    """The last line of a runner's log that names an error, as a short parenthesised hint ('' if none)."""
    lines = [ln for ln in stderr_tail.splitlines() if "error" in ln.lower()][-1:]
    return f" ({lines[0].strip()[:200]})" if lines else ""
