"""The statistics behind every speedup: the time that counts, its interval, and the checks on the clocks.

The numbers come from `measure.py`. For each call of either model: the time its runner reports (device events
around the call with a device-wide wait inside, or a host timer on the CPU) and the **bracket**, the parent's
own clock from the start of the call's staging to the end of the helper's end probe (`session.Session.call`).
The bracket is trusted: the candidate's process cannot see the call's inputs before it starts, and cannot
end it before its work on the device is done. It holds the call and the harness's own cost per call, the
*overhead*, which the calibration measures in the candidate's own runner before any candidate code is there
(`Calibration`: the reference's model, as a twin, timed against the reference's runner).

- **The time that counts** (`counted_time`): the candidate's reported median, unless its brackets contradict
  it: the **bound** (a low quantile of the brackets minus the calibrated overhead) lies above the report by
  more than a slack (the statistical error of both quantiles, a floor, a share of the call). Then the time
  moves towards the bound, twice as fast as the excess grows, and is the bound itself from two slacks up
  (`counted_between`): a report the clock plainly contradicts earns no benefit of the doubt, so a report
  forged down, or work done where no clock looks, raises the time, not the speedup; a forgery that stays at
  the slack's edge gains at most the slack. A bound far above the report rejects (`timing.outside_clock`); a
  small one caps the time that counts (`timing.capped`, evidence). A second bound pairs the calls
  (`paired_overhead_bound`): the candidate's overhead against the reference's in the same pair, against the
  same difference in the calibration; what the models' own times do (a clock ramping up) cancels there, so
  its slack is the tightest. The bound that counts the most time counts.
- **The speedup**: the median of every reference call's reported time (the reference's runner is trusted)
  over the time that counts (`pooled`), or, as CUDA-L1 does, the median over buckets of the two medians'
  ratio (`buckets`). `speedup_ci`: a bootstrap interval over the calls, widened by what the calibration's
  null (the reference against its twin, in these two runners) says about the runner pair.
- `interference_check`: the helper's idle probe before a bracket waits for whatever the model that called
  just before queued and left running; after the candidate's calls it must take as long as after the
  reference's. `reference_slowed`: the reference's reported time beside the candidate against beside
  its twin (evidence: a hot GPU slows everything after a heavy kernel).
- `floor_check`: a time below the task's physical floor (its minimum bytes at the measured bandwidth).
- `flush_check` (CPU): a runner evicts its own caches before cold calls; skipping that shows.

Not covered here: clocks and thermal state (measured as found; compare ratios from one run).
"""

from __future__ import annotations

import dataclasses
import math
import random
import statistics
from dataclasses import asdict, dataclass, field

from cudal1.core import flags as F
from cudal1.core.types import Flag, TimingStats
from cudal1.eval.config import ESTIMATORS
from cudal1.eval.shared.protocol import Side

#: The bound compares this quantile of the candidate's brackets with the same quantile of its runner's calibrated
#: overheads: a preempted call only adds time, so the lower part of both distributions is the steadier (on a
#: loaded 2-core CPU the medians moved by a third of a call between series); a candidate's spread of true
#: times widens the bound's room by that spread only, and cheating on a quarter of the calls fails their
#: verification.
BOUND_QUANTILE = 0.25
#: Slack of the bound: never less than this (per device type: a host timer and a busy 2-core machine on
#: the CPU)...
SLACK_MIN_MS = {"cuda": 0.002, "cpu": 0.05}
#: ...nor than this share of the candidate's reported time...
SLACK_REL = 0.03
#: ...nor than this many standard errors of the bound.
SLACK_SIGMAS = 3.0
#: A bound above the report by more than max(this share of the report, REJECT_SLACKS x the slack) rejects, as
#: does a capped report below half of the bound less its noise (a forgery of most of a call; the slack's floor
#: is left out of this one, or a report of a third of a 0.1 ms call on a CPU would only be capped).
REJECT_REL = 0.25
REJECT_SLACKS = 4.0
#: Every schedule times at least this many pairs, whatever the buckets and bounds: fewer give the medians of
#: the bound too little to stand on (the default schedule has at least 21: 7 buckets of 3 or more calls).
CLOCK_MIN_PAIRS = 12
#: On the CPU, a candidate's own cache flushes may not take less than this share of the reference's (the same
#: work; preemption slows either, skipping makes it a few microseconds).
FLUSH_MIN_SHARE = 0.3
#: The helper's post probe after the candidate's calls may exceed that after the reference's by this much.
INTERFERENCE_MIN_US = 25.0
INTERFERENCE_REL = 0.5
INTERFERENCE_MIN_SAMPLES = 6
#: The 90th percentile's excess (work left after some calls only) must also exceed this share of the
#: candidate's own bracketed call (the parent's clock from its go to its done): what it could hide so is at
#: most this share of a tenth of its calls. An honest kernel 20x slower than its reference (calls of
#: milliseconds) raised that percentile by 73 us (192 against 119 us) on an H100 and was rejected.
INTERFERENCE_TAIL_SHARE = 0.1
#: The reference's reported time beside the candidate may exceed that beside its twin by this much.
REFERENCE_SLOWED_REL = 0.15
REFERENCE_SLOWED_MIN_MS = {"cuda": 0.005, "cpu": 0.1}
#: Bootstrap resamples of the speedup's interval (a fixed generator: the interval of the same calls repeats).
BOOTSTRAP = 300


