"""Small statistics of the study: Student-t confidence intervals (per arm and paired by seed), Spearman's rho.

No SciPy: the two-sided 95 % quantiles of Student's t for the degrees of freedom a study has (2-30 seeds)
are tabulated (`T_975`, from standard tables); beyond them the normal's 1.96 would be too narrow for small
samples, so df > 30 takes 2.042 (df = 30), which is conservative.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

#: Two-sided 95 % quantiles of Student's t by degrees of freedom.
T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
         11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093,
         20: 2.086, 21: 2.080, 22: 2.074, 23: 2.069, 24: 2.064, 25: 2.060, 26: 2.056, 27: 2.052, 28: 2.048,
         29: 2.045, 30: 2.042}


def t_975(df: int) -> float:
    return T_975.get(df, T_975[30]) if df >= 1 else math.inf


def mean_ci(values: Sequence[float]) -> dict[str, float | int | None]:
    """Mean and its 95 % confidence interval (t distribution) over independent values (e.g. seeds)."""
    n = len(values)
    if n == 0:
        return {"n": 0, "mean": None, "lo": None, "hi": None}
    mean = statistics.fmean(values)
    if n < 2:
        return {"n": 1, "mean": round(mean, 5), "lo": None, "hi": None}
    half = t_975(n - 1) * statistics.stdev(values) / math.sqrt(n)
    return {"n": n, "mean": round(mean, 5), "lo": round(mean - half, 5), "hi": round(mean + half, 5)}


def paired_ci(a: Sequence[float], b: Sequence[float]) -> dict[str, float | int | None]:
    """Mean of a - b over pairs (the same seed in both arms) with its 95 % interval; `excludes_zero` says
    whether the interval lies on one side of 0."""
    if len(a) != len(b):
        raise ValueError(f"paired samples must have the same length ({len(a)} vs {len(b)})")
    out = mean_ci([x - y for x, y in zip(a, b, strict=True)])
    lo, hi = out["lo"], out["hi"]
    return {**out, "excludes_zero": lo is not None and hi is not None and (lo > 0 or hi < 0)}


def prediction_interval(values: Sequence[float]) -> tuple[float, float]:
    """Where one more seed should land with 95 % probability: mean +- t x s x sqrt(1 + 1/n)."""
    n = len(values)
    mean = statistics.fmean(values)
    if n < 2:
        return mean, mean
    half = t_975(n - 1) * statistics.stdev(values) * math.sqrt(1 + 1 / n)
    return mean - half, mean + half


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman's rank correlation (average ranks for ties)."""
    def ranks(xs: Sequence[float]) -> list[float]:
        order = sorted(range(len(xs)), key=xs.__getitem__)
        out = [0.0] * len(xs)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
                j += 1
            for k in range(i, j + 1):
                out[order[k]] = (i + j) / 2
            i = j + 1
        return out

    ra, rb = ranks(a), ranks(b)
    ma, mb = statistics.fmean(ra), statistics.fmean(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb, strict=True))
    var = math.sqrt(sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb))
    return cov / var if var else 0.0
