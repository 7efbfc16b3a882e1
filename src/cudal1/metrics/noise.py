"""How far a speedup can be trusted where its clock is weakest: the warnings shown beside such speedups.

On a CPU every speedup gets one (`cpu_noise_note`); on a GPU, those of calls under 0.1 ms timed by the GPU
clock (`small_call_note`), whose stated interval is narrower than the evaluator's precision there.

A CPU has no device clock and no private caches: other processes, frequency scaling and the OS scheduler
move a candidate's time and the reference's independently, and more between runs than within one (the
stability of one run says little about the next). The figures in the note were measured on a shared 2-core
machine (docs/log.md, 2026-12-04); remove or update them when CPU timing changes.
"""

from __future__ import annotations

from typing import Any

# Rationale: measured 2026-12-04 (docs/log.md): the 4 quickstart examples, 6 runs each on a shared 2-core
# CPU, spread (max/min - 1) of a candidate's speedup up to CPU_RUN_SPREAD; the reference timed against
# itself (`cudal1 baseline --kind eager`, the null test) as low as CPU_NULL_LOW.
CPU_RUN_SPREAD = 0.32
CPU_NULL_LOW = 0.78

# Rationale: measured on H100s (docs/log.md, 2026-12-07 and 2026-12-08): honest twins of calls of about 10 us
# timed 0.84-1.11x under the GPU clock, each with an interval of a few percent; a launch-bound twin (36
# kernels, ~91 us) 0.91x and 0.93x. From 0.1 ms up twins held 1.000 +- 0.3 %.
SMALL_CALL_MS = 0.1
SMALL_CALL_SPREAD = 0.20


def measured_on_cpu(result: Any) -> bool:
    """Whether an `EvalResult` (or its dict) was timed on a CPU."""
    if isinstance(result, dict):
        environment, protocol = result.get("environment") or {}, result.get("protocol") or {}
    else:
        environment, protocol = result.environment, result.protocol
    device = environment.get("device_type") or str(protocol.get("device", ""))
    return str(device).startswith("cpu")


def cpu_noise_note() -> str:
    """The one-line warning shown beside speedups measured on a CPU."""
    return (
        f"CPU timings are noisy: a candidate's speedup varied by up to {CPU_RUN_SPREAD:.0%} between runs "
        f"of a shared machine, the reference against itself read as low as {CPU_NULL_LOW:.2f}x. Take CPU "
        "speedups as rough; measure on a GPU for numbers you report."
    )


def small_gpu_call(result: Any) -> bool:
    """Whether an `EvalResult` (or its dict) has a speedup from the GPU clock with either model's call under
    `SMALL_CALL_MS`."""
    if isinstance(result, dict):
        protocol, timing, speedup = result.get("protocol") or {}, result.get("timing") or {}, result.get("speedup")
        times = (timing.get("ref_ms"), timing.get("candidate_ms"))
    else:
        protocol, speedup = result.protocol, result.speedup
        times = (result.timing.ref_ms, result.timing.candidate_ms) if result.timing is not None else (None, None)
    clock = protocol.get("clock") if isinstance(protocol, dict) else None
    if speedup is None or not isinstance(clock, dict) or clock.get("clock") != "gpu":
        return False
    return any(t is not None and t < SMALL_CALL_MS for t in times)


def small_call_note(count: int, total: int) -> str:
    """The warning beside GPU-clock speedups of calls under `SMALL_CALL_MS` (`count` of `total` results)."""
    which = "the result" if total == 1 else f"{count} of {total} results"
    return (
        f"Calls under {SMALL_CALL_MS:g} ms ({which}): there the GPU clock's interval is narrower than its "
        f"precision (honest twins read 0.84-1.11x). Take such speedups as +-{SMALL_CALL_SPREAD:.0%}, and those of "
        "launch-bound calls (many small kernels) as possibly 5-10 % low (docs/sandbox.md)."
    )