@dataclass
class Sample:
    """One bracket, per call: its times divided by the calls it held (`calls`), the helper's and the flush's
    excepted."""

    ms: float  # reported by the runner, device-wide (== stream_ms on CPU)
    stream_ms: float  # current stream only
    bracket_ms: float  # the parent's clock: staging, the call, the end probe
    model_ms: float = 0.0  # the parent's clock from the go to the model's done
    after: str = ""  # whose call came right before, nothing else between: "ref", "cand" (`Side`) or ""
    idle_us: float | None = None  # the helper's probe before the bracket (GPU)
    flush_ms: float | None = None  # the helper's own time for the L2 flush (GPU)
    cpu_flush_ms: float | None = None  # the parent's clock around a CPU runner's own cache flush
    cpu_ms: float | None = None  # CPU time of the runner's whole sandbox during the request (its cgroup)
    call_cpu_ms: float | None = None  # the runner's own report of its process's CPU time over the call
    calls: int = 1  # calls in the bracket
    stage_ms: float | None = None  # the parent's clock from the bracket's start to the go (inputs staged, flush)
    helper_stage_us: float | None = None  # the helper's own clock over its staging (GPU)
    helper_end_us: float | None = None  # the helper's own clock over its end probe (GPU)
    gpu_ms: float | None = None  # the GPU clock: the helper's events from the gate's opening to the snapshot
    gpu_stage_ms: float | None = None  # the GPU clock: the helper's events over the staging before it
    armed: bool = True  # the GPU clock: the call was all enqueued before its gate opened

    @property
    def overhead_ms(self) -> float:
        """The bracket beyond the reported span: staging, flush, doorbells, commit, end probe."""
        return self.bracket_ms - self.ms

    @property
    def cpu_overhead_ms(self) -> float | None:
        """The sandbox's CPU time beyond the call's own, both CPU clocks (the harness's CPU cost). Taken from
        a runner's report, so used only where the runner is trusted (the twin, the reference). Against the
        call's wall time instead, a call preempted for milliseconds made it negative by as much, and the
        candidate's bound rose by that (an honest 0.13 ms call rejected on a loaded host)."""
        if self.cpu_ms is None or self.call_cpu_ms is None:
            return None
        return self.cpu_ms - self.call_cpu_ms


@dataclass
class PairedSeries:
    ref: list[list[Sample]] = field(default_factory=list)  # per bucket
    cand: list[list[Sample]] = field(default_factory=list)

    def all(self, who: str) -> list[Sample]:
        return [s for b in (self.ref if who == Side.REF else self.cand) for s in b]


def iterations_per_bucket(ref_ms: float, cand_ms: float, target_bucket_ms: float, lo: int, hi: int,
                          buckets: int = 1) -> int:
    """Timed calls per model per bucket so that a bucket takes about `target_bucket_ms` per model, and never
    fewer than the `CLOCK_MIN_PAIRS` the bound needs over all `buckets` (this beats `hi`)."""
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


def quantile_se(values: list[float], q: float) -> float:
    """Standard error of the `q` quantile, distribution-free: the order statistics that bracket it with 95 %
    confidence (binomial ranks q n +- 1.96 sqrt(q (1 - q) n)) span about 2 x 1.96 standard errors."""
    n = len(values)
    if n < 2:
        return 0.0
    xs = sorted(values)
    half = 1.96 * math.sqrt(q * (1 - q) * n)
    lo, hi = int(max(0, math.floor(q * n - half))), int(min(n - 1, math.ceil(q * n + half)))
    return (xs[hi] - xs[lo]) / (2 * 1.96)


def paired_quantile_diff_se(a: list[float], b: list[float], q: float, n: int = BOOTSTRAP, seed: int = 0) -> float:
    """Standard error of quantile(a, q) - quantile(b, q) where a[i] and b[i] were measured together: the
    spread of that difference over resampled pairs (a fixed generator, so the same calls give the same
    figure). A host that slows both calls of a pair moves both quantiles alike; the independent errors'
    sum of squares would count that twice."""
    k = min(len(a), len(b))
    if k < 2:
        return 0.0
    rng = random.Random(seed)
    diffs = []
    for _ in range(n):
        idx = [rng.randrange(k) for _ in range(k)]
        diffs.append(quantile([a[i] for i in idx], q) - quantile([b[i] for i in idx], q))
    return statistics.stdev(diffs)


# --------------------------------------------------------------------------- calibration


