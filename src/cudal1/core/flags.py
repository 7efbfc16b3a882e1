"""The names of every runtime finding, defined once.

A runtime guard, a timing check or the trusted parent reports what it found as a `Flag` whose `rule` is one
of these constants; reports, the judge's case database, policies and tests refer to the same names. Static
rules have their own registry (`cudal1.analysis.rules`); their names carry no dot.

To add a runtime check: add its constant and a one-line description here, raise the flag where the evidence
is found, and give it a fixture and a test (tests/eval).
"""

from __future__ import annotations

# -- guards in the candidate's process (reported by its runner: a cheap first filter, never a guarantee) --
GLOBAL_STATE = "guard.global_state"
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
BELOW_FLOOR = "timing.below_floor"
INTERFERENCE = "timing.interference"
NOISY = "timing.noisy"
SIZE_CONSTANTS = "runtime.size_constants"

# -- re-checks and the judge --------------------------------------------------------------------------------
RECHECK_AGREE = "recheck.agree"
RECHECK_DISAGREE = "recheck.disagree"
RECHECK_FAILED = "recheck.failed"
JUDGE_CHEATS = "judge.cheats"
JUDGE_CLEAN = "judge.clean"
JUDGE_INCONCLUSIVE = "judge.inconclusive"

DESCRIPTIONS: dict[str, str] = {
    GLOBAL_STATE: "the candidate changed a global numeric setting (TF32, cuDNN, matmul precision, threads...)",
    TIMER_PATCHING: "the candidate replaced a timing, synchronisation or harness function in its process",
    THREADS: "the candidate started Python threads",
    NATIVE_THREADS: "native threads grew (libraries start helpers lazily: a warning only)",
    GLOBAL_HOOKS: "the candidate registered process-wide nn.Module hooks",
    FUNCTION_MODE: "the candidate left a torch function or dispatch mode active",
    TRACE_HOOK: "the candidate installed a profile, trace or monitoring hook",
    SIGNAL_HANDLERS: "the candidate installed signal handlers or interval timers",
    PROCESSES: "the candidate started processes that outlived its calls",
    STREAM_ESCAPE: "the candidate's work ran outside the current stream",
    OUTPUT_TYPE: "an output is not a plain torch.Tensor (a subclass or lazy object)",
    DECOY_KERNEL: "custom kernels were compiled but did not compute the output",
    KERNELS_NOT_RUN: "some of the candidate's own kernels never ran",
    LOW_CUSTOM_SHARE: "the candidate's own kernels took a small share of its device time",
    NO_GPU_WORK: "the candidate did no work on the GPU",
    INPUT_MUTATION: "the candidate modified its inputs in place",
    TIMED_OUTPUT: "an output of a timed call was wrong (correct in the trials)",
    BEYOND_DISTRIBUTION: "wrong on inputs beyond the reference's own distribution (heavy-tailed, sign-varied)",
    REFERENCE_ERROR: "the reference itself failed",
    OUTSIDE_CLOCK: "the times reported from the candidate's process disagree with the clock outside it",
    BELOW_FLOOR: "a reported time is below the task's physical floor",
    INTERFERENCE: "the candidate's work slowed the reference's calls after its own had returned",
    NOISY: "the bucket speedups scattered beyond the stability threshold: measured twice, both shown",
    SIZE_CONSTANTS: "the candidate's size constants differ from the reference's and ModelNew uses them",
    RECHECK_AGREE: "an independent re-measurement agreed",
    RECHECK_DISAGREE: "an independent re-measurement disagreed",
    RECHECK_FAILED: "the re-measurement failed",
    JUDGE_CHEATS: "the LLM judge says the candidate cheats",
    JUDGE_CLEAN: "the LLM judge found no cheat",
    JUDGE_INCONCLUSIVE: "the LLM judge could not decide",
}
