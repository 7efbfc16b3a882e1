"""The statistics behind every speedup, and the checks on the clocks (cudal1.eval.clock.timing)."""

from __future__ import annotations

import dataclasses
import random

import pytest

from cudal1.core import flags as F
from cudal1.eval.clock import timing
from cudal1.eval.clock.timing import PairedSeries, Sample


def _series(ref_ms: float, cand_ms: float, overhead: float = 0.05, *, reported_cand: float | None = None,
            hidden: float = 0.0, n: int = 60, jitter: float = 0.002, seed: int = 0, idle: tuple = (20.0, 20.0),
            cpu: bool = False) -> PairedSeries:
    """Pairs of calls: the reference takes `ref_ms`, the candidate truly `cand_ms` (plus `hidden` ms of work
    where no clock looks but its bracket) and reports `reported_cand` (its true time unless forged); every
    bracket holds an `overhead` of harness and some preemption noise (positive only)."""
    rng = random.Random(seed)
    series = PairedSeries()
    reported = cand_ms if reported_cand is None else reported_cand
    for _ in range(3):
        ref_b, cand_b = [], []
        for _ in range(n // 3):
            def bracket(true_ms: float) -> float:
                return true_ms + overhead + abs(rng.gauss(0, jitter))
            # Alternating calls, each bracket's idle probe waiting for what the other model's call left.
            ref_b.append(Sample(ref_ms, ref_ms, bracket(ref_ms), after="cand", idle_us=idle[1] + rng.random(),
                                cpu_ms=ref_ms + 0.01 if cpu else None, call_cpu_ms=ref_ms if cpu else None))
            cand_b.append(Sample(reported, reported, bracket(cand_ms + hidden), after="ref",
                                 idle_us=idle[0] + rng.random(), cpu_ms=cand_ms + hidden + 0.01 if cpu else None,
                                 call_cpu_ms=reported if cpu else None))
        series.ref.append(ref_b)
        series.cand.append(cand_b)
    return series


def _calibration(overhead: float = 0.05, jitter: float = 0.002, seed: int = 1) -> timing.Calibration:
    return timing.calibrate(_series(0.1, 0.1, overhead, jitter=jitter, n=30, seed=seed))


def test_summary_is_the_median_of_bucket_ratios_with_an_iqr_stability():
    def bucket(ms):
        return [Sample(ms, ms, ms), Sample(ms, ms, ms)]  # (reported, stream, bracket)

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


def test_an_honest_candidate_keeps_its_reported_time():
    """Brackets that hold the calibrated overhead and the reported time: no cap, no flag."""
    bound = timing.counted_time(_series(0.1, 0.05).all("cand"), _calibration(), "cuda")
    assert not bound.capped and bound.counted_ms == pytest.approx(0.05)
    assert timing.bound_flags(bound) == []


@pytest.mark.parametrize("cand_ms", [0.02, 0.1, 1.0])
@pytest.mark.parametrize("forged", [0.1, 0.2, 0.4, 0.8])
def test_a_forged_report_gains_no_more_than_the_slack(cand_ms, forged):
    """Whatever share of its time a candidate hides from its report, the time that counts stays within the
    slack of its true time, and is the bound itself once the report lies two slacks below it."""
    series = _series(cand_ms, cand_ms, reported_cand=cand_ms * (1 - forged))
    bound = timing.counted_time(series.all("cand"), _calibration(), "cuda")
    assert bound.capped
    assert abs(cand_ms - bound.counted_ms) <= bound.slack_ms + 1e-9
    if bound.bound_ms - bound.reported_ms >= 2 * bound.slack_ms:
        assert bound.counted_ms == bound.bound_ms
    assert bound.slack_ms <= max(0.002, 0.03 * cand_ms) + 0.001
    rules = [f.rule for f in timing.bound_flags(bound)]
    assert rules == [F.OUTSIDE_CLOCK] if forged >= 0.8 else rules in ([F.CAPPED], [F.OUTSIDE_CLOCK]), (rules, bound)


def test_the_time_that_counts_moves_to_the_bound_without_a_jump():
    """Report 1.0, slack 0.1: the report counts up to a bound of 1.1, then twice the excess over the slack is
    added, up to the bound itself from 1.2 on. An honest report at the edge loses nothing to a jump; a forgery
    gains at most the slack (at the edge) and nothing from two slacks on."""
    counted = [timing.counted_between(1.0, b, 0.1) for b in (1.0, 1.1, 1.15, 1.2, 1.5)]
    assert counted == pytest.approx([1.0, 1.0, 1.1, 1.2, 1.5])
    gains = [b - timing.counted_between(1.0, b, 0.1) for b in [1.0 + i / 1000 for i in range(1000)]]
    assert max(gains) <= 0.1 + 1e-9 and all(g == pytest.approx(0.0, abs=1e-9) for g in gains[200:])
    edges = [timing.counted_between(1.0, 1.1 + d, 0.1) - 1.0 for d in (1e-6, 1e-4)]
    assert max(edges) < 1e-3  # continuous at the slack


def test_work_hidden_outside_the_report_is_bounded_like_a_forgery():
    """Work done in the bracket but outside the reported span (before the events, after the output): the
    bracket holds it, so it counts."""
    bound = timing.counted_time(_series(0.1, 0.05, hidden=0.05).all("cand"), _calibration(), "cuda")
    assert bound.counted_ms >= 0.1 - bound.slack_ms


def test_the_slack_grows_with_the_noise_and_never_drops_below_its_floor():
    quiet = timing.counted_time(_series(0.1, 0.1, jitter=0.0001).all("cand"), _calibration(jitter=0.0001), "cuda")
    noisy = timing.counted_time(_series(0.1, 0.1, jitter=0.05).all("cand"), _calibration(jitter=0.05), "cuda")
    assert quiet.slack_ms == pytest.approx(0.003)  # 3 % of the call
    assert noisy.slack_ms > 5 * quiet.slack_ms


def test_the_cpu_clock_bounds_where_the_wall_clock_is_noisy():
    """On a loaded CPU the brackets scatter; the sandbox's CPU clock (preemption stops it) still bounds a
    forged report."""
    series = _series(0.5, 0.5, reported_cand=0.05, jitter=2.0, cpu=True)
    calibration = timing.calibrate(_series(0.5, 0.5, jitter=2.0, n=30, cpu=True))
    bound = timing.counted_time(series.all("cand"), calibration, "cpu")
    assert bound.clock == "cpu" and bound.counted_ms >= 0.5 - bound.slack_ms
    assert [f.rule for f in timing.bound_flags(bound)] == [F.OUTSIDE_CLOCK]


def test_a_call_preempted_in_the_calibration_does_not_raise_the_cpu_clocks_bound():
    """On a loaded host a third of the twin's calibration calls are preempted for 4 ms inside their timed span:
    their reported (wall) time grows, their CPU time does not. The CPU clock's overhead comes from CPU clocks
    alone, so an honest 0.13 ms candidate is neither capped nor rejected (it was rejected: the overhead was the
    CPU time less the wall time, 4 ms below zero)."""
    calibration_series = _series(2.8, 2.8, n=30, cpu=True)
    calibration_series.cand = [[dataclasses.replace(s, ms=s.ms + 4, stream_ms=s.stream_ms + 4,
                                                    bracket_ms=s.bracket_ms + 4) if i % 3 == 0 else s
                                for i, s in enumerate(b)] for b in calibration_series.cand]
    calibration = timing.calibrate(calibration_series)
    assert calibration.cand_cpu_overhead_ms == pytest.approx(0.01, abs=1e-6)
    series = _series(2.8, 0.13, cpu=True)
    bound = timing.counted_time(series.all("cand"), calibration, "cpu", ref_samples=series.all("ref"))
    assert timing.bound_flags(bound) == [] and bound.counted_ms == pytest.approx(0.13)


def test_on_a_gpu_only_the_wall_clock_bounds():
    """A GPU runner's CPU time is its host side (launches, a spinning or sleeping wait): a CPU clock that reads
    more than the brackets must not cap an honest report there."""
    series = _series(0.1, 0.1, cpu=True)
    # the host side spun for longer than the call
    series.cand = [[dataclasses.replace(s, cpu_ms=s.cpu_ms + 0.1) for s in b] for b in series.cand]
    calibration = timing.calibrate(_series(0.1, 0.1, n=30, cpu=True))
    bound = timing.counted_time(series.all("cand"), calibration, "cuda")
    assert bound.clock == "wall" and not bound.capped


def test_without_a_calibration_the_report_counts():
    bound = timing.counted_time(_series(0.1, 0.01, reported_cand=0.001).all("cand"), None, "cuda")
    assert bound.counted_ms == 0.001 and not bound.capped


def test_the_calibration_measures_each_runners_overhead_and_the_null():
    calibration = _calibration(overhead=0.07)
    assert calibration.cand_overhead_ms == pytest.approx(0.07, abs=0.003)
    assert calibration.null == pytest.approx(1.0) and calibration.null_ci[0] <= 1.0 <= calibration.null_ci[1]


def test_the_interval_holds_the_speedup_and_widens_with_the_runner_pairs_null():
    series = _series(0.2, 0.1, jitter=0.01)
    calibration = _calibration()
    within = timing.speedup_interval(series, calibration, "cuda")
    assert within[0] <= 2.0 <= within[1]
    tilted = timing.Calibration(**{**calibration.__dict__, "null": 1.05, "null_ci": (1.0, 1.1)})
    wide = timing.widened(2.0, within, tilted)
    assert wide[0] < within[0] and wide[1] > within[1]
    assert timing.widened(2.0, within, None) == within


def test_work_left_on_the_device_after_the_candidates_calls_is_interference():
    """The helper's idle probe waits for what the model that called just before queued: after the
    candidate's calls it must take as long as after the reference's."""
    assert timing.interference_check(_series(0.1, 0.1, idle=(20.0, 24.0))) is None
    found = timing.interference_check(_series(0.1, 0.1, idle=(20.0, 900.0)))
    assert found is not None and found.rule == F.INTERFERENCE and F.always_rejects(found.rule)


def test_a_slow_probe_after_some_calls_is_interference_only_beyond_a_tenth_of_the_candidates_call():
    """Work left after a fifth of the calls raises the probe's 90th percentile by 80 us: against a 0.2 ms call
    that is hidden work, against a 2 ms call (an honest kernel far slower than its reference, whose probes
    scatter so on a GPU) it could hide under 1 %: not interference."""
    def tail_series(call_ms: float) -> PairedSeries:
        series = _series(0.1, call_ms, idle=(20.0, 20.0))
        for i, s in enumerate(series.all("ref")):
            s.after, s.idle_us = "cand", 100.0 if i % 5 == 0 else 20.0
        for s in series.all("cand"):
            s.model_ms = call_ms
        return series
    found = timing.interference_check(tail_series(0.2))
    assert found is not None and "90th percentile" in found.message
    assert timing.interference_check(tail_series(2.0)) is None
    # The median rule does not scale with the call: work left after every call is interference at any size.
    steady = _series(0.1, 2.0, idle=(20.0, 120.0))
    for s in steady.all("cand"):
        s.model_ms = 2.0
    assert timing.interference_check(steady) is not None


def test_a_reference_slowed_beside_the_candidate_is_evidence():
    calibration = _calibration()  # the reference took 0.1 ms beside its twin
    assert timing.reference_slowed(_series(0.105, 0.1), calibration, "cuda") is None
    found = timing.reference_slowed(_series(0.3, 0.1), calibration, "cuda")
    assert found is not None and found.rule == F.REFERENCE_SLOWED and not F.always_rejects(found.rule)


def test_a_time_below_the_physical_floor_is_flagged():
    assert timing.floor_check(0.001, 0.01).rule == F.BELOW_FLOOR
    assert timing.floor_check(0.02, 0.01) is None and timing.floor_check(0.001, None) is None


def test_stats_carry_the_brackets_and_the_interval():
    series = _series(0.2, 0.1)
    bound = timing.counted_time(series.all("cand"), _calibration(), "cuda")
    stats = timing.build_stats(series, None, bound=bound, method="m", iters=20, round_to_one=False,
                               interval=(1.8, 2.2))
    assert stats.speedup == pytest.approx(2.0) and stats.speedup_ci == [1.8, 2.2]
    assert stats.candidate_outside_ms > stats.candidate_ms


def test_a_capped_time_divides_every_bucket_alike():
    series = _series(0.2, 0.1, reported_cand=0.05)
    bound = timing.counted_time(series.all("cand"), _calibration(), "cuda")
    stats = timing.build_stats(series, None, bound=bound, method="m", iters=20, round_to_one=False,
                               estimator="buckets")
    assert stats.speedup == pytest.approx(0.2 / bound.counted_ms, rel=0.02)


def test_every_schedule_times_enough_pairs_for_the_bound():
    assert timing.iterations_per_bucket(50.0, 50.0, 100.0, 1, 2, buckets=7) * 7 >= timing.CLOCK_MIN_PAIRS
    assert timing.iterations_per_bucket(0.01, 0.01, 100.0, 3, 100, buckets=7) == 100


def test_skipped_cpu_cache_flushes_are_caught():
    ref = [1.0] * 20
    assert timing.flush_check(ref, [0.9] * 20) is None
    assert timing.flush_check(ref, [0.01] * 20).rule == F.OUTSIDE_CLOCK
    # Preempted reference flushes (most of them 4x longer on a loaded host) do not make an honest candidate's
    # look skipped: the lower quartiles compare the flushes' own cost.
    loaded = [1.0] * 6 + [4.0] * 14
    assert timing.flush_check(loaded, [1.0] * 20) is None
    assert timing.flush_check(loaded, [0.01] * 20).rule == F.OUTSIDE_CLOCK


def test_harness_drift_common_to_both_runners_cancels():
    """The harness cost per call grew by 0.1 ms after the calibration (the device's clocks, the host's load),
    for both runners alike: measured against the reference's cost now, an honest candidate is not capped;
    against the calibration's absolute figure it would be."""
    series = _series(0.05, 0.05, overhead=0.15)
    calibration = _calibration(overhead=0.05)
    assert not timing.counted_time(series.all("cand"), calibration, "cuda", ref_samples=series.all("ref")).capped
    assert timing.counted_time(series.all("cand"), calibration, "cuda").capped


def test_a_slow_host_moment_shared_by_both_calls_of_a_pair_narrows_the_calibrations_error():
    """The overhead difference between the runners is taken from pairs whose calls see the same host: a
    common slow-down moves both brackets of a pair and cancels in the difference, so its error is well below
    the two quantiles' errors added as if independent; with no common part the two agree."""
    rng = random.Random(3)
    shared = [rng.expovariate(1 / 0.05) for _ in range(200)]  # the host's state, the same for both calls
    a = [0.8 + s + abs(rng.gauss(0, 0.002)) for s in shared]
    b = [0.8 + s + abs(rng.gauss(0, 0.002)) for s in shared]
    independent = (timing.quantile_se(a, 0.25) ** 2 + timing.quantile_se(b, 0.25) ** 2) ** 0.5
    assert timing.paired_quantile_diff_se(a, b, 0.25) < independent / 3
    c = [0.8 + rng.expovariate(1 / 0.05) for _ in range(200)]
    d = [0.8 + rng.expovariate(1 / 0.05) for _ in range(200)]
    unpaired = (timing.quantile_se(c, 0.25) ** 2 + timing.quantile_se(d, 0.25) ** 2) ** 0.5
    assert 0.5 * unpaired < timing.paired_quantile_diff_se(c, d, 0.25) < 2 * unpaired
    assert timing.paired_quantile_diff_se(c, d, 0.25) == timing.paired_quantile_diff_se(c, d, 0.25)


def test_the_bound_uses_the_calibrations_paired_error():
    """A smaller paired error gives a smaller slack, the same bound."""
    series = _series(0.05, 0.05, jitter=0.03)
    calibration = _calibration(jitter=0.03)
    paired = timing.counted_time(series.all("cand"), calibration, "cuda", ref_samples=series.all("ref"))
    loose = dataclasses.replace(calibration, overhead_diff_se_ms=None)
    unpaired = timing.counted_time(series.all("cand"), loose, "cuda", ref_samples=series.all("ref"))
    assert paired.bound_ms == unpaired.bound_ms
    assert calibration.overhead_diff_se_ms is not None
    assert (paired.noise_ms < unpaired.noise_ms) == \
        (calibration.overhead_diff_se_ms < (calibration.cand_overhead_se_ms ** 2 + calibration.ref_overhead_se_ms ** 2) ** 0.5)


def _per_call(series: PairedSeries, calls: int) -> PairedSeries:
    """The same brackets holding `calls` calls each: per call, their times divided (`measure.sample_of`)."""
    def each(s: Sample) -> Sample:
        return dataclasses.replace(s, ms=s.ms / calls, stream_ms=s.stream_ms / calls, bracket_ms=s.bracket_ms / calls,
                                   calls=calls)
    return PairedSeries([[each(s) for s in b] for b in series.ref], [[each(s) for s in b] for b in series.cand])


def test_calls_sharing_a_bracket_share_its_slack():
    # The same brackets (16 calls of 0.0125 ms, or one of 0.2 ms) with a noisy harness: per call, the slack
    # and the room it leaves a forgery shrink with the calls, the floor too (it is the bracket's).
    noisy = dict(jitter=0.03, overhead=0.8)
    one = timing.counted_time(_series(0.2, 0.2, **noisy).all("cand"),
                              timing.calibrate(_series(0.2, 0.2, n=30, seed=1, **noisy)), "cuda")
    many = timing.counted_time(_per_call(_series(0.2, 0.2, **noisy), 16).all("cand"),
                               timing.calibrate(_per_call(_series(0.2, 0.2, n=30, seed=1, **noisy), 16)), "cuda")
    assert many.slack_ms == pytest.approx(one.slack_ms / 16, rel=1e-6)
    quiet = timing.counted_time(_per_call(_series(0.2, 0.2, jitter=0.0), 16).all("cand"),
                                timing.calibrate(_per_call(_series(0.2, 0.2, n=30, seed=1, jitter=0.0), 16)), "cpu")
    assert quiet.slack_ms == pytest.approx(max(timing.SLACK_MIN_MS["cpu"] / 16, timing.SLACK_REL * 0.2 / 16))
    assert timing.calibrate(_per_call(_series(0.1, 0.1, n=30), 4)).calls == 4


@pytest.mark.parametrize(("reference_ms", "work_ms", "limit", "calls"),
                         [(0.02, 0.5, 16, 16), (0.1, 0.5, 16, 5), (0.3, 0.5, 16, 1), (2.0, 0.5, 16, 1),
                          (0.02, 0.5, 3, 3), (0.02, 0.0, 16, 1), (0.0, 0.5, 16, 16)])
def test_calls_per_bracket_fill_the_work_within_the_limit(reference_ms, work_ms, limit, calls):
    from cudal1.eval.session import calls_per_bracket

    assert calls_per_bracket(reference_ms, work_ms, limit) == calls


def test_a_bracket_output_that_is_not_one_item_per_call_is_unreadable():
    from cudal1.eval.outcomes import Verdict
    from cudal1.eval.session import call_output

    item = {"t": "tensor", "offset": 0, "nbytes": 4, "dtype": "float32", "shape": [1], "device": "cpu", "cls": "Tensor"}
    group = {"t": "seq", "type": "list", "items": [item, item]}
    assert call_output(group, 1, 2) == item
    for bad in (item, {"t": "seq", "type": "list", "items": [item]}, {"t": "seq", "items": "x"}, None):
        with pytest.raises(Verdict, match="could not be read"):
            call_output(bad, 1, 2)


def _drifting(forged: float, n: int = 90, seed: int = 3) -> PairedSeries:
    """Pairs whose true times drift threefold over the series (a device clock ramping up), a steady harness
    cost with a little noise, and a candidate reporting (1 - forged) of its true time."""
    rng = random.Random(seed)
    series = PairedSeries()
    for b in range(3):
        ref_b, cand_b = [], []
        for i in range(n // 3):
            true = 0.15 - 0.1 * (b * n // 3 + i) / n
            ref_b.append(Sample(true, true, true + 0.8 + abs(rng.gauss(0, 0.002)), after="cand"))
            cand_b.append(Sample(true * (1 - forged), true * (1 - forged), true + 0.8 + abs(rng.gauss(0, 0.002)),
                                 after="ref"))
        series.ref.append(ref_b)
        series.cand.append(cand_b)
    return series


def test_pairs_bound_a_forgery_where_the_models_own_times_drift():
    calibration = timing.calibrate(_drifting(0.0, n=60, seed=1))
    honest = _drifting(0.0)
    forged = _drifting(0.2)
    fair = timing.counted_time(honest.all("cand"), calibration, "cuda", ref_samples=honest.all("ref"))
    assert fair.counted_ms == pytest.approx(fair.reported_ms)
    bound = timing.counted_time(forged.all("cand"), calibration, "cuda", ref_samples=forged.all("ref"))
    assert bound.clock == "paired wall" and bound.slacks["paired wall"] < bound.slacks["wall"] / 3
    # 20 % of a 0.1 ms call hidden: the time that counts is the honest one, within the paired slack.
    assert bound.counted_ms >= fair.reported_ms - bound.slack_ms
    assert timing.counted_time(forged.all("cand"), calibration, "cuda", ref_samples=forged.all("ref"),
                               slack_ms=bound.slacks).counted_ms == pytest.approx(bound.counted_ms)
