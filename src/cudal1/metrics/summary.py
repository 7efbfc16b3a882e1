"""Speedup statistics in the format of the CUDA-L1 paper, plus KernelBench's fast_p and the geometric mean.

`summarize` turns one list of per-task speedups (None for a task without a correct candidate) into a
`SpeedupSummary`. Conventions, and why:

- *Mean, median, max, p25, p75* follow CUDA-L1: a task without a correct, measured candidate counts as
  1.0x (`failures_as=1.0`, the default), i.e. the reference is kept. Evidence: the CUDA-L1 H100 release
  has 227 scored tasks of 250; averaging the 227 gives 4.14x / 1.36x, while counting the 23 unscored
  tasks as 1.0 gives 3.855x / 1.3165x, which is the paper's reported 3.85x / 1.32x. Pass
  `failures_as=None` to average over the successful tasks only, or `0.0` for the reward convention.
- *Success* is the number of correct tasks; *> 1.01x* counts correct tasks faster than 1.01x (a failure
  never counts, whatever `failures_as` is).
- *fast_p* follows KernelBench: the fraction of ALL tasks (`n_total`) that are correct AND have a speedup
  strictly greater than p; so fast_0 is the correctness rate.
- *Geomean* is over the successful speedups only (a failure has no finite log).
- Percentiles interpolate linearly between order statistics (numpy's default method).

Limits: speedups must be finite and > 0 (use None for a failure, not 0 or -1).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

#: KernelBench's fast_p thresholds (design section 7).
FAST_P_THRESHOLDS: tuple[float, ...] = (0.0, 0.5, 0.8, 1.0, 1.5, 2.0)

#: A task counts as "faster" above this speedup; the paper's margin for timing noise.
SPEEDUP_MARGIN = 1.01


@dataclass(frozen=True)
class SpeedupSummary:
    """Statistics of one set of per-task speedups. Numbers are None when there is nothing to average."""

    n_total: int = field(metadata={"help": "tasks in the set, failures included"})
    success: int = field(metadata={"help": "tasks with a correct, measured speedup"})
    failures_as: float | None = field(
        metadata={"help": "value a failure took in mean/median/...; None: excluded"})
    mean: float | None = None
    median: float | None = None
    max: float | None = None
    p25: float | None = None
    p75: float | None = None
    geomean: float | None = field(default=None, metadata={"help": "over successful speedups only"})
    count_above_1_01: int = field(default=0, metadata={"help": "correct tasks with speedup > 1.01"})
    fast_p: dict[float, float | None] = field(default_factory=dict,
                                              metadata={"help": "p -> fraction of all tasks correct and > p"})

    @property
    def success_rate(self) -> float | None:
        """Fraction of all tasks that are correct (None for an empty set)."""
        return self.success / self.n_total if self.n_total else None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict; fast_p keys become strings such as `"fast_1.5"`."""
        out: dict[str, Any] = {
            "n_total": self.n_total, "success": self.success, "failures_as": self.failures_as,
            "mean": self.mean, "median": self.median, "max": self.max, "p25": self.p25, "p75": self.p75,
            "geomean": self.geomean, "count_above_1_01": self.count_above_1_01,
        }
        out.update({fast_p_name(p): v for p, v in self.fast_p.items()})
        return out


def fast_p_name(p: float) -> str:
    """Column name of a fast_p threshold: 0 -> `fast_0`, 1.5 -> `fast_1.5`."""
    return f"fast_{p:g}"


def _check_speedup(value: float, index: int) -> float:
    value = float(value)
    if not math.isfinite(value) or value <= 0.0:
        raise ValueError(f"speedup #{index} is {value}: speedups must be finite and > 0; "
                         "use None for a failure")
    return value


def summarize(values: Sequence[float | None], *, n_total: int | None = None,
              failures_as: float | None = 1.0,
              thresholds: Sequence[float] = FAST_P_THRESHOLDS) -> SpeedupSummary:
    """Summarize per-task speedups in the paper's format (see the module docstring for the conventions).

    Args:
        values: one speedup per task; None marks a task without a correct, measured candidate.
        n_total: number of tasks in the set; tasks beyond `len(values)` count as failures (for example
            tasks that were never evaluated). Defaults to `len(values)`.
        failures_as: value a failure takes in mean/median/max/p25/p75. 1.0 (default) reproduces CUDA-L1's
            reported numbers; None averages over successes only; 0.0 is the reward convention.
        thresholds: the p values of fast_p.

    Returns:
        A `SpeedupSummary`; an empty set gives None numbers rather than raising.
    """
    total = len(values) if n_total is None else int(n_total)
    if total < len(values):
        raise ValueError(f"n_total={total} is smaller than the {len(values)} values given")
    ok = [_check_speedup(v, i) for i, v in enumerate(values) if v is not None]
    n_fail = total - len(ok)
    population = ok + ([float(failures_as)] * n_fail if failures_as is not None else [])
    fast = {float(p): (sum(v > p for v in ok) / total if total else None) for p in thresholds}
    stats: dict[str, float | None] = dict.fromkeys(("mean", "median", "max", "p25", "p75"))
    if population:
        arr = np.asarray(population, dtype=np.float64)
        p25, median, p75 = np.percentile(arr, [25.0, 50.0, 75.0])
        stats = {"mean": float(arr.mean()), "median": float(median), "max": float(arr.max()),
                 "p25": float(p25), "p75": float(p75)}
    geomean = float(np.exp(np.mean(np.log(np.asarray(ok, dtype=np.float64))))) if ok else None
    return SpeedupSummary(
        n_total=total, success=len(ok), failures_as=failures_as, geomean=geomean,
        count_above_1_01=sum(v > SPEEDUP_MARGIN for v in ok), fast_p=fast, **stats,
    )