@dataclass
class Calibration:
    """The twin series (module docstring): what each runner's harness costs per call, and the null ratio of
    this runner pair (the reference against itself)."""

    ref_overhead_ms: float  # BOUND_QUANTILE of each runner's overheads per call
    cand_overhead_ms: float  # the candidate's runner, before any candidate code
    cand_overhead_se_ms: float
    ref_overhead_se_ms: float
    ref_ms: float  # the reference's median reported time beside its twin
    twin_ms: float
    null: float  # ref_ms / twin_ms
    null_ci: tuple[float, float]
    pairs: int
    # Standard error of cand_overhead_ms - ref_overhead_ms over resampled pairs: the two calls of a pair see
    # the same host, so their errors partly cancel (None: the two errors taken as independent)
    overhead_diff_se_ms: float | None = None
    # Per pair: median of (twin's overhead - reference's overhead) and its standard error: what the paired
    # bound (`paired_overhead_bound`) subtracts
    pair_overhead_diff_ms: float | None = None
    pair_overhead_diff_se_ms: float | None = None
    # The same for the CPU time of each sandbox (its cgroup) beyond the reported span, where known
    cand_cpu_overhead_ms: float | None = None
    cand_cpu_overhead_se_ms: float | None = None
    ref_cpu_overhead_ms: float | None = None
    ref_cpu_overhead_se_ms: float | None = None
    cpu_overhead_diff_se_ms: float | None = None
    calls: int = 1  # calls per bracket (the figures above are per call)

    def to_dict(self) -> dict[str, float | int | list[float] | None]:
        out = {k: (round(v, 6) if isinstance(v, float) else v) for k, v in asdict(self).items()}
        out["null_ci"] = [round(x, 6) for x in self.null_ci]
        return out


def overhead_diffs(cand: list[Sample], ref: list[Sample]) -> list[float]:
    """Per pair, the candidate's overhead (bracket less report) less the reference's in the same pair."""
    return [c.overhead_ms - r.overhead_ms for c, r in zip(cand, ref, strict=True)]


def calibrate(series: PairedSeries) -> Calibration:
    ref, twin = series.all(Side.REF), series.all(Side.CAND)
    ref_ms, twin_ms = statistics.median(s.ms for s in ref), statistics.median(s.ms for s in twin)
    null = ref_ms / max(twin_ms, 1e-9)
    lo, hi = bootstrap_ratio([s.ms for s in ref], [s.ms for s in twin])
    over, ref_over = [s.overhead_ms for s in twin], [s.overhead_ms for s in ref]
    pair_diffs = overhead_diffs(twin, ref)
    cpu = [s.cpu_overhead_ms for s in twin if s.cpu_overhead_ms is not None]
    ref_cpu = [s.cpu_overhead_ms for s in ref if s.cpu_overhead_ms is not None]
    cpu_known = len(cpu) == len(twin) and len(ref_cpu) == len(ref) and len(cpu) >= 2
    q = BOUND_QUANTILE
    return Calibration(ref_overhead_ms=quantile(ref_over, q), cand_overhead_ms=quantile(over, q),
                       cand_overhead_se_ms=quantile_se(over, q), ref_overhead_se_ms=quantile_se(ref_over, q),
                       overhead_diff_se_ms=paired_quantile_diff_se(over, ref_over, q),
                       pair_overhead_diff_ms=statistics.median(pair_diffs),
                       pair_overhead_diff_se_ms=quantile_se(pair_diffs, 0.5),
                       ref_ms=ref_ms, twin_ms=twin_ms, null=null, null_ci=(lo, hi), pairs=len(ref),
                       cand_cpu_overhead_ms=quantile(cpu, q) if cpu_known else None,
                       cand_cpu_overhead_se_ms=quantile_se(cpu, q) if cpu_known else None,
                       ref_cpu_overhead_ms=quantile(ref_cpu, q) if cpu_known else None,
                       ref_cpu_overhead_se_ms=quantile_se(ref_cpu, q) if cpu_known else None,
                       cpu_overhead_diff_se_ms=paired_quantile_diff_se(cpu, ref_cpu, q) if cpu_known else None,
                       calls=max(s.calls for s in ref))


def bootstrap_ratio(num: list[float], den: list[float], n: int = BOOTSTRAP, seed: int = 0) -> tuple[float, float]:
    """95 % percentile interval of median(num) / median(den), resampling pairs (num[i], den[i])."""
    rng = random.Random(seed)
    k = min(len(num), len(den))
    if k < 2:
        ratio = statistics.median(num) / max(statistics.median(den), 1e-9)
        return ratio, ratio
    ratios = []
    for _ in range(n):
        idx = [rng.randrange(k) for _ in range(k)]
        ratios.append(statistics.median(num[i] for i in idx) / max(statistics.median(den[i] for i in idx), 1e-9))
    return quantile(ratios, 0.025), quantile(ratios, 0.975)


# --------------------------------------------------------------------------- the time that counts


