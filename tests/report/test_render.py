"""Tests of cudal1.report.render: Markdown numbers, self-contained HTML, written files."""

from __future__ import annotations

import base64
import re
import sys
from html.parser import HTMLParser

import pytest

from cudal1.metrics.rows import ResultRow
from cudal1.report.render import render_html, render_markdown, write_report

VOID = {"meta", "img", "br", "hr", "link", "input"}


class _StrictParser(HTMLParser):
    """Collects tags and fails on unbalanced or mis-nested ones (html.parser itself never raises)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.errors: list[str] = []
        self.imgs: list[dict[str, str | None]] = []
        self.tags: set[str] = set()

    def handle_starttag(self, tag, attrs):
        self.tags.add(tag)
        if tag == "img":
            self.imgs.append(dict(attrs))
        if tag not in VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag):
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"unexpected </{tag}> with open {self.stack[-3:]}")
        else:
            self.stack.pop()


@pytest.fixture(scope="module")
def page(rows, pngs, meta) -> str:
    return render_html(rows, title="Audit <H100> & co", meta=meta, pngs=pngs)


def test_markdown_header_and_summary_numbers(rows, meta):
    md = render_markdown(rows, title="Audit", meta=meta)
    assert md.startswith("# Audit\n")
    assert "| gpu | NVIDIA H100 80GB HBM3 |" in md
    assert "| date | 1999-12-31 |" in md
    assert ("| Level | Mean | Median | Max | P25 | P75 | Success | >1.01x | Geomean | fast_0 | fast_0.5 | "
            "fast_0.8 | fast_1 | fast_1.5 | fast_2 |") in md
    assert ("| all | 1.58 | 1.00 | 4.00 | 1.00 | 1.75 | 4/6 | 2/6 | 1.41 | 66.7% | 50.0% | 50.0% | 33.3% | "
            "33.3% | 16.7% |") in md
    assert "| 2 | 2.50 | 2.50 | 4.00 | 1.75 | 3.25 | 1/2 | 1/2 | 4.00 | 50.0% |" in md
    assert "### vs torch_compile" in md
    assert "![" not in md  # no plot links unless write_report provides them


def test_markdown_counts_and_audit(rows, meta):
    md = render_markdown(rows, title="Audit", meta=meta)
    assert "| correct | 4 |" in md and "| compile_error | 1 |" in md and "| timeout | 0 |" in md
    assert "| custom_cuda | 3 | 2 |" in md
    assert "| extra_cuda_stream | 2 | 2 |" in md and "| fp16_downgrade | 2 | 1 |" in md
    assert "| rows | eager | score_default | 5 | 4 | 3 | 60.0% |" in md
    assert "| t1 | 1 | 2.00 | correct | 2.00 | 1.00 | custom_cuda | extra_cuda_stream | yes |" in md
    assert "| t2 | 1 | 1.20 | correct | 0.50 | 0.42 | pytorch_only | - | no |" in md
    assert "| t3 | 1 | 8.00 | incorrect | - | - | custom_cuda | fp16_downgrade | no |" in md
    assert ("| t4 | 2 | 4.40 | correct | 4.00 | 0.91 | custom_cuda | extra_cuda_stream, fp16_downgrade "
            "| yes |") in md
    # natural order: t10 (level 3) comes after t4
    assert md.index("| t4 | 2 |") < md.index("| t10 | 3 |")
    assert "| all | 3 | 20.0% | 40.0% | 2/3 |" in md  # speed of light medians


def test_markdown_survive_fraction_parameter(rows, meta):
    md = render_markdown(rows, title="Audit", meta=meta, survive_fraction=1.0)
    assert "| rows | eager | score_default | 5 | 4 | 1 | 20.0% |" in md


def test_markdown_is_reproducible(rows, meta):
    a = render_markdown(rows, title="Audit", meta=meta)
    assert a == render_markdown(rows, title="Audit", meta=meta)
    assert "1999-12-31" in a and not re.search(r"20[2-9]\d-\d\d-\d\d", a)


def test_markdown_escapes_pipes():
    md = render_markdown([ResultRow("a|b", status="correct", speedup=2.0, published={"score_default": 2.0})],
                         title="T", meta={"note": "x|y"})
    assert "| note | x\\|y |" in md and "| a\\|b |" in md


def test_html_is_self_contained(page, pngs):
    assert page.startswith("<!DOCTYPE html>")
    assert "data:image/png;base64," in page
    assert not re.search(r"https?://", page)
    assert "<script" not in page.lower()
    parser = _StrictParser()
    parser.feed(page)
    parser.close()
    assert parser.errors == [] and parser.stack == []
    assert {"html", "head", "style", "body", "table", "figure"} <= parser.tags
    srcs = [img["src"] for img in parser.imgs]
    assert len(srcs) == len(pngs)
    for src, data in zip(srcs, pngs.values(), strict=True):
        assert src.startswith("data:image/png;base64,")
        assert base64.b64decode(src.split(",", 1)[1]) == data


def test_html_escapes_and_numbers(page):
    assert "<title>Audit &lt;H100&gt; &amp; co</title>" in page
    assert '<td>all</td><td class="num">1.58</td><td class="num">1.00</td>' in page


def test_html_without_plots_needs_no_matplotlib(monkeypatch, rows):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    page = render_html(rows, title="T", meta={}, plots=False)
    assert "data:image" not in page and "<h2>Summary</h2>" in page


def test_write_report_creates_files(tmp_path, rows, meta):
    written = write_report(rows, tmp_path / "out", title="Audit", meta=meta)
    assert set(written) == {"report.md", "report.html", "plots/speedup_cdf.png", "plots/speedup_by_level.png",
                            "plots/speed_of_light.png"}
    assert all(p.is_file() and p.stat().st_size > 0 for p in written.values())
    md = written["report.md"].read_text()
    for link in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md):
        assert (tmp_path / "out" / link).is_file()
    assert len(re.findall(r"!\[", md)) == 3
    assert written["plots/speedup_cdf.png"].read_bytes()[:4] == b"\x89PNG"


def test_write_report_empty_rows(tmp_path):
    written = write_report([], tmp_path, title="Empty", meta={})
    assert set(written) == {"report.md", "report.html"}
    assert "No results to report." in written["report.md"].read_text()
    assert not (tmp_path / "plots").exists()
