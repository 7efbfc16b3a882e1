"""Tests of cudal1.metrics.aggregate: per-level/per-baseline tables, counts and the audit's survive rule."""

from __future__ import annotations

import math

import pytest

from cudal1.metrics.aggregate import (
    ALL_LEVELS,
    audit_published,
    baselines_present,
    count_flags,
    count_kernel_classes,
    count_statuses,
    summarize_published,
    summarize_rows,
)
from cudal1.metrics.rows import ResultRow


def _rows() -> list[ResultRow]:
    """3 levels, 2 baselines (eager, torch_compile); task f has no torch_compile measurement."""
    return [
        ResultRow("a", level=1, status="correct", speedup=2.0, baselines={"torch_compile": 1.0},
                  kernel_class="custom_cuda", flags=["extra_cuda_stream"]),
        ResultRow("b", level=1, status="correct", speedup=0.5, baselines={"torch_compile": 0.25},
                  kernel_class="pytorch_only"),
        ResultRow("c", level=1, status="incorrect", kernel_class="custom_cuda", flags=["fp16", "fp16"]),
        ResultRow("d", level=2, status="correct", speedup=4.0, baselines={"torch_compile": 2.0},
                  kernel_class="custom_cuda", flags=["extra_cuda_stream", "fp16"]),
        ResultRow("e", level=2, status="compile_error"),
        ResultRow("f", level=3, status="correct", speedup=1.0, kernel_class="flags_only"),
    ]


def _find(records, level, baseline):
    (rec,) = [r for r in records if r.level == level and r.baseline == baseline]
    return rec.summary


def test_summarize_rows_layout():
    records = summarize_rows(_rows())
    keys = [(r.baseline, r.level) for r in records]
    assert keys == [("eager", ALL_LEVELS), ("eager", 1), ("eager", 2), ("eager", 3),
                    ("torch_compile", ALL_LEVELS), ("torch_compile", 1), ("torch_compile", 2),
                    ("torch_compile", 3)]
    assert all(r.label is None for r in records)


def test_summarize_rows_eager_numbers():
    records = summarize_rows(_rows())
    s = _find(records, ALL_LEVELS, "eager")
    # [2, .5, F, 4, F, 1] with failures as 1 -> sorted [.5, 1, 1, 1, 2, 4]
    assert s.n_total == 6 and s.success == 4 and s.count_above_1_01 == 2
    assert s.mean == pytest.approx(9.5 / 6)
    assert s.median == pytest.approx(1.0)
    assert s.p25 == pytest.approx(1.0)
    assert s.p75 == pytest.approx(1.75)
    assert s.max == pytest.approx(4.0)
    assert s.geomean == pytest.approx(4.0 ** 0.25)
    assert s.fast_p[0.0] == pytest.approx(4 / 6)
    assert s.fast_p[0.5] == pytest.approx(3 / 6)
    assert s.fast_p[1.0] == pytest.approx(2 / 6)
    assert s.fast_p[2.0] == pytest.approx(1 / 6)
    l1 = _find(records, 1, "eager")
    assert (l1.n_total, l1.success, l1.count_above_1_01) == (3, 2, 1)
    assert l1.mean == pytest.approx(3.5 / 3) and l1.median == pytest.approx(1.0)
    l2 = _find(records, 2, "eager")
    assert (l2.n_total, l2.success) == (2, 1)
    assert l2.mean == pytest.approx(2.5) and l2.median == pytest.approx(2.5)
    l3 = _find(records, 3, "eager")
    assert (l3.n_total, l3.success, l3.count_above_1_01) == (1, 1, 0) and l3.mean == pytest.approx(1.0)


def test_summarize_rows_second_baseline_counts_unmeasured_as_failure():
    records = summarize_rows(_rows())
    s = _find(records, ALL_LEVELS, "torch_compile")
    # [1, .25, F, 2, F, unmeasured] -> [.25, 1, 1, 1, 1, 2]
    assert s.n_total == 6 and s.success == 3
    assert s.mean == pytest.approx(6.25 / 6)
    assert s.median == pytest.approx(1.0)
    assert s.geomean == pytest.approx(0.5 ** (1 / 3))
    assert s.fast_p[0.0] == pytest.approx(3 / 6)
    assert s.fast_p[1.0] == pytest.approx(1 / 6)
    l3 = _find(records, 3, "torch_compile")
    assert l3.success == 0 and l3.geomean is None and l3.mean == pytest.approx(1.0)


def test_a_baseline_measured_for_some_tasks_is_summarized_over_those():
    import dataclasses

    # A sample has torch_compile measured (tasks a-e), task f does not: its row is not a failure there.
    rows = [dataclasses.replace(r, measured_baselines=() if r.task_id == "f" else ("torch_compile",))
            for r in _rows()]
    records = summarize_rows(rows)
    s = _find(records, ALL_LEVELS, "torch_compile")
    # [1, .25, F, 2, F] -> [.25, 1, 1, 1, 2]
    assert (s.n_total, s.success) == (5, 3) and s.mean == pytest.approx(5.25 / 5)
    assert s.fast_p[0.0] == pytest.approx(3 / 5)
    assert _find(records, 3, "torch_compile").n_total == 0
    assert _find(records, ALL_LEVELS, "eager").n_total == 6  # eager is always measured
    assert ResultRow.from_dict(rows[0].to_dict()) == rows[0]