@dataclass
class Bound:
    """The candidate's time as the reported median and as the clocks outside it bound it (ms): the parent's
    wall clock around its brackets, and on the CPU its sandbox's CPU clock too; the tighter bound counts."""

    reported_ms: float
    bound_ms: float  # BOUND_QUANTILE of the brackets - that of the calibrated overheads (or the CPU clock's)
    slack_ms: float
    counted_ms: float  # the report, or towards the bound where the report lies below it (`counted_between`)
    clock: str = "wall"  # which clock gave the bound
    noise_ms: float = 0.0  # SLACK_SIGMAS standard errors of the bound: the slack without its floor
    slacks: dict[str, float] = field(default_factory=dict)  # every clock's slack (a bootstrap keeps them)

    @property
    def capped(self) -> bool:
        return self.counted_ms > self.reported_ms

    @property
    def excess_ms(self) -> float:
        """How far the bound (less its slack) lies above the report (> 0: the report was too fast)."""
        return self.bound_ms - self.slack_ms - self.reported_ms


def counted_time(samples: list[Sample], calibration: Calibration | None, device_type: str, cores: int = 1,
                 ref_samples: list[Sample] | None = None, slack_ms: dict[str, float] | None = None) -> Bound:
    """The candidate's time that counts (module docstring). `ref_samples`: the reference's calls of the same
    series. The candidate's overhead per call is taken as the reference's now plus the difference the
    calibration measured between the two runners (both honest then): what drifts over an evaluation (the
    device's clocks, the host's load) drifts for both and cancels. Without them, the calibrated overhead
    itself. `cores`: how many cores the candidate's sandbox may run on (its CPU time over that many is the
    least wall time it can have taken). `slack_ms`: the slack of each clock already known (a bootstrap's
    resamples keep the whole series', `Bound.slacks`).

    A third bound pairs the calls (`paired_overhead_bound`): it needs the reference's calls of the same
    pairs. Of the bounds, the one that counts the most time counts."""
    reported = statistics.median(s.ms for s in samples)
    if calibration is None:  # no twin series (an evaluation that times nothing untrusted): the report
        return Bound(reported, reported, 0.0, reported)
    # The floor is a bracket's (its clock's resolution and jitter), shared by the calls it holds.
    calls = max(s.calls for s in samples)
    floor = max(SLACK_MIN_MS.get(device_type, SLACK_MIN_MS["cpu"]) / calls, SLACK_REL * reported)
    q = BOUND_QUANTILE

    def bound_of(values: list[float], cand_cal: float, cand_cal_se: float, ref_cal: float | None,
                 ref_cal_se: float | None, diff_se: float | None, ref_now: list[float] | None, clock: str,
                 share: int) -> Bound:
        if ref_now and ref_cal is not None:
            overhead = quantile(ref_now, q) + (cand_cal - ref_cal)
            if diff_se is None:
                diff_se = math.hypot(cand_cal_se, ref_cal_se or 0.0)
            overhead_se = math.hypot(quantile_se(ref_now, q), diff_se)
        else:
            overhead, overhead_se = cand_cal, cand_cal_se
        bound = (quantile(values, q) - overhead) / share
        if slack_ms is not None and clock in slack_ms:
            return Bound(reported, bound, slack_ms[clock], 0.0, clock=clock, noise_ms=slack_ms[clock])
        noise = SLACK_SIGMAS * math.hypot(quantile_se(values, q), overhead_se) / share
        return Bound(reported, bound, max(floor, noise), 0.0, clock=clock, noise_ms=noise)

    refs = ref_samples or []
    best = bound_of([s.bracket_ms for s in samples], calibration.cand_overhead_ms, calibration.cand_overhead_se_ms,
                    calibration.ref_overhead_ms, calibration.ref_overhead_se_ms, calibration.overhead_diff_se_ms,
                    [s.overhead_ms for s in refs], "wall", 1)
    cpu = [s.cpu_ms for s in samples if s.cpu_ms is not None]
    ref_cpu = [s.cpu_overhead_ms for s in refs if s.cpu_overhead_ms is not None]
    if device_type == "cpu" and calibration.cand_cpu_overhead_ms is not None and len(cpu) == len(samples):
        # Preemption stops a clock of CPU time, not a wall clock: on a loaded host this bound is the sharper.
        # On a GPU the runner's CPU time is its host side only (launches, a wait that may spin or sleep): an
        # honest 0.13 ms call on an H200 read 0.22 ms by it, so only the wall clock bounds there.
        by_cpu = bound_of(cpu, calibration.cand_cpu_overhead_ms, calibration.cand_cpu_overhead_se_ms or 0.0,
                          calibration.ref_cpu_overhead_ms, calibration.ref_cpu_overhead_se_ms,
                          calibration.cpu_overhead_diff_se_ms, ref_cpu if len(ref_cpu) == len(refs) else None, "cpu", max(cores, 1))
        if by_cpu.bound_ms - by_cpu.slack_ms > best.bound_ms - best.slack_ms:
            best = by_cpu
    bounds = [best]
    paired = paired_overhead_bound(samples, refs, calibration, reported, floor, slack_ms)
    if paired is not None:
        bounds.append(paired)
    for b in bounds:
        b.counted_ms = counted_between(reported, b.bound_ms, b.slack_ms)
    chosen = max(bounds, key=lambda b: b.counted_ms)
    chosen.slacks = {b.clock: b.slack_ms for b in bounds}
    return chosen


