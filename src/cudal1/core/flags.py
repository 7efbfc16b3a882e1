"""The names of every runtime finding, defined once.

A runtime guard, a timing check or the trusted parent reports what it found as a `Flag` whose `rule` is one
of these constants; reports, the judge's case database, policies and tests refer to the same names. Static
rules have their own registry (`cudal1.analysis.rules`); their names carry no dot.

To add a runtime check: add its constant and its row in `RUNTIME_FLAGS` (a one-line description, the
severity it is raised with, whether it rejects under every policy), raise it where the evidence is found
with `runtime_flag`, and give it a fixture and a test (tests/eval).
"""

from __future__ import annotations

from dataclasses import dataclass

from cudal1.core.types import Flag, Severity

# -- guards in the candidate's process (reported by its runner: a cheap first filter, never a guarantee) --
GLOBAL_STATE = "guard.global_state"
ALGORITHM_FLAGS = "guard.algorithm_flags"
TIMER_PATCHING = "guard.timer_patching"
THREADS = "guard.threads"
NATIVE_THREADS = "guard.native_threads"
GLOBAL_HOOKS = "guard.global_hooks"
FUNCTION_MODE = "guard.function_mode"
TRACE_HOOK = "guard.trace_hook"
SIGNAL_HANDLERS = "guard.signal_handlers"
PROCESSES = "guard.processes"
STREAM_ESCAPE = "guard.stream_escape"
OUTPUT_TYPE = "guard.output_type"
DECOY_KERNEL = "guard.decoy_kernel"
KERNELS_NOT_RUN = "guard.kernels_not_run"
LOW_CUSTOM_SHARE = "guard.low_custom_share"
NO_GPU_WORK = "guard.no_gpu_work"
REDUCED_PRECISION = "guard.reduced_precision"

# -- evidence found by the trusted parent ------------------------------------------------------------------
INPUT_MUTATION = "runtime.input_mutation"
TIMED_OUTPUT = "runtime.timed_output"
BEYOND_DISTRIBUTION = "runtime.beyond_distribution"
REFERENCE_ERROR = "reference_error"
OUTSIDE_CLOCK = "timing.outside_clock"
CAPPED = "timing.capped"
REFERENCE_SLOWED = "timing.reference_slowed"
BELOW_FLOOR = "timing.below_floor"
INTERFERENCE = "timing.interference"
NOISY = "timing.noisy"
SIZE_CONSTANTS = "runtime.size_constants"
CUSTOM_BUILD_FAILED = "runtime.custom_build_failed"
PROTOCOL_MALFORMED = "protocol.malformed"
STRICTER_TOLERANCE = "evidence.stricter_tolerance"

# -- a kernel-form candidate's cubin, scanned by the trusted parent before any runner sees it ----------------
KERNEL_TIMER_READ = "kernel.timer_read"
KERNEL_SCAN_REJECTED = "kernel.scan_rejected"

# -- re-checks and the judge --------------------------------------------------------------------------------
RECHECK_AGREE = "recheck.agree"
RECHECK_DISAGREE = "recheck.disagree"
RECHECK_FAILED = "recheck.failed"
JUDGE_CHEATS = "judge.cheats"
JUDGE_CLEAN = "judge.clean"
JUDGE_INCONCLUSIVE = "judge.inconclusive"


@dataclass(frozen=True)
class FlagKind:
    """One runtime finding: what it means, how severe it is, whether it rejects under every policy (a
    finding that makes the measured speedup meaningless does; the others reject only where the policy
    rejects on runtime guards, `Policy.reject_runtime_guards`)."""

    description: str
    severity: Severity = Severity.ERROR
    always_rejects: bool = False


