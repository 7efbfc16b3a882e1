"""Verdict -> reward and reward smoothing (cudal1.core.rewards), shared by the trainer and the TRL/verl adapters."""

from __future__ import annotations

import math

import pytest

from cudal1.core.rewards import (
    CORRECT_UNMEASURED,
    failure_reward,
    reward_of,
    smooth_rewards,
    transform_reward,
)
from cudal1.core.types import EvalResult, Flag, Severity, Status, TimingStats

FAILURES = [s for s in Status if s is not Status.CORRECT]


def correct(speedup: float | None) -> EvalResult:
    return EvalResult(status=Status.CORRECT, speedup=speedup)


def test_a_correct_result_earns_its_finite_positive_speedup():
    assert reward_of(correct(2.5)) == 2.5
    assert reward_of(correct(0.25), {Status.INCORRECT: -1.0}) == 0.25
    assert isinstance(reward_of(correct(3)), float)


def _with_interval(speedup: float, ci: list[float] | None) -> EvalResult:
    timing = TimingStats(ref_ms=1.0, candidate_ms=1.0 / speedup, speedup=speedup, stability=0.01,
                         bucket_speedups=[speedup], speedup_ci=ci)
    return EvalResult(status=Status.CORRECT, speedup=speedup, timing=timing)


def test_the_lower_estimate_pays_the_low_end_of_the_speedups_interval():
    """A 1.3x whose interval reaches down to 0.95x earns 0.95 under `lower`, 1.3 under `point`; without an
    interval (or a broken one) the point counts; an interval above the point never raises it."""
    noisy = _with_interval(1.3, [0.95, 1.6])
    assert reward_of(noisy) == 1.3 and reward_of(noisy, estimate="lower") == 0.95
    assert reward_of(_with_interval(1.3, None), estimate="lower") == 1.3
    assert reward_of(_with_interval(1.3, [math.nan, 1.5]), estimate="lower") == 1.3
    assert reward_of(_with_interval(1.3, [1.4, 1.5]), estimate="lower") == 1.3
    assert reward_of(EvalResult(status=Status.INCORRECT), {Status.INCORRECT: -1.0}, estimate="lower") == -1.0
    with pytest.raises(ValueError, match="point, lower"):
        reward_of(noisy, estimate="upper")


@pytest.mark.parametrize("speedup", [math.inf, -math.inf, math.nan, None, 0.0, -1.0])
def test_a_correct_result_without_a_usable_speedup_earns_the_unmeasured_value(speedup):
    assert reward_of(correct(speedup)) == 0.0
    assert reward_of(correct(speedup), {CORRECT_UNMEASURED: -0.25}) == -0.25
    # The value of CORRECT itself is never consulted: the key is CORRECT_UNMEASURED.
    assert reward_of(correct(speedup), {Status.CORRECT: 5.0, "correct": 5.0}) == 0.0


@pytest.mark.parametrize("status", FAILURES, ids=lambda s: s.value)
def test_each_failure_status_earns_its_configured_value_default_zero(status):
    result = EvalResult(status=status, speedup=4.0)  # a failure's speedup is never a reward
    assert reward_of(result) == 0.0
    assert reward_of(result, {}) == 0.0
    assert reward_of(result, {status: -1.5}) == -1.5
    assert reward_of(result, {status.value: -2.0}) == -2.0
    others = {s: 9.0 for s in FAILURES if s is not status}
    assert reward_of(result, others) == 0.0


def test_both_table_key_styles_and_none_values():
    by_status = {Status.HACK_DETECTED: -1.0, Status.UNPARSEABLE: None}
    by_string = {"hack_detected": -1.0, "unparseable": None, "incorrect": -0.5}
    for table in (by_status, by_string):
        assert reward_of(EvalResult(status=Status.HACK_DETECTED), table) == -1.0
        assert reward_of(EvalResult(status=Status.UNPARSEABLE), table) is None  # TRL: ignore the sample
        assert reward_of(EvalResult(status=Status.TIMEOUT), table) == 0.0
        assert failure_reward(Status.HACK_DETECTED, table) == -1.0
        assert failure_reward("hack_detected", table) == -1.0
    assert reward_of(EvalResult(status=Status.INCORRECT), by_string) == -0.5
    assert reward_of(EvalResult(status=Status.TIMEOUT), {Status.INCORRECT: -1.0, "timeout": -3.0}) == -3.0  # mixed
    assert failure_reward("not_a_status", {"not_a_status": 7}) == 7.0


def test_smoothing_over_the_batch_normalizes_then_clips():
    out = smooth_rewards([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 100.0], clip_k=1.5)
    assert out[-1] == 1.5 and all(math.isclose(v, out[0]) for v in out[:-1]) and out[0] < 0
    assert smooth_rewards([2.0, 2.0, 2.0]) == [0.0, 0.0, 0.0]
    assert smooth_rewards([1.0, 3.0], clip_k=10) == pytest.approx([-1.0, 1.0], abs=1e-5)
    assert smooth_rewards([1.0, 3.0, 10.0, 10.0], clip_k=10) == pytest.approx(
        [-1.2309, -0.7385, 0.9847, 0.9847], abs=1e-3)  # one mean and std over all four
    assert smooth_rewards([5.0, -5.0], normalize=False, clip_k=1.5) == [1.5, -1.5]  # asked for: clipped
    assert smooth_rewards([5.0, -5.0], normalize=False, clip_k=None) == [5.0, -5.0]
    assert smooth_rewards([]) == []