def paired_overhead_bound(samples: list[Sample], refs: list[Sample], calibration: Calibration, reported: float,
                          floor: float, slack_ms: dict[str, float] | None = None) -> Bound | None:
    """The report plus what the pairs say it hides: per pair, the candidate's overhead (bracket - report) less
    the reference's in the same pair; their median less the calibration's median per-pair difference (both
    runners honest then) is the time per call the candidate's brackets hold beyond its reports and its
    harness. Overheads do not scatter with the models' own times (a clock ramping up, a slow call: both the
    bracket and an honest report see it), and a host moment shared by both calls of a pair cancels, so this
    bound's slack (3 standard errors of both medians) is the tightest; None without paired reference calls."""
    if calibration.pair_overhead_diff_ms is None or len(refs) != len(samples) or len(samples) < CLOCK_MIN_PAIRS:
        return None
    excess = overhead_diffs(samples, refs)
    hidden = statistics.median(excess) - calibration.pair_overhead_diff_ms
    clock = "paired wall"
    if slack_ms is not None and clock in slack_ms:
        noise = slack_ms[clock]
        return Bound(reported, reported + hidden, noise, 0.0, clock=clock, noise_ms=noise)
    noise = SLACK_SIGMAS * math.hypot(quantile_se(excess, 0.5), calibration.pair_overhead_diff_se_ms or 0.0)
    return Bound(reported, reported + hidden, max(floor, noise), 0.0, clock=clock, noise_ms=noise)


def counted_between(reported: float, bound: float, slack: float) -> float:
    """The time that counts for a report and the clock's bound: the report while the bound lies within the
    slack above it; beyond, the report plus twice the excess over the slack, up to the bound itself (reached
    two slacks above the report). Continuous, so an honest report at the edge loses nothing to a jump, and a
    forgery keeps at most the slack (at the edge), nothing once it hides two slacks or more."""
    excess = bound - reported
    if excess <= slack:
        return reported
    return min(bound, reported + 2.0 * (excess - slack))


def bound_flags(bound: Bound) -> list[Flag]:
    """`timing.outside_clock` (rejects) for a report far below what the clock allows; `timing.capped`
    (evidence) for one a little below, whose time that counts moves towards the bound (`counted_between`)."""
    if not bound.capped:
        return []
    detail = (f"the candidate reported {bound.reported_ms * 1e3:.1f} us per call; the {bound.clock} clock allows no "
              f"less than {(bound.bound_ms - bound.slack_ms) * 1e3:.1f} us (bound {bound.bound_ms * 1e3:.1f} us, "
              f"slack {bound.slack_ms * 1e3:.1f} us)")
    if bound.excess_ms > max(REJECT_REL * bound.reported_ms, REJECT_SLACKS * bound.slack_ms) \
            or bound.bound_ms - bound.noise_ms > 2 * bound.reported_ms:
        return [F.runtime_flag(F.OUTSIDE_CLOCK, "the time the candidate's process reports disagrees with the "
                     f"clock outside it (forged times, or work where no clock looks): {detail}", source="runtime")]
    return [F.runtime_flag(F.CAPPED, f"{detail}: {bound.counted_ms * 1e3:.1f} us counts", source="runtime")]


def summarize_series(series: PairedSeries, *, stream_only: bool = False, estimator: str = "pooled",
                     cap: float = 1.0) -> tuple[float, float, float, float, list[float]]:
    """(ref_ms, cand_ms, speedup, stability, bucket_speedups) of a paired series, from the reported times, the
    candidate's multiplied by `cap` (>= 1: the bound's correction). The speedup is `estimator`'s
    (`ESTIMATORS`); the stability is the spread of the bucket speedups either way."""
    def t(s: Sample) -> float:
        return s.stream_ms if stream_only else s.ms
    if estimator not in ESTIMATORS:
        raise ValueError(f"unknown estimator {estimator!r}: one of {', '.join(ESTIMATORS)}")
    # A bucket's time is the median of its calls: a mean let one outlier call (a context switch or a host
    # hiccup inside the event window) move a GPU bucket by 30 %. Work cannot be hidden in a minority of
    # calls: each call's inputs are new.
    bucket_speedups = []
    for ref_b, cand_b in zip(series.ref, series.cand, strict=True):
        ref_mid = statistics.median(t(s) for s in ref_b)
        cand_mid = statistics.median(t(s) for s in cand_b) * cap
        bucket_speedups.append(ref_mid / max(cand_mid, 1e-9))
    ref_ms = statistics.median(t(s) for s in series.all(Side.REF))
    cand_ms = statistics.median(t(s) for s in series.all(Side.CAND)) * cap
    median = statistics.median(bucket_speedups)
    # The pooled median uses every call at once: a bucket of 20 noisy calls has a median of its own noise,
    # and the median of 7 such ratios keeps more of it than one ratio of two 140-call medians.
    speedup = ref_ms / max(cand_ms, 1e-9) if estimator == "pooled" else median
    stability = (quantile(bucket_speedups, 0.75) - quantile(bucket_speedups, 0.25)) / max(median, 1e-9)
    return ref_ms, cand_ms, speedup, stability, bucket_speedups