ERR, WARN, INFO = Severity.ERROR, Severity.WARNING, Severity.INFO
RUNTIME_FLAGS: dict[str, FlagKind] = {
    GLOBAL_STATE: FlagKind("the candidate changed a global numeric setting (TF32, cuDNN, matmul precision, "
                           "threads...)", ERR),
    ALGORITHM_FLAGS: FlagKind("the candidate changed a global switch that only chooses algorithms and keeps "
                              "float32 arithmetic (cuDNN benchmark or determinism, attention backends, threads): "
                              "reported, never rejected; the speed it buys is the candidate's", WARN),
    TIMER_PATCHING: FlagKind("the candidate replaced a timing, synchronisation or harness function in its process",
                             ERR, always_rejects=True),
    THREADS: FlagKind("the candidate started Python threads", ERR),
    NATIVE_THREADS: FlagKind("native threads grew (libraries start helpers lazily: a warning only)", WARN),
    GLOBAL_HOOKS: FlagKind("the candidate registered process-wide nn.Module hooks", ERR),
    FUNCTION_MODE: FlagKind("the candidate left a torch function or dispatch mode active", ERR),
    TRACE_HOOK: FlagKind("the candidate installed a profile, trace or monitoring hook", ERR),
    SIGNAL_HANDLERS: FlagKind("the candidate installed signal handlers or interval timers", ERR),
    PROCESSES: FlagKind("the candidate started processes that outlived its calls", ERR),
    STREAM_ESCAPE: FlagKind("the candidate's work ran outside the current stream", ERR),
    OUTPUT_TYPE: FlagKind("an output is not a plain torch.Tensor (a subclass or lazy object)", ERR),
    DECOY_KERNEL: FlagKind("custom kernels were compiled but did not compute the output", WARN),
    KERNELS_NOT_RUN: FlagKind("some of the candidate's own kernels never ran", INFO),
    LOW_CUSTOM_SHARE: FlagKind("the candidate's own kernels took a small share of its device time", INFO),
    NO_GPU_WORK: FlagKind("the candidate did no work on the GPU", INFO),
    REDUCED_PRECISION: FlagKind("the candidate computes at reduced precision (fp16, bf16, TF32 or a less "
                                "accurate algorithm)", ERR),
    INPUT_MUTATION: FlagKind("the candidate modified its inputs in place", WARN),
    TIMED_OUTPUT: FlagKind("an output of a timed call was wrong (correct in the trials)", WARN),
    BEYOND_DISTRIBUTION: FlagKind("wrong on inputs beyond the reference's own distribution (heavy-tailed, "
                                  "sign-varied)", WARN),
    REFERENCE_ERROR: FlagKind("the reference itself failed", WARN),
    OUTSIDE_CLOCK: FlagKind("the times reported from the candidate's process disagree with the clock outside it",
                            ERR, always_rejects=True),
    CAPPED: FlagKind("the candidate's reported time was below what the clock outside its process allows: the "
                     "clock's bound is the time that counts", INFO),
    BELOW_FLOOR: FlagKind("a time is below the task's physical floor", ERR, always_rejects=True),
    INTERFERENCE: FlagKind("the candidate left work running on the device after its calls had returned", ERR,
                           always_rejects=True),
    REFERENCE_SLOWED: FlagKind("the reference ran slower beside the candidate than beside its twin", WARN),
    NOISY: FlagKind("the bucket speedups scattered beyond the stability threshold: measured twice, both shown", INFO),
    SIZE_CONSTANTS: FlagKind("the candidate's size constants differ from the reference's and ModelNew uses them",
                             ERR, always_rejects=True),
    CUSTOM_BUILD_FAILED: FlagKind("an extension the candidate builds failed to build; its own code caught the "
                                  "failure and runs what it falls back to (the verdict is for that)", WARN),
    PROTOCOL_MALFORMED: FlagKind("the candidate's runner sent the parent something outside the protocol's schema "
                                 "or budget (a time that is not a finite positive number, a nested or oversized "
                                 "reply, unknown fields): its runtime_error", WARN),
    STRICTER_TOLERANCE: FlagKind("an output was outside a stricter profile's tolerance (recorded by a pass that "
                                 "derives several profiles' verdicts; the looser tolerance decided)", WARN),
    KERNEL_TIMER_READ: FlagKind("a kernel-form candidate's device code reads %globaltimer or %clock (PTX or "
                                "SASS), which only serves to tell calls apart (the first call from a timed one)",
                                ERR),
    KERNEL_SCAN_REJECTED: FlagKind("a kernel-form candidate's cubin holds what the form forbids (device-side "
                                   "launches, the device runtime, unresolved functions, bytes that are not a "
                                   "cubin)", ERR, always_rejects=True),
    RECHECK_AGREE: FlagKind("an independent re-measurement agreed", INFO),
    RECHECK_DISAGREE: FlagKind("an independent re-measurement disagreed", ERR),
    RECHECK_FAILED: FlagKind("the re-measurement failed", ERR),
    JUDGE_CHEATS: FlagKind("the LLM judge says the candidate cheats", ERR),
    JUDGE_CLEAN: FlagKind("the LLM judge found no cheat", INFO),
    JUDGE_INCONCLUSIVE: FlagKind("the LLM judge could not decide", INFO),
}
del ERR, WARN, INFO

#: One line per runtime finding (reports, the judge's case database).
DESCRIPTIONS: dict[str, str] = {rule: kind.description for rule, kind in RUNTIME_FLAGS.items()}


def always_rejects(rule: str) -> bool:
    """Whether a runtime finding rejects under every policy (`cudal1.policy.decide`)."""
    kind = RUNTIME_FLAGS.get(rule)
    return kind is not None and kind.always_rejects


def severity_of(rule: str) -> Severity:
    """The severity a runtime finding is raised with (its `RUNTIME_FLAGS` row)."""
    return RUNTIME_FLAGS[rule].severity


def runtime_flag(rule: str, message: str, *, line: int | None = None, source: str = "runtime") -> Flag:
    """A runtime finding with its table severity: every site raises a finding through this (or reads
    `severity_of`), so that a finding's severity is stated once (tests/core/test_flag_severity.py)."""
    return Flag(rule, severity_of(rule), message, line=line, source=source)
