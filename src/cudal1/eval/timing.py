"""The statistics behind every speedup: paired samples, bucket speedups and the checks on the clocks.

The numbers come from `measure.py`: for each timed call of either model, the time its runner reports
(device events around the call with a device-wide wait inside, or a host timer on the CPU) and the time the
trusted parent saw from outside (request sent to reply received, for the call and for the preparation of
its inputs). Here they become

- the speedup: the median of every reference call's time over the median of every candidate call's (or, as
  CUDA-L1 does, the median over buckets of the two medians' ratio), and the stability (interquartile range of
  bucket speedups over their median);
- `clock_check`: the time each runner spends outside its reported span is the same for both models when
  both report honestly (they run the same harness on the same kinds of data); a candidate that forges its
  times, or works outside the span it reports (while its inputs are prepared, before or after its call),
  shows up as a larger gap, and one that skips harness steps (the cache flush in its own process, on the
  CPU) as a smaller one;
- `interference_check`: with the candidate frozen between its own requests, the only way it can slow the
  reference is device work it left running; that shows up as slower reference calls (and slower flushes)
  after the candidate's than after the reference's own;
- `stream_escape_ms`: work that ran outside the current stream (the device-wide wait counts it anyway).

Not covered here: clocks and thermal state (measured as found; compare ratios from one run).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from cudal1.core import flags as F
from cudal1.core.types import Flag, Severity, TimingStats

#: The candidate's gap may exceed the reference's by this share of the candidate's reported time...
CLOCK_REL_TOL = 0.10
#: ...or this share of the reference's own gap (harness jitter grows with the harness's work: copies of large
#: inputs and outputs)...
CLOCK_GAP_REL_TOL = 0.15
#: ...or by this many standard errors of the difference of the two median gaps...
CLOCK_SIGMAS = 6.0
#: ...and never by less than this (per device type; the floor of harness jitter, from the null tests in
#: docs/log.md; on a loaded 2-core CPU an honest pair of 8 calls differed by 143 us, so the CPU floor is 300 us).
CLOCK_MIN_TOL_MS = {"cuda": 0.015, "cpu": 0.3}
#: Every schedule times at least this many pairs, whatever the buckets and bounds: fewer cannot tell a hidden
#: cost from a burst of host noise (with 6 pairs on a loaded 2-core CPU, honest candidates were rejected 1 time
#: in 18; with 8 on a loaded host, 1 in a few hundred; docs/log.md). The default schedule has at least 21
#: (7 buckets of 3 or more calls).
CLOCK_MIN_PAIRS = 12
#: On the CPU, a candidate's own cache flushes may not take less than this share of the reference's (the same
#: work; preemption slows either, skipping makes it a few microseconds).
FLUSH_MIN_SHARE = 0.3
#: Reference calls (or flushes) after the candidate's may be this much slower than after the reference's.
INTERFERENCE_REL_TOL = 0.15
INTERFERENCE_MIN_MS = {"cuda": 0.02, "cpu": 0.5}
INTERFERENCE_MIN_SAMPLES = 8


@dataclass
class Sample:
    """One timed call."""

    ms: float  # reported by the runner, device-wide (== stream_ms on CPU)
    stream_ms: float  # current stream only
    outside_ms: float  # the parent's clock around the call request
    prepare_ms: float = 0.0  # the parent's clock around the request that prepared the call's inputs
    after: str = ""  # who made the previous request: "ref", "cand" or "" (first)
    flush_ms: float | None = None  # the flusher's own time for the flush before this call
    flush_after: str = ""  # "cand": the flush came right after the candidate's request; "ref": after the
    # reference's only (the previous call was the reference's too); "": mixed
    cpu_ms: float | None = None  # CPU time of the runner's whole sandbox during its requests (its cgroup's clock)

    @property
    def gap_ms(self) -> float:
        """Wall time outside the reported span: preparation, harness, commit, messages."""
        return self.prepare_ms + self.outside_ms - self.ms

    @property
    def cpu_gap_ms(self) -> float:
        """CPU time of the sandbox beyond the reported span: work of other threads or processes in it, which
        wall time does not show when it runs beside the harness's own."""
        return (self.cpu_ms or 0.0) - self.ms


