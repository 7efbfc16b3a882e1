"""Audit tables: survival per kernel class and flag, per-task entries, profile comparison."""

from __future__ import annotations

from cudal1.audit.summary import (
    audit_entries,
    implied_baselines,
    implied_blocks,
    outcome_table,
    profile_comparison,
    survival_table,
    tasks_markdown,
)
from cudal1.metrics.rows import ResultRow

ROWS = [
    ResultRow("a", level=1, speedup=2.0, baselines={"cuda_graph": 1.0}, kernel_class="custom_cuda",
              published={"score_default": 2.1, "score_cuda_graph": 1.5}, label="audit:r:strict"),
    ResultRow("b", level=1, speedup=1.0, kernel_class="pytorch_only", flags=["extra_cuda_stream"],
              published={"score_default": 3.0}, label="audit:r:strict"),
    ResultRow("c", level=2, status="incorrect", kernel_class="custom_cuda", flags=["fp16_downgrade"],
              published={"score_default": 5.0}, label="audit:r:strict"),
    ResultRow("c", level=2, speedup=5.0, kernel_class="custom_cuda", flags=["fp16_downgrade"],
              published={"score_default": 5.0}, label="audit:r:cuda-l1"),
]


def test_entries_report_survival_per_baseline():
    entries = {(e["task_id"], e["label"]): e for e in audit_entries(ROWS)}
    a = entries[("a", "audit:r:strict")]
    assert a["survives"] is True and a["survives_vs"] == {"eager": True, "cuda_graph": False}
    assert a["speedup_vs"] == {"eager": 2.0, "cuda_graph": 1.0}
    assert entries[("b", "audit:r:strict")]["survives"] is False
    assert entries[("c", "audit:r:strict")]["survives"] is False


def test_survival_tables():
    strict = [r for r in ROWS if r.label.endswith("strict")]
    by_class = survival_table(strict, "kernel_class")
    assert by_class["custom_cuda"] == {"rows": 2, "correct": 1, "published": 2, "survive": 1}
    assert by_class["pytorch_only"]["survive"] == 0
    by_flag = survival_table(strict, "flag")
    assert by_flag["(none)"]["survive"] == 1 and by_flag["fp16_downgrade"]["correct"] == 0


def test_profile_comparison_puts_labels_side_by_side():
    lines = {x["label"]: x for x in profile_comparison(ROWS)}
    assert lines["audit:r:strict"]["survive"] == 1 and lines["audit:r:strict"]["rows"] == 3
    assert lines["audit:r:cuda-l1"]["survive"] == 1 and lines["audit:r:cuda-l1"]["correct"] == 1


def test_tasks_markdown_lists_ours_and_published_per_baseline():
    text = tasks_markdown(audit_entries(ROWS[:1]), "T")
    assert "vs cuda_graph (ours / published)" in text
    assert "| a | 1 | correct | 2.00 / 2.10 | 1.00 / 1.50 | custom_cuda | - | yes |" in text


def test_implied_baselines_put_ours_next_to_the_release():
    # a: published 2.1 vs eager and 1.5 vs cuda_graph imply a graph 1.4x eager; ours is 1.4x (agrees).
    # b: published only vs eager, no graph score: left out. c: implies 2.5x, ours 1.0x (outside x1.25).
    rows = [ROWS[0], ROWS[1], ResultRow("c", level=2, published={"score_default": 5.0, "score_cuda_graph": 2.0},
                                        label="audit:r:strict")]
    per_task = {"a": {"cuda_graph": {"status": "ok", "speedup_vs_eager": 1.4}},
                "b": {"cuda_graph": {"status": "ok", "speedup_vs_eager": 1.1}},
                "c": {"cuda_graph": {"status": "ok", "speedup_vs_eager": 1.0},
                      "cudnn": {"status": "failed", "speedup_vs_eager": None}}}
    [graph] = implied_baselines(rows, per_task)
    assert graph["baseline"] == "cuda_graph" and graph["tasks"] == 2 and graph["agree"] == 1
    assert graph["ours_median"] == 1.2
    assert abs(graph["implied_median"] - (1.4 + 2.5) / 2) < 1e-9
    assert abs(graph["ratio_median"] - (1.0 + 0.4) / 2) < 1e-9
    table = implied_blocks([graph])[-1]
    assert table.rows == [["cuda_graph", "2", "1.20x", "1.95x", "0.70", "1/2"]]
    assert implied_blocks([]) == []


def test_outcomes_count_cuda_that_never_built_apart_and_name_what_rejected():
    rows = [
        ResultRow("a", kernel_class="custom_cuda", speedup=2.0, label="r"),
        ResultRow("b", kernel_class="pytorch_only", speedup=1.1, flags=["runtime.custom_build_failed"], label="r"),
        ResultRow("c", status="incorrect", flags=["runtime.custom_build_failed"], label="r"),
        ResultRow("d", status="compile_error", label="r"),
        ResultRow("e", status="hack_detected", flags=["extra_cuda_stream", "exception_fallback"], label="r"),
        ResultRow("f", status="hack_detected", flags=["extra_cuda_stream"], label="r"),
        ResultRow("g", status="infra_error", flags=["reference_error"], label="r"),
    ]
    [line] = outcome_table(rows)
    assert (line["tasks"], line["correct"], line["correct_cuda_never_built"]) == (7, 2, 1)
    assert (line["incorrect"], line["incorrect_cuda_never_built"], line["compile_error"]) == (1, 1, 1)
    assert line["hack_detected"] == 2 and line["infra_error"] == 1 and line["other"] == 0
    assert line["rejected_flags"] == {"extra_cuda_stream": 2, "exception_fallback": 1}
