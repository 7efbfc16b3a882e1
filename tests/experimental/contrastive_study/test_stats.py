"""Confidence intervals and ranks of the study (experimental.contrastive_study.stats)."""

from __future__ import annotations

import pytest

from experimental.contrastive_study.stats import (
    adjusted_ci,
    holm,
    mean_ci,
    p_value,
    paired_ci,
    prediction_interval,
    spearman,
    t_975,
    t_quantile,
    t_sf,
)


def test_mean_ci_uses_student_t():
    ci = mean_ci([1.0, 2.0, 3.0])  # mean 2, s 1, t(2) 4.303
    assert ci["mean"] == 2.0 and ci["lo"] == pytest.approx(2 - 4.303 / 3 ** 0.5, abs=1e-4)
    assert mean_ci([]) == {"n": 0, "mean": None, "lo": None, "hi": None}
    assert mean_ci([0.5])["lo"] is None


def test_paired_ci_is_over_differences_and_says_whether_it_excludes_zero():
    a = [0.80, 0.82, 0.85, 0.79, 0.81]
    assert paired_ci(a, [x - 0.05 for x in a])["excludes_zero"] is True  # a constant gap: a zero-width interval
    noisy = paired_ci([0.8, 0.7, 0.9, 0.6], [0.7, 0.8, 0.6, 0.9])
    assert noisy["excludes_zero"] is False and noisy["mean"] == pytest.approx(0.0)
    with pytest.raises(ValueError):
        paired_ci([1.0], [1.0, 2.0])


def test_prediction_interval_and_spearman():
    lo, hi = prediction_interval([0.84, 0.86, 0.88])
    assert lo == pytest.approx(0.86 - 0.0994, abs=1e-4) and hi == pytest.approx(0.86 + 0.0994, abs=1e-4)
    assert spearman([1, 2, 3, 4], [10, 20, 30, 45]) == pytest.approx(1.0)
    assert spearman([1, 1, 2], [1, 2, 3]) == pytest.approx(0.8660254, rel=1e-6)


def test_a_rerun_is_placed_against_the_committed_seeds():
    from experimental.contrastive_study.run import against

    key = "held_out_log_regret"
    committed = {"per_seed": {"grpo-plain": {s: {key: v} for s, v in enumerate([0.090, 0.092, 0.091, 0.093])}}}
    now = {"per_seed": {"grpo-plain": {0: {key: 0.0915}}, "evolution": {0: {key: 0.5}}}}
    found = against(now, committed)
    assert set(found) == {"grpo-plain"} and found["grpo-plain"]["inside"] is True
    assert found["grpo-plain"]["reproduced"] is False and found["grpo-plain"]["same_seed_committed"] == {"0": 0.090}
    now["per_seed"]["grpo-plain"][0][key] = 0.5
    assert against(now, committed)["grpo-plain"]["inside"] is False
    now["per_seed"]["grpo-plain"] = {"0": {key: 0.090}}
    assert against(now, committed)["grpo-plain"]["reproduced"] is True
    # Several arms widen each arm's interval (one level for all of them at once).
    wide = {"per_seed": {a: committed["per_seed"]["grpo-plain"] for a in ("grpo-plain", "b", "c", "d")}}
    one = against(now, committed)["grpo-plain"]["interval"]
    four = against({"per_seed": {a: now["per_seed"]["grpo-plain"] for a in wide["per_seed"]}}, wide)["grpo-plain"]["interval"]
    assert four[0] < one[0] and four[1] > one[1]


def test_t_distribution_agrees_with_the_tables_and_holm_adjusts_a_family():
    for df, t in ((2, 4.303), (9, 2.262), (30, 2.042)):
        assert t_quantile(0.05, df) == pytest.approx(t, abs=2e-3) and t_sf(t, df) == pytest.approx(0.05, abs=1e-3)
    assert t_975(60) == pytest.approx(2.000, abs=2e-3) and t_quantile(0.01, 10) == pytest.approx(3.169, abs=2e-3)
    assert p_value([0.1, 0.2, 0.3]) == pytest.approx(t_sf(0.2 / (0.1 / 3 ** 0.5), 2))
    assert holm({"a": 0.01, "b": 0.04, "c": 0.03, "d": None}) == {"a": 0.03, "c": 0.06, "b": 0.06, "d": None}
    wide, narrow = adjusted_ci([0.1, 0.2, 0.3, 0.2], 0.05 / 10), mean_ci([0.1, 0.2, 0.3, 0.2])
    assert wide["lo"] < narrow["lo"] < narrow["hi"] < wide["hi"]  # Bonferroni over 10: wider than 95 %