def speedup_interval(series: PairedSeries, calibration: Calibration | None, device_type: str,
                     n: int = BOOTSTRAP, cores: int = 1) -> tuple[float, float]:
    """95 % bootstrap interval of the pooled speedup with its bound, resampling the pairs of each bucket."""
    rng = random.Random(1)
    pairs = [(r, c) for rb, cb in zip(series.ref, series.cand, strict=True) for r, c in zip(rb, cb, strict=False)]
    if len(pairs) < 2:
        return (0.0, math.inf)
    whole = counted_time([c for _, c in pairs], calibration, device_type, cores, [r for r, _ in pairs])
    ratios = []
    for _ in range(n):
        draw = [pairs[rng.randrange(len(pairs))] for _ in pairs]
        ref_ms = statistics.median(r.ms for r, _ in draw)
        counted = counted_time([c for _, c in draw], calibration, device_type, cores, [r for r, _ in draw],
                               slack_ms=whole.slacks).counted_ms
        ratios.append(ref_ms / max(counted, 1e-9))
    return quantile(ratios, 0.025), quantile(ratios, 0.975)


def widened(speedup: float, within: tuple[float, float], calibration: Calibration | None) -> tuple[float, float]:
    """The interval `within` (the calls' own), widened in log space by the runner pair's null: its distance
    from 1 or its own interval, whichever is wider (a pair of processes can time the same model apart)."""
    if calibration is None:
        return within
    return widened_by(speedup, within, null_spread(calibration.null, calibration.null_ci))


def null_spread(null: float, null_ci: tuple[float, float]) -> float:
    """A runner pair's null ratio as a spread in log space: its distance from 1 or half its own interval's
    width, whichever is wider."""
    lo_n, hi_n = null_ci
    return max(abs(math.log(max(null, 1e-9))), math.log(max(hi_n, 1e-9) / max(lo_n, 1e-9)) / 2)


def widened_by(speedup: float, within: tuple[float, float], spread: float) -> tuple[float, float]:
    """`within` widened in log space by `spread` (the two added in quadrature on each side)."""
    if speedup <= 0 or within[0] <= 0:
        return within
    lo = math.log(speedup / within[0])
    hi = math.log(within[1] / speedup) if math.isfinite(within[1]) else math.inf
    return speedup * math.exp(-math.hypot(lo, spread)), speedup * math.exp(math.hypot(hi, spread))


def gpu_widened(speedup: float, within: tuple[float, float], ref_ms: float, cand_ms: float,
                nulls: list[float], cand_nulls: list[float],
                twin_null: tuple[float, tuple[float, float]] | None = None) -> tuple[float, float]:
    """The GPU clock's interval: `within` (the calls' own) widened in log space by what its constants leave
    unknown, per call (the two runners' null medians apart, since which one is right for a call is not known,
    plus each median's error, against the candidate's time, and the reference's median error against its
    own), and by the runner pair's twin null where measured (`Measurement.gated_twin`), added in quadrature.
    For a call of 10 us a microsecond is 10 %; from 0.1 ms up it is under 1 %."""
    spread = null_spread(*twin_null) if twin_null is not None else 0.0
    if cand_nulls and nulls and cand_ms > 0 and ref_ms > 0:
        ref_se, cand_se = quantile_se(nulls, 0.5), quantile_se(cand_nulls, 0.5)  # the medians' errors
        gap = abs(statistics.median(nulls) - statistics.median(cand_nulls)) + ref_se + cand_se
        spread = math.hypot(spread, math.log1p(gap / cand_ms) + math.log1p(ref_se / ref_ms))
    return widened_by(speedup, within, spread) if spread > 0 else within


# --------------------------------------------------------------------------- checks


def interference_check(series: PairedSeries) -> Flag | None:
    """A flag when the helper's idle probe, run before a bracket that follows another model's call with nothing
    else between, takes longer after the candidate's calls than after the reference's: it waits for whatever
    the model that called last queued and left running on the device. In the median, by 25 us and half the
    base; in the 90th percentile, by a tenth of the candidate's own call too (`INTERFERENCE_TAIL_SHARE`)."""
    everyone = series.all(Side.REF) + series.all(Side.CAND)
    after = {who: [s.idle_us for s in everyone if s.after == who and s.idle_us is not None] for who in (Side.REF, Side.CAND)}
    if min(len(v) for v in after.values()) < INTERFERENCE_MIN_SAMPLES:
        return None
    call_us = 1e3 * statistics.median(s.model_ms * s.calls for s in series.all(Side.CAND))
    for q in (0.5, 0.9):
        slow, base = quantile(after[Side.CAND], q), quantile(after[Side.REF], q)
        tail = INTERFERENCE_TAIL_SHARE * call_us if q > 0.5 else 0.0
        if slow - base > max(INTERFERENCE_MIN_US, INTERFERENCE_REL * base, tail):
            return F.runtime_flag(F.INTERFERENCE, f"after the candidate's calls the device stayed busy: the helper's probe took {slow:.0f} us "
                        f"against {base:.0f} us after the reference's ({int(q * 100)}th percentile): work left "
                        "running on the device", source="runtime")
    return None


