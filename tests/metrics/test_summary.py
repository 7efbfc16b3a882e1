"""Tests of cudal1.metrics.summary: the paper's statistics, fast_p and geomean on hand-computed lists."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from cudal1.metrics.summary import FAST_P_THRESHOLDS, fast_p_name, summarize

CUDA_L1_H100 = Path(__file__).resolve().parents[3] / "shared" / "data" / "cuda-l1" / "h100.jsonl"

KNOWN = [0.5, 1.0, 2.0, 4.0, None]


def test_known_list_failures_as_one_is_the_default():
    s = summarize(KNOWN, n_total=5)
    assert s.failures_as == 1.0
    # population [0.5, 1, 1, 2, 4]
    assert s.mean == pytest.approx(8.5 / 5)
    assert s.median == pytest.approx(1.0)
    assert s.p25 == pytest.approx(1.0)
    assert s.p75 == pytest.approx(2.0)
    assert s.max == pytest.approx(4.0)
    assert s.n_total == 5 and s.success == 4
    assert s.success_rate == pytest.approx(0.8)
    assert s.count_above_1_01 == 2
    assert s.geomean == pytest.approx(math.sqrt(2.0))  # (0.5*1*2*4)^(1/4) = 4^(1/4)


def test_known_list_fast_p():
    s = summarize(KNOWN, n_total=5)
    assert list(s.fast_p) == list(FAST_P_THRESHOLDS)
    expected = {0.0: 0.8, 0.5: 0.6, 0.8: 0.6, 1.0: 0.4, 1.5: 0.4, 2.0: 0.2}
    for p, v in expected.items():
        assert s.fast_p[p] == pytest.approx(v), p


def test_failures_excluded():
    s = summarize(KNOWN, failures_as=None)
    # population [0.5, 1, 2, 4]: linear interpolation at ranks 0.75, 1.5, 2.25
    assert s.mean == pytest.approx(1.875)
    assert s.median == pytest.approx(1.5)
    assert s.p25 == pytest.approx(0.875)
    assert s.p75 == pytest.approx(2.5)
    assert s.fast_p[0.0] == pytest.approx(0.8)  # fast_p still over all tasks
    assert s.geomean == pytest.approx(math.sqrt(2.0))


def test_failures_as_zero():
    s = summarize(KNOWN, failures_as=0.0)
    # population [0, 0.5, 1, 2, 4]
    assert s.mean == pytest.approx(1.5)
    assert s.median == pytest.approx(1.0)
    assert s.p25 == pytest.approx(0.5)
    assert s.p75 == pytest.approx(2.0)
    assert s.geomean == pytest.approx(math.sqrt(2.0))
    assert s.count_above_1_01 == 2


def test_n_total_adds_unevaluated_tasks_as_failures():
    s = summarize([2.0, 3.0], n_total=4)
    assert s.success == 2 and s.n_total == 4
    assert s.mean == pytest.approx(7.0 / 4)  # [1, 1, 2, 3]
    assert s.median == pytest.approx(1.5)
    assert s.fast_p[1.0] == pytest.approx(0.5)
    assert s.fast_p[2.0] == pytest.approx(0.25)  # strict: 2.0 is not > 2


def test_thresholds_are_strict():
    s = summarize([1.01, 1.0, 0.5])
    assert s.count_above_1_01 == 0
    assert s.fast_p[1.0] == pytest.approx(1 / 3)
    assert s.fast_p[0.5] == pytest.approx(2 / 3)


def test_n_total_smaller_than_values_raises():
    with pytest.raises(ValueError, match="n_total"):
        summarize([1.0, 2.0], n_total=1)


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_invalid_speedups_raise(bad):
    with pytest.raises(ValueError, match="use None for a failure"):
        summarize([1.0, bad])


def test_empty_input_gives_none_numbers():
    s = summarize([])
    assert s.n_total == 0 and s.success == 0 and s.count_above_1_01 == 0
    assert s.mean is None and s.median is None and s.max is None
    assert s.p25 is None and s.p75 is None and s.geomean is None
    assert s.success_rate is None
    assert all(v is None for v in s.fast_p.values())


def test_all_failures():
    s = summarize([None, None])
    assert s.success == 0 and s.geomean is None
    assert s.mean == pytest.approx(1.0) and s.median == pytest.approx(1.0)
    assert all(v == 0.0 for v in s.fast_p.values())
    excluded = summarize([None, None], failures_as=None)
    assert excluded.mean is None and excluded.fast_p[0.0] == 0.0


def test_percentiles_match_numpy_linear():
    rng = np.random.default_rng(0)
    vals = list(rng.lognormal(0.3, 0.8, size=37))
    s = summarize(vals)
    assert s.p25 == pytest.approx(float(np.percentile(vals, 25)))
    assert s.p75 == pytest.approx(float(np.percentile(vals, 75)))
    assert s.median == pytest.approx(float(np.median(vals)))
    assert s.geomean == pytest.approx(float(np.exp(np.mean(np.log(vals)))))


def test_to_dict_names_fast_p_columns():
    d = summarize(KNOWN).to_dict()
    assert d["fast_1.5"] == pytest.approx(0.4)
    assert d["fast_0"] == pytest.approx(0.8)
    assert d["count_above_1_01"] == 2
    assert json.loads(json.dumps(d)) == d
    assert fast_p_name(0.5) == "fast_0.5" and fast_p_name(2.0) == "fast_2"


@pytest.mark.skipif(not CUDA_L1_H100.exists(), reason="CUDA-L1 release data not present")
def test_reproduces_cuda_l1_h100_reported_numbers():
    """The paper reports 3.85x mean / 1.32x median over 250 tasks on H100; 23 tasks have no score."""
    rows = [json.loads(line) for line in CUDA_L1_H100.read_text().splitlines() if line.strip()]
    s = summarize([r.get("score_default") for r in rows])
    assert s.n_total == 250
    assert round(s.mean, 2) == 3.85
    assert round(s.median, 2) == 1.32
    only_successes = summarize([r.get("score_default") for r in rows], failures_as=None)
    assert round(only_successes.mean, 2) != 3.85
