"""Small statistics of the study: Student-t confidence intervals (per arm and paired by seed), p-values and
Holm's correction for a family of contrasts, Spearman's rho.

No SciPy: the two-sided 95 % quantiles of Student's t for 1-30 degrees of freedom are tabulated (`T_975`,
from standard tables); every other quantile and p-value comes from Student's t distribution function through
the regularized incomplete beta function (`t_sf`, a continued fraction as in Numerical Recipes, section 6.4),
inverted by bisection (`t_quantile`); it agrees with the table to 3 decimals.
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
    if df < 1:
        return math.inf
    return T_975[df] if df in T_975 else t_quantile(0.05, df)


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


def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        for aa in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-14:
            break
    return h


def _betai(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_sf(t: float, df: int) -> float:
    """P(|T| >= |t|) for Student's t with `df` degrees of freedom (a two-sided p-value)."""
    return _betai(df / 2.0, 0.5, df / (df + t * t))


def t_quantile(two_sided_alpha: float, df: int) -> float:
    """The t with P(|T| >= t) = `two_sided_alpha` (1.96-like for df large and alpha 0.05)."""
    lo, hi = 0.0, 1e3
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_sf(mid, df) > two_sided_alpha else (lo, mid)
    return (lo + hi) / 2


def p_value(values: Sequence[float]) -> float | None:
    """Two-sided one-sample t-test p-value of mean(values) = 0 (None for fewer than 2 values)."""
    n = len(values)
    if n < 2:
        return None
    sd = statistics.stdev(values)
    if sd == 0:
        return 0.0 if statistics.fmean(values) != 0 else 1.0
    return t_sf(statistics.fmean(values) / (sd / math.sqrt(n)), n - 1)


def holm(p_values: dict[str, float | None]) -> dict[str, float | None]:
    """Holm-adjusted p-values of a family (each the smallest family-wise level at which it is rejected)."""
    known = sorted(((p, k) for k, p in p_values.items() if p is not None))
    m = len(known)
    out: dict[str, float | None] = {k: None for k, p in p_values.items() if p is None}
    running = 0.0
    for i, (p, k) in enumerate(known):
        running = max(running, min(1.0, (m - i) * p))
        out[k] = round(running, 6)
    return out


def adjusted_ci(values: Sequence[float], alpha: float) -> dict[str, float | None]:
    """Mean of `values` with its two-sided (1 - alpha) t interval (e.g. alpha = 0.05 / m: Bonferroni's)."""
    n = len(values)
    if n < 2:
        return {"lo": None, "hi": None}
    mean = statistics.fmean(values)
    half = t_quantile(alpha, n - 1) * statistics.stdev(values) / math.sqrt(n)
    return {"lo": round(mean - half, 5), "hi": round(mean + half, 5)}


def prediction_interval(values: Sequence[float], alpha: float = 0.05) -> tuple[float, float]:
    """Where one more seed should land with probability 1 - alpha: mean +- t x s x sqrt(1 + 1/n)."""
    n = len(values)
    mean = statistics.fmean(values)
    if n < 2:
        return mean, mean
    t = t_975(n - 1) if alpha == 0.05 else t_quantile(alpha, n - 1)
    half = t * statistics.stdev(values) * math.sqrt(1 + 1 / n)
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