def test_reward_transforms_speedup_log_and_bounded():
    assert transform_reward(3.7) == 3.7
    assert transform_reward(4.0, "log") == pytest.approx(math.log(4.0))
    assert transform_reward(0.0, "log") == pytest.approx(math.log(0.1))  # a failure, below any 0.1x candidate
    assert transform_reward(-1.0, "log", floor=0.5) == pytest.approx(math.log(0.5))
    assert transform_reward(50.0, "bounded") == 3.0 and transform_reward(2.5, "bounded") == 2.5
    assert transform_reward(-1.0, "bounded", bound=5.0) == 0.0
    with pytest.raises(ValueError, match="unknown reward transform"):
        transform_reward(1.0, "sqrt")


def test_smoothing_by_group_normalizes_each_group_on_its_own():
    grouped = smooth_rewards([1.0, 3.0, 10.0, 10.0], group_size=2, clip_k=10)
    assert grouped == pytest.approx([-1.0, 1.0, 0.0, 0.0], abs=1e-5)
    shifted = smooth_rewards([1.0, 3.0, 101.0, 103.0], group_size=2, clip_k=10)
    assert shifted == pytest.approx([-1.0, 1.0, -1.0, 1.0], abs=1e-5)  # a group's offset does not matter
    assert smooth_rewards([1.0, 3.0], group_size=1, clip_k=10) == pytest.approx([-1.0, 1.0], abs=1e-5)  # 1: batch
    assert smooth_rewards([1.0, 3.0, 5.0], group_size=2, clip_k=10) == pytest.approx([-1.0, 1.0, 0.0], abs=1e-5)


def test_a_policy_violation_earns_what_the_policy_says():
    violation = EvalResult(status=Status.HACK_DETECTED, protocol={"policy": "kernelgym", "policy_violation_reward": -1.0},
                           flags=[Flag("policy.decoy_kernel", Severity.ERROR, "decoy", source="policy")])
    assert reward_of(violation) == -1.0
    other_hack = EvalResult(status=Status.HACK_DETECTED, protocol={"policy_violation_reward": -1.0},
                            flags=[Flag("guard.threads", Severity.ERROR, "threads", source="runtime")])
    assert reward_of(other_hack, {"hack_detected": -0.25}) == -0.25


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), "fast"])
def test_no_nan_or_inf_is_ever_paid_or_smoothed(bad):
    from cudal1.core.rewards import check_failure_rewards

    with pytest.raises(ValueError, match="reward"):
        smooth_rewards([1.0, bad, 2.0])
    with pytest.raises(ValueError, match="raw reward"):
        transform_reward(bad, "log")
    with pytest.raises(ValueError, match="failure reward of incorrect"):
        check_failure_rewards({"incorrect": bad})
    with pytest.raises(ValueError, match="failure reward"):
        failure_reward(Status.INCORRECT, {Status.INCORRECT: bad})
    violated = EvalResult(status=Status.HACK_DETECTED, flags=[Flag("x", Severity.ERROR, "", source="policy")],
                          protocol={"policy_violation_reward": bad})
    with pytest.raises(ValueError, match="violation reward"):
        reward_of(violated)
    assert reward_of(correct(float("nan"))) == 0.0  # a broken speedup is `correct_unmeasured`, never NaN


def test_the_dead_band_keeps_noise_from_being_standardised_into_full_advantages():
    """A group of correct candidates within 3 % of each other (timing noise) standardises to +-1 (clip or not);
    with a dead band of 5 % of the mean it gets values a fraction of that, while a group with real
    differences is normalized as before."""
    ties = [1.00, 1.01, 1.02, 1.03, 0.99, 1.00, 1.02, 1.01]
    plain = smooth_rewards(ties, clip_k=1.5)
    banded = smooth_rewards(ties, clip_k=1.5, noise_floor=0.05)
    assert max(abs(v) for v in plain) > 1.4 and max(abs(v) for v in banded) < 0.45
    assert [a > 0 for a in plain] == [b > 0 for b in banded]  # the order is kept, only the size shrinks
    real = [0.0, 1.0, 2.0, 3.0]
    assert smooth_rewards(real, noise_floor=0.05) == pytest.approx(smooth_rewards(real))
    logs = [math.log(v) for v in ties]  # log rewards: the floor is absolute (their differences are relative)
    assert max(abs(v) for v in smooth_rewards(logs, noise_floor=0.05, floor_scale="one")) < 0.45
    with pytest.raises(ValueError, match="floor_scale"):
        smooth_rewards(ties, noise_floor=0.05, floor_scale="max")
