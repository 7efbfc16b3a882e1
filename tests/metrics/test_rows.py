"""Tests of cudal1.metrics.rows: building rows from EvalResult dicts and per-baseline speedups."""

from __future__ import annotations

import pytest

from cudal1.core.types import EvalResult, Flag, KernelClass, Severity, Status, TimingStats
from cudal1.metrics.rows import EAGER_WARM, ResultRow


def _correct_result() -> EvalResult:
    timing = TimingStats(ref_ms=2.0, candidate_ms=1.0, speedup=2.0, stability=0.01, bucket_speedups=[2.0],
                         speedup_warm=2.5)
    return EvalResult(status=Status.CORRECT, task_id="level1/3_matmul", speedup=2.0, timing=timing,
                      flags=[Flag("extra_cuda_stream", Severity.WARNING, "uses a side stream")],
                      kernel_class=KernelClass.CUSTOM_CUDA,
                      baselines={"torch_compile": 1.5, "cuda_graph": 1.2})


def test_from_eval_dict_correct():
    row = ResultRow.from_eval_dict(_correct_result().to_dict(), level=1, published={"score_default": 2.2},
                                   label="run-a")
    assert row.task_id == "level1/3_matmul"
    assert row.level == 1 and row.label == "run-a"
    assert row.status == "correct" and row.is_correct
    assert row.speedup == 2.0 and row.speedup_warm == 2.5
    assert row.ref_ms == 2.0 and row.candidate_ms == 1.0
    assert row.flags == ["extra_cuda_stream"]
    assert row.kernel_class == "custom_cuda"
    assert row.published == {"score_default": 2.2}
    assert row.speedup_vs("eager") == 2.0
    assert row.speedup_vs(EAGER_WARM) == 2.5
    assert row.speedup_vs("torch_compile") == 1.5
    assert row.speedup_vs("cudnn") is None


def test_from_eval_dict_failure_drops_speedups():
    d = _correct_result().to_dict()
    d["status"] = Status.INCORRECT.value  # a stale speedup on a wrong verdict must not leak into metrics
    row = ResultRow.from_eval_dict(d)
    assert row.status == "incorrect" and not row.is_correct
    assert row.speedup is None and row.speedup_warm is None and row.baselines == {}
    assert row.speedup_vs("eager") is None
    assert row.flags == ["extra_cuda_stream"]


def test_from_eval_dict_level_from_dict_and_sol():
    d = EvalResult(status=Status.TIMEOUT, task_id="t").to_dict()
    d.update(level=2, sol={"reference": 0.1, "candidate": 0.4})
    row = ResultRow.from_eval_dict(d)
    assert row.level == 2 and row.status == "timeout"
    assert row.sol == {"reference": 0.1, "candidate": 0.4}


def test_speedup_vs_eager_falls_back_to_baselines():
    row = ResultRow("t", status="correct", baselines={"eager": 3.0})
    assert row.speedup_vs("eager") == 3.0
    wrong = ResultRow("t", status="hack_detected", speedup=9.0)
    assert wrong.speedup_vs("eager") is None


def test_status_enum_is_normalised_and_validated():
    assert ResultRow("t", status=Status.RUNTIME_ERROR).status == "runtime_error"
    with pytest.raises(ValueError, match="status"):
        ResultRow("t", status="fast")


def test_sol_out_of_range_raises():
    with pytest.raises(ValueError, match="sol"):
        ResultRow("t", sol={"candidate": 1.5})


def test_dict_round_trip():
    row = ResultRow.from_eval_dict(_correct_result().to_dict(), level=3, published={"score_cudnn": 1.1},
                                   sol={"reference": 0.2, "candidate": 0.3})
    assert ResultRow.from_dict(row.to_dict()) == row
    assert ResultRow.from_dict({**row.to_dict(), "unknown_key": 1}) == row


@pytest.mark.parametrize("change, reason", [
    ({"speedup": float("nan")}, "a correct verdict with speedup nan"),
    ({"speedup": None}, "a correct verdict with speedup None"),
    ({"speedup": -1.0}, "a correct verdict with speedup -1.0"),
    ({"speedup_warm": float("inf")}, "speedup_warm inf"),
    ({"baselines": {"cuda_graph": float("nan")}}, "baselines.cuda_graph nan"),
    ({"status": "great"}, "status 'great' is not one of the statuses"),
])
def test_a_stored_verdict_the_metrics_cannot_use_says_why(change, reason):
    from cudal1.metrics.rows import unusable

    good = EvalResult(Status.CORRECT, task_id="t", speedup=2.0).to_dict()
    assert unusable(good) is None and unusable(EvalResult(Status.INCORRECT).to_dict()) is None
    assert reason in (unusable({**good, **change}) or "")
