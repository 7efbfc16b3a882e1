"""Render a run's results as Markdown and as one self-contained HTML file, and write both to disk.

The HTML has inline CSS and its plots embedded as base64 PNG data URIs: no script, no external link, so it
reads offline and can be mailed or attached as is. The Markdown references the PNGs under `plots/` when
`write_report` writes them, and shows no images when rendered on its own.

Output is deterministic for a fixed input: nothing here reads the clock; the date, GPU and versions shown
come from `meta`. Usage::

    from cudal1.report import write_report
    write_report(rows, "out/report", title="CUDA-L1 H100 audit", meta={"gpu": "H100", "date": "2025-01-01"})
"""

from __future__ import annotations

import base64
import html
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from cudal1.metrics.rows import ResultRow
from cudal1.report.document import Block, Heading, Image, Paragraph, Table, build_document
from cudal1.report.plots import planned_plots, render_plots

logger = logging.getLogger(__name__)

PLOTS_DIR = "plots"

_CSS = """
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 2em auto;
       max-width: 1200px; padding: 0 1em; color: #1b1f23; line-height: 1.45; }
h1 { border-bottom: 2px solid #d0d7de; padding-bottom: .3em; }
h2 { border-bottom: 1px solid #d0d7de; padding-bottom: .2em; margin-top: 1.8em; }
table { border-collapse: collapse; margin: .8em 0; font-size: 13px; }
th, td { border: 1px solid #d0d7de; padding: 3px 8px; }
th { background: #f6f8fa; text-align: left; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
tbody tr:nth-child(even) { background: #fafbfc; }
figure { margin: 1em 0; }
figure img { max-width: 100%; border: 1px solid #d0d7de; }
figcaption { font-size: 13px; color: #57606a; }
""".strip()


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _md_table(table: Table) -> str:
    numeric = table.numeric or [False] * len(table.header)
    lines = ["| " + " | ".join(_md_cell(h) for h in table.header) + " |",
             "|" + "|".join("---:" if n else "---" for n in numeric) + "|"]
    lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in table.rows]
    return "\n".join(lines)


def blocks_to_markdown(blocks: Sequence[Block],
                       image_src: Callable[[str], str | None] = lambda name: None) -> str:
    """Markdown for `blocks`; `image_src(name)` gives an image's link, or None to leave the image out."""
    parts = []
    for block in blocks:
        if isinstance(block, Heading):
            parts.append("#" * block.level + " " + block.text)
        elif isinstance(block, Paragraph):
            parts.append(block.text)
        elif isinstance(block, Table):
            parts.append(_md_table(block))
        elif isinstance(block, Image):
            src = image_src(block.name)
            if src is not None:
                alt = block.name.rsplit(".", 1)[0].replace("_", " ")
                parts.append(f"![{alt}]({src})\n\n*{block.caption}*")
    return "\n\n".join(parts) + "\n"


def _html_table(table: Table) -> str:
    numeric = table.numeric or [False] * len(table.header)
    head = "".join(f"<th>{html.escape(h)}</th>" for h in table.header)
    body = []
    for row in table.rows:
        cells = "".join(f'<td class="num">{html.escape(c)}</td>' if n else f"<td>{html.escape(c)}</td>"
                        for c, n in zip(row, numeric, strict=True))
        body.append(f"<tr>{cells}</tr>")
    return f"<table>\n<thead><tr>{head}</tr></thead>\n<tbody>\n" + "\n".join(body) + "\n</tbody>\n</table>"


def blocks_to_html(blocks: Sequence[Block], pngs: Mapping[str, bytes]) -> str:
    """A complete HTML page for `blocks`; images come from `pngs` (name -> PNG bytes) as data URIs."""
    title = next((b.text for b in blocks if isinstance(b, Heading) and b.level == 1), "cudal1 report")
    parts = []
    for block in blocks:
        if isinstance(block, Heading):
            parts.append(f"<h{block.level}>{html.escape(block.text)}</h{block.level}>")
        elif isinstance(block, Paragraph):
            parts.append(f"<p>{html.escape(block.text)}</p>")
        elif isinstance(block, Table):
            parts.append(_html_table(block))
        elif isinstance(block, Image) and block.name in pngs:
            data = base64.b64encode(pngs[block.name]).decode("ascii")
            cap = html.escape(block.caption)
            parts.append(f'<figure><img src="data:image/png;base64,{data}" alt="{cap}">'
                         f"<figcaption>{cap}</figcaption></figure>")
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"<title>{html.escape(title)}</title>\n<style>\n{_CSS}\n</style>\n</head>\n<body>\n"
            + "\n".join(parts) + "\n</body>\n</html>\n")