def reference_slowed(series: PairedSeries, calibration: Calibration | None, device_type: str) -> Flag | None:
    """Evidence when the reference ran slower beside the candidate than beside its twin (module docstring)."""
    if calibration is None or not series.all(Side.REF):
        return None
    now = statistics.median(s.ms for s in series.all(Side.REF))
    floor = REFERENCE_SLOWED_MIN_MS.get(device_type, REFERENCE_SLOWED_MIN_MS["cpu"])
    if now > calibration.ref_ms * (1 + REFERENCE_SLOWED_REL) and now - calibration.ref_ms > floor:
        return F.runtime_flag(F.REFERENCE_SLOWED, f"the reference took {now * 1e3:.1f} us per call beside the candidate against "
                    f"{calibration.ref_ms * 1e3:.1f} us beside its twin", source="runtime")
    return None


def flush_check(ref_flush_ms: list[float], cand_flush_ms: list[float]) -> Flag | None:
    """On the CPU each runner evicts the caches itself before its cold calls (a flush from another process
    would not reach its core's caches): the same fixed work in both. A candidate whose flushes take a fraction
    of the reference's skipped them, to be timed on warm caches."""
    if min(len(ref_flush_ms), len(cand_flush_ms)) < CLOCK_MIN_PAIRS:
        return None
    # The lower quartiles, like the bound's: preemption only adds time to a flush, and on a loaded 2-core host
    # the medians of an honest candidate's and the reference's flushes lay over 3x apart (a false rejection).
    ref, cand = quantile(ref_flush_ms, BOUND_QUANTILE), quantile(cand_flush_ms, BOUND_QUANTILE)
    if cand < FLUSH_MIN_SHARE * ref:
        return F.runtime_flag(F.OUTSIDE_CLOCK, f"the candidate's cache flushes took {cand * 1e3:.0f} us against the reference's {ref * 1e3:.0f} us "
                    "(the same work): flushes skipped, calls timed on warm caches", source="runtime")
    return None


def floor_check(cand_ms: float, floor_ms: float | None) -> Flag | None:
    """A flag when the candidate's time that counts is below the task's physical floor."""
    if floor_ms is None or floor_ms <= 0 or cand_ms >= floor_ms:
        return None
    return F.runtime_flag(F.BELOW_FLOOR, f"the candidate's time {cand_ms * 1e3:.2f} us is below the task's physical floor "
                f"{floor_ms * 1e3:.2f} us (its minimum bytes at the device's measured bandwidth)", source="runtime")


def stream_escape_ms(series: PairedSeries) -> tuple[float, float]:
    """Median time each model's work ran past the end of the current stream: (ref, candidate)."""
    def gap(samples: list[Sample]) -> float:
        return statistics.median(s.ms - s.stream_ms for s in samples)
    return gap(series.all(Side.REF)), gap(series.all(Side.CAND))


def clock_summary(series: PairedSeries, bound: Bound,
                  calibration: Calibration | None) -> dict[str, float | bool | str]:
    """The bound's figures and where each model's bracket went (ms), recorded with every timed result."""
    out: dict[str, float | bool | str] = {"reported_ms": bound.reported_ms, "bound_ms": bound.bound_ms,
                                          "slack_ms": bound.slack_ms, "counted_ms": bound.counted_ms,
                                          "capped": bound.capped, "bound_clock": bound.clock,
                                          "calls_per_bracket": max((s.calls for s in series.all(Side.CAND)), default=1),
                                          "slacks_ms": {k: round(v, 6) for k, v in bound.slacks.items()}}
    if calibration is not None:
        out["cand_overhead_calibrated_ms"] = calibration.cand_overhead_ms
    for who in (Side.REF, Side.CAND):
        samples = series.all(who)
        out[f"{who}_bracket_ms"] = statistics.median(s.bracket_ms for s in samples)
        out[f"{who}_overhead_ms"] = statistics.median(s.overhead_ms for s in samples)
        idles = [s.idle_us for s in samples if s.idle_us is not None]
        if idles:
            out[f"{who}_idle_probe_us"] = statistics.median(idles)
        flushes = [s.flush_ms for s in samples if s.flush_ms is not None]
        if flushes:
            out[f"{who}_flush_ms"] = statistics.median(flushes)
    return {k: (round(v, 6) if isinstance(v, float) else v) for k, v in out.items()}


def gpu_clocked(series: PairedSeries, c_ms: float, cand_c_ms: float | None = None) -> PairedSeries:
    """The series with each call's time (`ms`, `stream_ms`) made the GPU clock's: its gated bracket less the
    clock's constant (per call of a bracket), never below a nanosecond. The reference's calls take `c_ms`, the
    median of the reference runner's null brackets; the candidate's take `paid_c(c_ms, cand_c_ms)`. The
    runners' reports are dropped: nothing of theirs is read."""
    cand_c = paid_c(c_ms, cand_c_ms)

    def clocked(s: Sample, c: float) -> Sample:
        assert s.gpu_ms is not None, "a call of a gated series without its GPU time"
        t = max(s.gpu_ms - c, 1e-6)
        return dataclasses.replace(s, ms=t, stream_ms=t)
    return PairedSeries(ref=[[clocked(s, c_ms) for s in b] for b in series.ref],
                        cand=[[clocked(s, cand_c) for s in b] for b in series.cand])


