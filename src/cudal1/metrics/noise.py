"""How far a speedup measured on a CPU can be trusted: the warning every CPU speedup is shown with.

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