def render_markdown(rows: Sequence[ResultRow], *, title: str, meta: Mapping[str, Any],
                    plot_paths: Mapping[str, str] | None = None, failures_as: float | None = 1.0,
                    survive_fraction: float = 0.9, extra_blocks: Sequence[Block] = ()) -> str:
    """The report as Markdown.

    Args:
        rows: result rows (one per task per label).
        title: the report's title.
        meta: run metadata shown in the header (GPU, versions, protocol, date...), in the given order.
        plot_paths: plot file name -> link to show it (as `write_report` passes); None: no plots.
        failures_as: how a failure counts in mean/median/percentiles (see `cudal1.metrics.summarize`).
        survive_fraction: share of a published speedup ours must reach for it to survive an audit.
        extra_blocks: sections appended at the end (e.g. an audit's baseline coverage).
    """
    specs = [p for p in planned_plots(rows) if plot_paths and p.name in plot_paths]
    blocks = build_document(rows, title=title, meta=meta, plots=specs, failures_as=failures_as,
                            survive_fraction=survive_fraction) + list(extra_blocks)
    return blocks_to_markdown(blocks, lambda name: (plot_paths or {}).get(name))


def render_html(rows: Sequence[ResultRow], *, title: str, meta: Mapping[str, Any], plots: bool = True,
                failures_as: float | None = 1.0, survive_fraction: float = 0.9,
                pngs: Mapping[str, bytes] | None = None, extra_blocks: Sequence[Block] = ()) -> str:
    """The report as one self-contained HTML page (inline CSS, plots as base64 PNG data URIs, no script).

    `plots=False` leaves the plots out (and needs no matplotlib); `pngs` passes plots already drawn by
    `render_plots` so they are not drawn twice. Other arguments as in `render_markdown`.

    Raises:
        MissingDependencyError: plots are asked for and matplotlib is not installed (extra `report`).
    """
    if plots and pngs is None:
        pngs = render_plots(rows)
    pngs = pngs if plots and pngs is not None else {}
    specs = [p for p in planned_plots(rows) if p.name in pngs]
    blocks = build_document(rows, title=title, meta=meta, plots=specs, failures_as=failures_as,
                            survive_fraction=survive_fraction) + list(extra_blocks)
    return blocks_to_html(blocks, pngs)


def write_report(rows: Sequence[ResultRow], out_dir: str | Path, *, title: str, meta: Mapping[str, Any],
                 plots: bool = True, failures_as: float | None = 1.0,
                 survive_fraction: float = 0.9, extra_blocks: Sequence[Block] = ()) -> dict[str, Path]:
    """Write `report.md`, `report.html` and the plots (`plots/*.png`) under `out_dir`.

    Returns:
        Relative name (`report.md`, `report.html`, `plots/<name>.png`) -> path written.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    pngs = render_plots(rows) if plots else {}
    written: dict[str, Path] = {}
    if pngs:
        (out / PLOTS_DIR).mkdir(exist_ok=True)
    for name, data in pngs.items():
        path = out / PLOTS_DIR / name
        path.write_bytes(data)
        written[f"{PLOTS_DIR}/{name}"] = path
    md = render_markdown(rows, title=title, meta=meta, plot_paths={n: f"{PLOTS_DIR}/{n}" for n in pngs},
                         failures_as=failures_as, survive_fraction=survive_fraction, extra_blocks=extra_blocks)
    page = render_html(rows, title=title, meta=meta, plots=plots, failures_as=failures_as,
                       survive_fraction=survive_fraction, pngs=pngs, extra_blocks=extra_blocks)
    for name, text in (("report.md", md), ("report.html", page)):
        path = out / name
        path.write_text(text, encoding="utf-8")
        written[name] = path
    logger.info("wrote report (%d rows, %d plots) to %s", len(rows), len(pngs), out)
    return dict(sorted(written.items()))