def test_summarize_rows_failures_excluded():
    s = _find(summarize_rows(_rows(), failures_as=None), ALL_LEVELS, "eager")
    assert s.mean == pytest.approx(7.5 / 4)
    assert s.median == pytest.approx(1.5)


def test_summarize_rows_grouping_options():
    rows = _rows() + [ResultRow("g", level=None, status="correct", speedup=3.0, label="other")]
    only_all = summarize_rows(rows, by=())
    assert [(r.level, r.baseline) for r in only_all] == [(ALL_LEVELS, "eager")]
    assert only_all[0].summary.n_total == 7
    per_level = summarize_rows(rows, by=("level",))
    assert [r.level for r in per_level] == [ALL_LEVELS, 1, 2, 3, None]
    per_label = summarize_rows(rows, by=("label",))
    assert [(r.label, r.summary.n_total) for r in per_label] == [("", 6), ("other", 1)]
    with pytest.raises(ValueError, match="cannot group by"):
        summarize_rows(rows, by=("gpu",))


def test_baselines_present_order():
    rows = [ResultRow("a", speedup=1.0, speedup_warm=1.1, baselines={"zz_custom": 1.0, "cuda_graph": 1.0,
                                                                      "torch_compile": 1.0})]
    assert baselines_present(rows) == ["eager", "eager_warm", "torch_compile", "cuda_graph", "zz_custom"]
    assert baselines_present([ResultRow("a", status="timeout")]) == ["eager"]


def test_count_statuses_lists_every_status():
    counts = count_statuses(_rows())
    assert list(counts)[0] == "unparseable" and list(counts)[-1] == "correct"
    assert counts["correct"] == 4 and counts["incorrect"] == 1 and counts["compile_error"] == 1
    assert counts["timeout"] == 0


def test_count_kernel_classes():
    counts = count_kernel_classes(_rows())
    assert counts == {"custom_cuda": 3, "triton": 0, "pytorch_only": 1, "flags_only": 1, "unknown": 1}
    correct = count_kernel_classes(_rows(), correct_only=True)
    assert correct == {"custom_cuda": 2, "triton": 0, "pytorch_only": 1, "flags_only": 1}


def test_count_flags_once_per_row_most_frequent_first():
    assert count_flags(_rows()) == {"extra_cuda_stream": 2, "fp16": 2}
    assert list(count_flags(_rows())) == ["extra_cuda_stream", "fp16"]  # ties by name
    assert count_flags(_rows(), correct_only=True) == {"extra_cuda_stream": 2, "fp16": 1}


def _audit_rows() -> list[ResultRow]:
    return [
        # exactly 0.9 x published
        ResultRow("t1", level=1, status="correct", speedup=3.6, published={"score_default": 4.0}),
        ResultRow("t2", level=1, status="correct", speedup=1.0, published={"score_default": 4.0}),  # too slow
        ResultRow("t3", level=2, status="hack_detected", published={"score_default": 10.0},
                  flags=["extra_cuda_stream"]),
        ResultRow("t4", level=2, status="correct", speedup=5.0),  # nothing published: not audited
        # faster than published vs eager, slower vs torch_compile
        ResultRow("t5", level=3, status="correct", speedup=2.0, baselines={"torch_compile": 0.5},
                  published={"score_default": 1.5, "score_torch_compile_default": 1.0}),
    ]


def test_audit_survive_rule():
    audit = audit_published(_audit_rows())
    assert audit.published_key == "score_default"
    assert [e.task_id for e in audit.entries] == ["t1", "t2", "t3", "t5"]
    assert [e.survives for e in audit.entries] == [True, False, False, True]
    assert (audit.n_published, audit.n_survive) == (4, 2)
    t2, t3 = audit.entries[1], audit.entries[2]
    assert t2.ratio == pytest.approx(0.25)
    assert t3.speedup is None and t3.ratio is None and t3.flags == ["extra_cuda_stream"]
    assert audit.to_dict()["n_survive"] == 2


def test_audit_fraction_and_baseline_parameters():
    lenient = audit_published(_audit_rows(), fraction=0.25)
    assert lenient.n_survive == 3  # t2 now survives, t3 still fails (not correct)
    strict = audit_published(_audit_rows(), fraction=1.0)
    assert [e.task_id for e in strict.entries if e.survives] == ["t5"]
    tc = audit_published(_audit_rows(), baseline="torch_compile")
    assert tc.published_key == "score_torch_compile_default"
    assert [(e.task_id, e.survives) for e in tc.entries] == [("t5", False)]
    custom = audit_published(_audit_rows(), baseline="eager", published_key="score_torch_compile_default")
    assert [(e.task_id, e.survives) for e in custom.entries] == [("t5", True)]
    with pytest.raises(ValueError, match="published_key"):
        audit_published(_audit_rows(), baseline="my_baseline")
    with pytest.raises(ValueError, match="fraction"):
        audit_published(_audit_rows(), fraction=0.0)


def test_summarize_published_counts_missing_scores_as_failures():
    s = summarize_published(_audit_rows())
    assert s.n_total == 5 and s.success == 4
    assert s.mean == pytest.approx((4.0 + 4.0 + 10.0 + 1.0 + 1.5) / 5)
    assert math.isclose(s.max, 10.0)
