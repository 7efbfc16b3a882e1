"""Reports of a run: Markdown and self-contained HTML with the paper's tables, counts, audits and plots.

`write_report(rows, out_dir, title=..., meta=...)` writes everything; `render_markdown` / `render_html`
return the text; `render_plots` returns the PNGs (needs matplotlib, extra `report`).
"""

from cudal1.report.document import build_document, evaluations_section
from cudal1.report.plots import PlotSpec, planned_plots, plots_available, render_plots
from cudal1.report.render import render_html, render_markdown, write_report

__all__ = [
    "PlotSpec",
    "build_document",
    "evaluations_section",
    "planned_plots",
    "plots_available",
    "render_html",
    "render_markdown",
    "render_plots",
    "write_report",
]