def paid_c(c_ms: float, cand_c_ms: float | None) -> float:
    """The constant taken from the candidate's brackets: its own runner's null median where that is smaller
    than the reference's (the two contexts' switches can differ by a microsecond), never more. The
    candidate runs its own null calls and may make them slow; a larger constant would pay it, a smaller one
    only costs it."""
    return c_ms if cand_c_ms is None else min(c_ms, cand_c_ms)


def gpu_clock_summary(series: PairedSeries, nulls: list[float], unarmed: dict[str, int],
                      cand_nulls: list[float] | None = None) -> dict[str, object]:
    """What the GPU clock measured, for the record: its constant (the reference runner's null brackets'
    median, quartiles and count, in microseconds), the candidate runner's own (`cand_c_us`) and the one its
    calls paid (`cand_c_paid_us`), each model's staging on the device (leftover work of the model before
    delays it), and how many calls of each model waited for the device before they armed (their host work
    after that wait is inside their time)."""
    c = statistics.median(nulls)
    out: dict[str, object] = {"clock": "gpu", "c_us": round(c * 1e3, 3),
                              "c_iqr_us": round((quantile(nulls, 0.75) - quantile(nulls, 0.25)) * 1e3, 3),
                              "nulls": len(nulls), "unarmed_calls": {str(k): v for k, v in unarmed.items()}}
    if cand_nulls:
        cand_c = statistics.median(cand_nulls)
        out.update(cand_c_us=round(cand_c * 1e3, 3), cand_nulls=len(cand_nulls),
                   cand_c_iqr_us=round((quantile(cand_nulls, 0.75) - quantile(cand_nulls, 0.25)) * 1e3, 3),
                   cand_c_paid_us=round(paid_c(c, cand_c) * 1e3, 3))
    for who in (Side.REF, Side.CAND):
        stages = [s.gpu_stage_ms for s in series.all(who) if s.gpu_stage_ms is not None]
        if stages:
            out[f"{who}_gpu_stage_us"] = round(statistics.median(stages) * 1e3, 3)
    return out


def samples_record(series: PairedSeries) -> dict[str, list[list[list[float | str | None]]]]:
    """Every call of a series, per model and bucket: [ms, stream_ms, bracket_ms, model_ms, idle_us, cpu_ms,
    call_cpu_ms, after, stage_ms, helper_stage_us, helper_end_us], in the order the calls ran
    (`EvalConfig.record_samples`)."""
    def row(s: Sample) -> list[float | str | None]:
        def r6(v: float | None) -> float | None:
            return None if v is None else round(v, 6)
        return [r6(s.ms), r6(s.stream_ms), r6(s.bracket_ms), r6(s.model_ms),
                None if s.idle_us is None else round(s.idle_us, 1), r6(s.cpu_ms), r6(s.call_cpu_ms), s.after,
                r6(s.stage_ms), None if s.helper_stage_us is None else round(s.helper_stage_us, 1),
                None if s.helper_end_us is None else round(s.helper_end_us, 1)]
    return {Side.REF: [[row(s) for s in b] for b in series.ref], Side.CAND: [[row(s) for s in b] for b in series.cand]}


def build_stats(cold: PairedSeries, warm: PairedSeries | None, *, bound: Bound, method: str, iters: int,
                round_to_one: bool, floor_ms: float | None = None, verified_calls: int = 0, estimator: str = "pooled",
                interval: tuple[float, float] | None = None) -> TimingStats:
    cap = bound.counted_ms / max(bound.reported_ms, 1e-12)
    ref_ms, cand_ms, speedup, stability, buckets = summarize_series(cold, estimator=estimator, cap=cap)
    warm_values: tuple[float | None, float | None, float | None] = (None, None, None)
    if warm is not None and warm.ref:
        w_ref, w_cand, w_speedup, _, _ = summarize_series(warm, estimator=estimator, cap=cap)
        warm_values = (w_speedup, w_ref, w_cand)
    if round_to_one:
        speedup = round_toward_one(speedup)
        warm_values = (round_toward_one(warm_values[0]) if warm_values[0] else None, *warm_values[1:])
    return TimingStats(ref_ms=ref_ms, candidate_ms=cand_ms, speedup=speedup, stability=stability,
                       bucket_speedups=buckets, speedup_warm=warm_values[0], ref_ms_warm=warm_values[1],
                       candidate_ms_warm=warm_values[2], method=method, iterations=iters * len(buckets),
                       ref_outside_ms=statistics.median(s.bracket_ms for s in cold.all(Side.REF)),
                       candidate_outside_ms=statistics.median(s.bracket_ms for s in cold.all(Side.CAND)),
                       floor_ms=floor_ms, verified_calls=verified_calls,
                       speedup_ci=list(interval) if interval is not None else None)