@dataclass
class PairedSeries:
    ref: list[list[Sample]] = field(default_factory=list)  # per bucket
    cand: list[list[Sample]] = field(default_factory=list)

    def all(self, who: str) -> list[Sample]:
        return [s for b in (self.ref if who == "ref" else self.cand) for s in b]


def iterations_per_bucket(ref_ms: float, cand_ms: float, target_bucket_ms: float, lo: int, hi: int,
                          buckets: int = 1) -> int:
    """Timed calls per model per bucket so that a bucket takes about `target_bucket_ms` per model, and never
    fewer than the `CLOCK_MIN_PAIRS` the outside-clock check needs over all `buckets` (this beats `hi`)."""
    slowest = max(ref_ms, cand_ms, 1e-3)
    wanted = int(min(hi, max(lo, round(target_bucket_ms / slowest))))
    return max(wanted, -(-CLOCK_MIN_PAIRS // max(buckets, 1)))


def quantile(values: list[float], q: float) -> float:
    xs = sorted(values)
    if len(xs) == 1:
        return xs[0]
    pos = q * (len(xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def round_toward_one(speedup: float) -> float:
    """CUDA-L1's conservative rounding: two decimals, rounded toward 1 (floor above 1, ceil below)."""
    scaled = speedup * 100
    return (math.floor(scaled + 1e-9) if speedup >= 1 else math.ceil(scaled - 1e-9)) / 100


#: How a series becomes one speedup: "pooled", the median of every reference call over the median of every
#: candidate call; "buckets", the median of per-bucket ratios (CUDA-L1's). On the H200 host, 24 null
#: evaluations of 8 small tasks (calls of 0.1-0.5 ms whose times scatter by 20-33 % IQR) gave a median
#: round-to-round difference of 1.5 % pooled against 3.2 % by buckets, from the same calls (docs/log.md).
ESTIMATORS = ("pooled", "buckets")


def summarize_series(series: PairedSeries, *, stream_only: bool = False,
                     estimator: str = "pooled") -> tuple[float, float, float, float, list[float]]:
    """(ref_ms, cand_ms, speedup, stability, bucket_speedups) of a paired series, from the reported times.
    The speedup is `estimator`'s (`ESTIMATORS`); the stability is the spread of the bucket speedups either way."""
    def t(s: Sample) -> float:
        return s.stream_ms if stream_only else s.ms
    if estimator not in ESTIMATORS:
        raise ValueError(f"unknown estimator {estimator!r}: one of {', '.join(ESTIMATORS)}")
    # A bucket's time is the median of its calls: a mean let one outlier call (a context switch or a host
    # hiccup inside the event window, common when the two models run in separate processes) move a GPU
    # bucket by 30 %. Work cannot be hidden in a minority of calls: each call's inputs are new.
    bucket_speedups = []
    for ref_b, cand_b in zip(series.ref, series.cand, strict=True):
        ref_mid = statistics.median(t(s) for s in ref_b)
        cand_mid = statistics.median(t(s) for s in cand_b)
        bucket_speedups.append(ref_mid / max(cand_mid, 1e-9))
    ref_ms = statistics.median(t(s) for s in series.all("ref"))
    cand_ms = statistics.median(t(s) for s in series.all("cand"))
    median = statistics.median(bucket_speedups)
    # The pooled median uses every call at once: a bucket of 20 noisy calls has a median of its own noise,
    # and the median of 7 such ratios keeps more of it than one ratio of two 140-call medians.
    speedup = ref_ms / max(cand_ms, 1e-9) if estimator == "pooled" else median
    stability = (quantile(bucket_speedups, 0.75) - quantile(bucket_speedups, 0.25)) / max(median, 1e-9)
    return ref_ms, cand_ms, speedup, stability, bucket_speedups


def samples_record(series: PairedSeries) -> dict[str, list[list[list[float | str]]]]:
    """Every call of a series, per model and bucket: [ms, stream_ms, outside_ms, prepare_ms, after], in the
    order the calls ran (`EvalConfig.record_samples`)."""
    def row(s: Sample) -> list[float | str]:
        return [round(s.ms, 6), round(s.stream_ms, 6), round(s.outside_ms, 6), round(s.prepare_ms, 6), s.after]
    return {"ref": [[row(s) for s in b] for b in series.ref], "cand": [[row(s) for s in b] for b in series.cand]}


def stream_escape_ms(series: PairedSeries) -> tuple[float, float]:
    """Median time each model's work ran past the end of the current stream: (ref, candidate)."""
    def gap(samples: list[Sample]) -> float:
        return statistics.median(s.ms - s.stream_ms for s in samples)
    return gap(series.all("ref")), gap(series.all("cand"))


def _robust_sigma(values: list[float]) -> float:
    if len(values) < 2:
        return 0.0
    med = statistics.median(values)
    return 1.4826 * statistics.median(abs(v - med) for v in values)


def clock_gaps(series: PairedSeries, clock: str = "wall") -> tuple[float, float, float, float]:
    """(reference's median gap, candidate's median gap, median of the paired differences, its robust standard
    error), on the wall clock or the sandboxes' CPU clock. Pairs ran back to back, so what slows the host
    slows both: the paired difference is the sharp statistic."""
    ref, cand = series.all("ref"), series.all("cand")

    def gap(s: Sample) -> float:
        return s.gap_ms if clock == "wall" else s.cpu_gap_ms

    diffs = [gap(c) - gap(r) for r, c in zip(ref, cand, strict=True)]
    se = 1.2533 * _robust_sigma(diffs) / math.sqrt(max(len(diffs), 1))
    return statistics.median(map(gap, ref)), statistics.median(map(gap, cand)), statistics.median(diffs), se


def has_cpu_clock(series: PairedSeries) -> bool:
    return all(s.cpu_ms is not None for s in series.all("ref") + series.all("cand"))


def _tolerance(series: PairedSeries, ref_gap: float, se: float, device_type: str) -> float:
    cand_ms = statistics.median(s.ms for s in series.all("cand"))
    return max(CLOCK_REL_TOL * cand_ms, CLOCK_GAP_REL_TOL * abs(ref_gap), CLOCK_SIGMAS * se,
               CLOCK_MIN_TOL_MS.get(device_type, CLOCK_MIN_TOL_MS["cpu"]))


def clock_summary(series: PairedSeries, device_type: str) -> dict[str, float]:
    """The cross-check's figures (ms): both models' median gaps, the median paired difference, the tolerance
    it is held to (the same on the CPU clock where the sandboxes have one), and the flushes' medians after
    each model. Recorded with every timed result."""
    ref_gap, cand_gap, diff, se = clock_gaps(series)
    out = {"ref_gap_ms": ref_gap, "cand_gap_ms": cand_gap, "paired_diff_ms": diff,
           "tolerance_ms": _tolerance(series, ref_gap, se, device_type)}
    if has_cpu_clock(series):
        ref_cpu, cand_cpu, diff_cpu, se_cpu = clock_gaps(series, "cpu")
        out.update(ref_cpu_gap_ms=ref_cpu, cand_cpu_gap_ms=cand_cpu, cpu_paired_diff_ms=diff_cpu,
                   cpu_tolerance_ms=_tolerance(series, ref_cpu, se_cpu, device_type))
    # Where each gap lies (for the record): the preparation request, and the call request beyond its span.
    for who in ("ref", "cand"):
        samples = series.all(who)
        out[f"{who}_prepare_ms"] = statistics.median(s.prepare_ms for s in samples)
        out[f"{who}_call_gap_ms"] = statistics.median(s.outside_ms - s.ms for s in samples)
    everyone = series.all("ref") + series.all("cand")
    for who in ("ref", "cand"):
        flushes = [s.flush_ms for s in everyone if s.flush_after == who and s.flush_ms is not None]
        if flushes:
            out[f"flush_after_{who}_ms"] = statistics.median(flushes)
    # For the record (not a check, see `interference_check`): the reference's calls after each model's.
    for who in ("ref", "cand"):
        calls = [s.ms for s in series.all("ref") if s.after == who]
        if calls:
            out[f"ref_call_after_{who}_ms"] = statistics.median(calls)
    return {k: round(v, 6) for k, v in out.items()}


def clock_check(series: PairedSeries, device_type: str) -> Flag | None:
    """A flag when the candidate's time outside its reported span differs from the reference's by more than
    the stated tolerance (module docstring); None when the clocks agree.

    Only a larger gap is judged. A smaller one gains nothing: a candidate that skips harness work outside its
    span (S) and forges its reported time down (F) has a gap larger by F - S, so the forging room is S plus
    the tolerance whether or not smaller gaps are judged, and judging them only rejected honest candidates
    (on the H200 host a softmax rewrite 0.36 ms below the reference's gap; on a loaded CPU preemption moves
    milliseconds between the parts of a request). On the CPU the one harness step worth skipping, the cache
    flush, is a request of its own (`flush_check`); on a GPU the flush runs in the helper.

    One exception, for what a loaded CPU host does to honest runners: the CPU clock is not judged when the
    reference itself got less CPU time than its own span (the host took cores away during the spans, and it
    takes more from the slower model's longer spans, which makes a faster candidate look busier outside
    them)."""
    if not series.all("ref") or not series.all("cand"):
        return None
    summary = clock_summary(series, device_type)
    cand_ms = statistics.median(s.ms for s in series.all("cand"))
    cpu_judged = "cpu_paired_diff_ms" in summary and summary["ref_cpu_gap_ms"] > -summary["cpu_tolerance_ms"]
    if cpu_judged and summary["cpu_paired_diff_ms"] > summary["cpu_tolerance_ms"]:
        return Flag(F.OUTSIDE_CLOCK, Severity.ERROR,
                    f"the candidate's sandbox used more CPU time outside the span it reports than the reference's: "
                    f"{summary['cand_cpu_gap_ms'] * 1e3:.1f} us against {summary['ref_cpu_gap_ms'] * 1e3:.1f} us per call "
                    f"(tolerance {summary['cpu_tolerance_ms'] * 1e3:.1f} us; its reported time {cand_ms * 1e3:.1f} us): "
                    "work done beside its timed calls", source="runtime")
    ref_gap, cand_gap, diff, tol = (summary[k] for k in ("ref_gap_ms", "cand_gap_ms", "paired_diff_ms", "tolerance_ms"))
    if diff <= tol:
        return None
    return Flag(F.OUTSIDE_CLOCK, Severity.ERROR,
                "the candidate's process spent more time outside the span it reports than the reference (work "
                f"hidden outside its timed calls, or forged times): {cand_gap * 1e3:.1f} us against "
                f"{ref_gap * 1e3:.1f} us per call "
                f"(tolerance {tol * 1e3:.1f} us; its reported time {cand_ms * 1e3:.1f} us)", source="runtime")


def flush_check(ref_flush_ms: list[float], cand_flush_ms: list[float]) -> Flag | None:
    """On the CPU each runner evicts the caches itself before its cold calls (a flush from another process
    would not reach its core's caches): the same fixed work in both. A candidate whose flushes take a fraction
    of the reference's skipped them, to be timed on warm caches."""
    if min(len(ref_flush_ms), len(cand_flush_ms)) < CLOCK_MIN_PAIRS:
        return None
    ref, cand = statistics.median(ref_flush_ms), statistics.median(cand_flush_ms)
    if cand < FLUSH_MIN_SHARE * ref:
        return Flag(F.OUTSIDE_CLOCK, Severity.ERROR,
                    f"the candidate's cache flushes took {cand * 1e3:.0f} us against the reference's {ref * 1e3:.0f} us "
                    "(the same work): flushes skipped, calls timed on warm caches", source="runtime")
    return None


def interference_check(series: PairedSeries, device_type: str) -> Flag | None:
    """A flag when the flusher, a neutral third process with fixed work, runs slower right after the
    candidate's requests than after the reference's: device work the candidate left running (a kernel queued
    while it prepared its inputs, still busy during the flush). The reference's own calls are not the probe:
    what one context leaves in the GPU's caches and TLBs slows the next context's first kernel either way
    (seen on the H200 host: 15 % on honest candidates)."""
    everyone = series.all("ref") + series.all("cand")
    after_cand = [s.flush_ms for s in everyone if s.flush_after == "cand" and s.flush_ms is not None]
    after_ref = [s.flush_ms for s in everyone if s.flush_after == "ref" and s.flush_ms is not None]
    if min(len(after_cand), len(after_ref)) < INTERFERENCE_MIN_SAMPLES:
        return None
    slow, base = statistics.median(after_cand), statistics.median(after_ref)
    floor = INTERFERENCE_MIN_MS.get(device_type, INTERFERENCE_MIN_MS["cpu"])
    if slow > base * (1 + INTERFERENCE_REL_TOL) and slow - base > floor:
        return Flag(F.INTERFERENCE, Severity.ERROR,
                    f"cache flushes right after the candidate's requests took {slow * 1e3:.1f} us against "
                    f"{base * 1e3:.1f} us after the reference's: the candidate left work running on the device",
                    source="runtime")
    return None


def floor_check(cand_ms: float, floor_ms: float | None) -> Flag | None:
    """A flag when the candidate's median time is below the task's physical floor."""
    if floor_ms is None or floor_ms <= 0 or cand_ms >= floor_ms:
        return None
    return Flag(F.BELOW_FLOOR, Severity.ERROR,
                f"the candidate's reported time {cand_ms * 1e3:.2f} us is below the task's physical floor "
                f"{floor_ms * 1e3:.2f} us (its minimum bytes at the device's measured bandwidth)", source="runtime")


def build_stats(cold: PairedSeries, warm: PairedSeries | None, *, method: str, iters: int, round_to_one: bool,
                floor_ms: float | None = None, verified_calls: int = 0, estimator: str = "pooled") -> TimingStats:
    ref_ms, cand_ms, speedup, stability, buckets = summarize_series(cold, estimator=estimator)
    warm_values: tuple[float | None, float | None, float | None] = (None, None, None)
    if warm is not None and warm.ref:
        w_ref, w_cand, w_speedup, _, _ = summarize_series(warm, estimator=estimator)
        warm_values = (w_speedup, w_ref, w_cand)
    if round_to_one:
        speedup = round_toward_one(speedup)
        warm_values = (round_toward_one(warm_values[0]) if warm_values[0] else None, *warm_values[1:])
    return TimingStats(ref_ms=ref_ms, candidate_ms=cand_ms, speedup=speedup, stability=stability,
                       bucket_speedups=buckets, speedup_warm=warm_values[0], ref_ms_warm=warm_values[1],
                       candidate_ms_warm=warm_values[2], method=method, iterations=iters * len(buckets),
                       ref_outside_ms=statistics.median(s.prepare_ms + s.outside_ms for s in cold.all("ref")),
                       candidate_outside_ms=statistics.median(s.prepare_ms + s.outside_ms for s in cold.all("cand")),
                       floor_ms=floor_ms, verified_calls=verified_calls)
