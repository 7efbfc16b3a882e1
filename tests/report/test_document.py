"""Tests of cudal1.report.document: formatting helpers and which sections a report gets."""

from __future__ import annotations

from cudal1.metrics.rows import ResultRow
from cudal1.report.document import Heading, Image, Paragraph, Table, build_document, fmt_level, fmt_pct, fmt_x
from cudal1.report.plots import planned_plots


def _headings(blocks) -> list[str]:
    return [b.text for b in blocks if isinstance(b, Heading)]


def test_formatters():
    assert fmt_x(None) == "-" and fmt_x(1.005) == "1.00" and fmt_x(12.345) == "12.35"
    assert fmt_pct(None) == "-" and fmt_pct(2 / 3) == "66.7%"
    assert fmt_level(None) == "unknown" and fmt_level("all") == "all" and fmt_level(2) == "2"


def test_full_document_sections(rows):
    blocks = build_document(rows, title="T", meta={"gpu": "H100"}, plots=planned_plots(rows))
    heads = _headings(blocks)
    assert heads[0] == "T"
    for expected in ["Summary", "vs eager", "vs torch_compile", "Plots", "Verdicts", "Kernel classes",
                     "Flags", "Speed of light", "Audit of published speedups", "Published vs ours (eager)"]:
        assert expected in heads, expected
    assert [b.name for b in blocks if isinstance(b, Image)] == [p.name for p in planned_plots(rows)]
    for table in (b for b in blocks if isinstance(b, Table)):
        assert all(len(r) == len(table.header) for r in table.rows)


def test_sections_absent_without_their_data():
    rows = [ResultRow("a", level=1, status="correct", speedup=1.5)]
    heads = _headings(build_document(rows, title="T", meta={}))
    assert "Summary" in heads and "Plots" not in heads
    assert "Speed of light" not in heads and "Audit of published speedups" not in heads
    paragraphs = [b.text for b in build_document(rows, title="T", meta={}) if isinstance(b, Paragraph)]
    assert "No flags raised." in paragraphs


def test_empty_rows():
    blocks = build_document([], title="Nothing", meta={})
    assert _headings(blocks) == ["Nothing"]
    assert Paragraph("No results to report.") in blocks


def test_conventions_follow_failures_as(rows):
    def text(fa):
        return " ".join(b.text for b in build_document(rows, title="T", meta={}, failures_as=fa)
                        if isinstance(b, Paragraph))

    assert "counted as 1x in mean" in text(1.0)
    assert "excluded from mean" in text(None)
    assert "counted as 0x in mean" in text(0.0)


def test_several_labels_get_their_own_blocks(rows):
    other = [ResultRow("t1", level=1, status="correct", speedup=3.0, label="b")]
    blocks = build_document(list(rows) + other, title="T", meta={})
    heads = _headings(blocks)
    assert "Run: unlabelled" in heads and "Run: b" in heads
    status_table = next(b for b in blocks if isinstance(b, Table) and b.header[0] == "Status")
    assert status_table.header == ["Status", "rows", "b"]


def test_flag_list_names_each_rule_once_with_its_count():
    from cudal1.report.document import flag_list

    assert flag_list(["b", "a", "b", "b"]) == "b x3, a"
    assert flag_list([]) == "-"


def test_origins_get_their_own_summaries_and_every_task_its_row():
    rows = [ResultRow("builtin/level1/relu", level=1, status="correct", speedup=2.0),
            ResultRow("h100/level1/7", level=1, status="incorrect"),
            ResultRow("file/mine", status="correct", speedup=1.1, kernel_class="pytorch_rewrite")]
    blocks = build_document(rows, title="T", meta={})
    heads = _headings(blocks)
    assert {"built-in tasks", "release h100", "ad-hoc files", "Per task"} <= set(heads)
    table = next(b for b in blocks[blocks.index(Heading("Per task", 2)):] if isinstance(b, Table))
    assert [r[0] for r in table.rows] == ["builtin/level1/relu", "h100/level1/7", "file/mine"]
    assert table.rows[2][1] == "ad-hoc files" and table.rows[1][3] == "incorrect"
    single = _headings(build_document(rows[:1], title="T", meta={}))
    assert "built-in tasks" not in single  # one origin: no split
