"""Several runner pairs per evaluation (`EvalConfig.runner_pairs`): the combination's rules on made-up results,
then the real thing on the CPU (fresh runners per pair)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cudal1.core.errors import ConfigError
from cudal1.core.types import EvalResult, Flag, Severity, Status, TimingStats
from cudal1.eval import EvalConfig, evaluate_candidate
from cudal1.eval.clock.runner_pairs import combined, measured_in_pairs
from cudal1.tasks.sources import load_file

FIXTURES = Path(__file__).parents[2] / "fixtures"


def correct(speedup: float, lo: float, hi: float, *rules: str) -> EvalResult:
    timing = TimingStats(ref_ms=1.0, candidate_ms=1.0 / speedup, speedup=speedup, stability=0.0,
                         bucket_speedups=[speedup], speedup_ci=[lo, hi])
    return EvalResult(status=Status.CORRECT, speedup=speedup, timing=timing,
                      flags=[Flag(rule, Severity.INFO, "", source="runtime") for rule in rules],
                      protocol={"pair": speedup})


def test_the_median_pair_counts_and_the_interval_spans_every_pair():
    result = combined([correct(1.30, 1.25, 1.35, "a"), correct(1.10, 1.05, 1.12, "b", "b"),
                       correct(1.20, 1.18, 1.22, "a")], 3)
    assert result.speedup == 1.20 and result.timing.speedup == 1.20
    assert result.protocol["pair"] == 1.20  # the median pair's own evidence
    assert result.timing.speedup_ci == [1.05, 1.35]
    assert [r["speedup"] for r in result.protocol["runner_pairs"]] == [1.30, 1.10, 1.20]
    assert result.protocol["runner_pairs_spread"] == pytest.approx(1.30 / 1.10 - 1, abs=1e-6)
    assert sorted(f.rule for f in result.flags) == ["a", "b"]


def test_an_even_count_takes_the_lower_middle_and_the_interval_holds_every_speedup():
    result = combined([correct(2.0, 1.9, 2.1), correct(1.5, 1.6, 1.7)], 2)  # an interval that missed its own
    assert result.speedup == 1.5
    assert result.timing.speedup_ci == [1.5, 2.1]


def test_a_pair_that_is_not_correct_ends_it_with_its_verdict():
    calls = iter([correct(3.0, 2.9, 3.1), EvalResult(status=Status.INCORRECT, message="wrong in trial 2")])
    ran = []

    def run() -> EvalResult:
        ran.append(1)
        return next(calls)

    result = measured_in_pairs(run, 3)
    assert len(ran) == 2
    assert result.status is Status.INCORRECT and result.speedup is None
    assert result.message == "wrong in trial 2 (runner pair 2 of 3)"
    assert [r["status"] for r in result.protocol["runner_pairs"]] == ["correct", "incorrect"]


def test_one_pair_is_the_plain_result():
    only = correct(1.4, 1.3, 1.5)
    assert measured_in_pairs(lambda: only, 1) is only


def test_runner_pairs_below_one_is_refused():
    with pytest.raises(ConfigError, match="runner_pairs"):
        EvalConfig(runner_pairs=0)


def test_two_pairs_on_the_cpu_give_one_combined_result():
    task = load_file(FIXTURES / "tasks" / "tiny_scale_add.py")
    cfg = EvalConfig(device="cpu", sizes="full", correctness_trials=2, buckets=2, target_bucket_ms=5.0,
                     warm_buckets=0, warmup_iters=1, timeout_s=60.0, runner_pairs=2)
    result = evaluate_candidate(task, (FIXTURES / "eval" / "correct.py").read_text(), cfg)
    assert result.status is Status.CORRECT, result.message
    pairs = result.protocol["runner_pairs"]
    assert len(pairs) == 2 and result.speedup in [p["speedup"] for p in pairs]
    lo, hi = result.timing.speedup_ci
    assert all(lo <= p["speedup"] <= hi for p in pairs)
    assert result.protocol["runner_pairs_spread"] >= 0
