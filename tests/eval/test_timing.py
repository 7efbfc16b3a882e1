"""The statistics behind every speedup, and the checks on the clocks (cudal1.eval.timing)."""

from __future__ import annotations

import random

import pytest

from cudal1.core import flags as F
from cudal1.eval import timing
from cudal1.eval.timing import PairedSeries, Sample


def _series(ref_ms: float, cand_ms: float, ref_gap: float, cand_gap: float, n: int = 60, jitter: float = 0.002,
            seed: int = 0) -> PairedSeries:
    rng = random.Random(seed)
    series = PairedSeries()
    for _ in range(3):
        ref_b, cand_b = [], []
        for _ in range(n // 3):
            noise = rng.gauss(0, jitter)  # what slows the host slows both calls of a pair
            ref_b.append(Sample(ref_ms, ref_ms, outside_ms=ref_ms + ref_gap + noise + rng.gauss(0, jitter / 4)))
            cand_b.append(Sample(cand_ms, cand_ms, outside_ms=cand_ms + cand_gap + noise + rng.gauss(0, jitter / 4)))
        series.ref.append(ref_b)
        series.cand.append(cand_b)
    return series


def test_summary_is_the_median_of_bucket_ratios_with_an_iqr_stability():
    def bucket(ms):
        return [Sample(ms, ms, ms), Sample(ms, ms, ms)]

    series = PairedSeries(ref=[bucket(2.0), bucket(3.0), bucket(4.0), bucket(2.0)],
                          cand=[bucket(1.0), bucket(1.0), bucket(1.0), bucket(2.0)])
    ref_ms, cand_ms, speedup, stability, buckets = timing.summarize_series(series, estimator="buckets")
    assert buckets == [2.0, 3.0, 4.0, 1.0]
    assert speedup == pytest.approx(2.5)
    assert stability == pytest.approx((3.25 - 1.75) / 2.5)
    assert (ref_ms, cand_ms) == (2.5, 1.0)


def test_the_pooled_speedup_is_the_ratio_of_the_medians_of_all_calls():
    """Three buckets of noisy calls: the pooled estimate uses all of them at once, the bucket estimate the
    median of three small-sample ratios; both report the same bucket speedups and stability."""
    def buckets_of(*times):
        return [[Sample(ms, ms, ms) for ms in b] for b in times]

    series = PairedSeries(ref=buckets_of([1.0, 1.0, 3.0], [1.0, 3.0, 3.0], [2.0, 2.0, 2.0]),
                          cand=buckets_of([1.0, 1.0, 1.0], [2.0, 2.0, 2.0], [1.0, 1.0, 4.0]))
    ref_ms, cand_ms, pooled, stability, buckets = timing.summarize_series(series)
    assert buckets == [1.0, 1.5, 2.0] and (ref_ms, cand_ms) == (2.0, 1.0) and pooled == 2.0
    _, _, by_buckets, same_stability, _ = timing.summarize_series(series, estimator="buckets")
    assert by_buckets == 1.5 and same_stability == stability
    with pytest.raises(ValueError, match="unknown estimator"):
        timing.summarize_series(series, estimator="mean")


def test_one_outlier_call_does_not_move_a_bucket():
    """Identical models, one call in nine of each bucket 20x slower on the candidate's side (as a context
    switch inside the event window is): each bucket still reads 1.00x."""
    series = PairedSeries()
    for _ in range(3):
        series.ref.append([Sample(0.08, 0.08, 2.0) for _ in range(9)])
        series.cand.append([Sample(1.6 if i == 4 else 0.08, 0.08, 2.0) for i in range(9)])
    _, _, speedup, stability, buckets = timing.summarize_series(series)
    assert buckets == [1.0, 1.0, 1.0] and speedup == 1.0 and stability == 0.0


@pytest.mark.parametrize(("raw", "rounded"), [(1.756, 1.75), (0.874, 0.88), (1.0, 1.0), (2.0, 2.0)])
def test_round_toward_one(raw, rounded):
    assert timing.round_toward_one(raw) == rounded


def test_equal_harness_gaps_pass_the_clock_check():
    assert timing.clock_check(_series(0.2, 0.1, ref_gap=0.05, cand_gap=0.05), "cuda") is None


def test_forged_small_times_are_caught_by_the_outside_clock():
    """A candidate that reports 10 us for calls that take 100 us: its outside time does not shrink."""
    series = _series(0.2, 0.1, ref_gap=0.05, cand_gap=0.05)
    for b in series.cand:
        for s in b:
            s.ms = s.stream_ms = 0.01
    flag = timing.clock_check(series, "cuda")
    assert flag is not None and flag.rule == F.OUTSIDE_CLOCK and "more time outside" in flag.message


def test_work_hidden_before_the_reported_span_is_caught():
    """Preparation that computes the answer: the candidate's prepare takes 40 us longer than the reference's."""
    series = _series(0.2, 0.05, ref_gap=0.05, cand_gap=0.05)
    for b in series.cand:
        for s in b:
            s.prepare_ms = 0.04
    assert timing.clock_check(series, "cuda") is not None


def test_skipped_harness_steps_pay_for_no_more_forging_than_the_tolerance():
    """Skipping harness work (a smaller gap) is not judged: it gains nothing alone, and a forged time on top
    shows as the larger gap the check bounds."""
    assert timing.clock_check(_series(0.2, 0.1, ref_gap=0.08, cand_gap=0.01), "cuda") is None
    skipped_and_forged = _series(0.6, 0.5, ref_gap=0.08, cand_gap=0.01)
    for s in skipped_and_forged.all("cand"):  # 0.07 ms skipped, 0.3 ms forged off the reported time
        s.ms -= 0.3
        s.stream_ms -= 0.3
    assert timing.clock_check(skipped_and_forged, "cuda") is not None


def test_the_tolerance_grows_with_the_noise_not_with_a_constant():
    noisy = _series(0.2, 0.1, ref_gap=0.05, cand_gap=0.058, jitter=0.05, n=12)
    assert timing.clock_check(noisy, "cuda") is None  # 8 us inside the noise of 12 noisy pairs
    quiet = _series(0.2, 0.1, ref_gap=0.05, cand_gap=0.08, jitter=0.0005, n=300)
    assert timing.clock_check(quiet, "cuda") is not None  # 30 us out of quiet noise


def test_reference_calls_slowed_after_the_candidates_are_only_recorded():
    """A context's leftovers in caches and TLBs slow the next context's first kernel either way: no flag."""
    series = _series(0.2, 0.1, ref_gap=0.05, cand_gap=0.05)
    for i, s in enumerate(series.all("ref")):
        s.after = "cand" if i % 2 else "ref"
        if s.after == "cand":
            s.ms = 0.24
    assert timing.interference_check(series, "cuda") is None
    summary = timing.clock_summary(series, "cuda")
    assert summary["ref_call_after_cand_ms"] > summary["ref_call_after_ref_ms"]


def test_flushes_slowed_after_the_candidates_prepare_are_interference():
    series = _series(0.2, 0.1, ref_gap=0.05, cand_gap=0.05)
    for s in series.all("ref"):
        s.flush_ms, s.flush_after = 0.06, "ref"
    for s in series.all("cand"):
        s.flush_ms, s.flush_after = 0.09, "cand"  # its prepare left a kernel running during the flush
    assert timing.interference_check(series, "cuda") is not None
    for s in series.all("cand"):
        s.flush_ms = 0.0605
    assert timing.interference_check(series, "cuda") is None


def test_a_time_below_the_physical_floor_is_flagged():
    assert timing.floor_check(0.001, 0.01).rule == F.BELOW_FLOOR
    assert timing.floor_check(0.02, 0.01) is None and timing.floor_check(0.001, None) is None


def test_stats_carry_both_clocks():
    stats = timing.build_stats(_series(0.2, 0.1, 0.05, 0.05), None, method="m", iters=20, round_to_one=False,
                               floor_ms=0.01, verified_calls=7)
    assert stats.speedup == pytest.approx(2.0)
    assert stats.ref_outside_ms == pytest.approx(0.25, abs=0.01)
    assert stats.candidate_outside_ms == pytest.approx(0.15, abs=0.01)
    assert stats.floor_ms == 0.01 and stats.verified_calls == 7


def test_every_schedule_times_enough_pairs_for_the_clock_check():
    """Two pairs on a loaded host differ by milliseconds of noise; a lazy output computed outside the span
    hides in them. The schedule therefore never times fewer than CLOCK_MIN_PAIRS, whatever the bounds."""
    for buckets in (1, 2, 3, 7):
        iters = timing.iterations_per_bucket(50.0, 50.0, 5.0, lo=1, hi=2, buckets=buckets)
        assert iters * buckets >= timing.CLOCK_MIN_PAIRS
    assert timing.iterations_per_bucket(0.1, 0.1, 5.0, lo=3, hi=100, buckets=7) == 50  # the target still rules


def test_on_the_cpu_a_smaller_gap_and_a_preempted_reference_are_not_judged():
    """A loaded CPU host moves milliseconds between the parts of a request, and takes more CPU from the slower
    model's longer spans: neither may reject an honest candidate there."""
    smaller = _series(0.2, 0.1, ref_gap=0.8, cand_gap=0.1)
    assert timing.clock_check(smaller, "cpu") is None
    preempted = _series(2.0, 0.5, ref_gap=0.5, cand_gap=0.5)
    for s in preempted.all("ref"):
        s.cpu_ms = s.ms - 1.5  # the reference got 0.5 ms of CPU in a 2 ms span
    for s in preempted.all("cand"):
        s.cpu_ms = s.ms + 0.4
    assert timing.clock_check(preempted, "cpu") is None
    for s in preempted.all("ref"):
        s.cpu_ms = s.ms + 0.05  # not preempted: the candidate's 0.35 ms more CPU outside its span is hidden work
    flag = timing.clock_check(preempted, "cpu")
    assert flag is not None and "CPU time" in flag.message


def test_skipped_cpu_cache_flushes_are_caught():
    honest = [5.0 + 0.1 * i for i in range(timing.CLOCK_MIN_PAIRS)]
    assert timing.flush_check(honest, [x * 1.4 for x in honest]) is None  # preemption slows either
    flag = timing.flush_check(honest, [0.2] * len(honest))
    assert flag is not None and flag.rule == F.OUTSIDE_CLOCK and "skipped" in flag.message
    assert timing.flush_check(honest[:3], [0.2] * 3) is None  # too few to judge (never so in a schedule)
