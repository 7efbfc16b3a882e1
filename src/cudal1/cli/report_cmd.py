"""`cudal1 report`: render a Markdown and a self-contained HTML report from the results store."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from cudal1.audit.rows import rows_from_store, stored_labels
from cudal1.cli import common
from cudal1.core.errors import MissingDependencyError, SourceError
from cudal1.metrics.noise import cpu_noise_note, measured_on_cpu, small_call_note, small_gpu_call
from cudal1.metrics.rows import unusable
from cudal1.report import evaluations_section, plots_available, write_report


def report_meta(store: Any, labels: list[str], results: list[dict[str, Any]]) -> dict[str, Any]:
    """Header of the report: store, labels, the GPUs / software versions the results came from, and how far
    CPU timings can be trusted when some were measured on a CPU."""
    def values(key: str) -> str:
        found = sorted({str(r["result"].get("environment", {}).get(key)) for r in results
                        if r["result"].get("environment", {}).get(key)})
        return ", ".join(found) or "-"
    meta: dict[str, Any] = {"store": str(store.path), "labels": ", ".join(labels) or "-",
                            "gpu": values("gpu_name"), "torch": values("torch_version"),
                            "cuda": values("cuda_version"), "evaluations": len(results)}
    if any(measured_on_cpu(r["result"]) and r["result"].get("speedup") is not None for r in results):
        meta["timing"] = cpu_noise_note()
    small_calls = sum(small_gpu_call(r["result"]) for r in results)
    if small_calls:
        meta["small calls"] = small_call_note(small_calls, len(results))
    return meta


def skipped_note(skipped: list[tuple[dict[str, Any], str]]) -> str:
    """One line: how many stored evaluations the report left out, and why (the first few)."""
    shown = "; ".join(f"{rec['task_id']}: {reason}" for rec, reason in skipped[:3])
    more = f"; and {len(skipped) - 3} more" if len(skipped) > 3 else ""
    return f"{len(skipped)} stored evaluation(s) that cannot be reported ({shown}{more})"


_OUT_OPT = typer.Option(..., "--out", "-o", help="Output folder (report.md, report.html, plots/).")
_LABEL_OPT = typer.Option([], "--label", "-l", help="Labels to report (default: every non-baseline label).")
_TITLE_OPT = typer.Option("cudal1 report", "--title", help="Report title.")
_PLOTS_OPT = typer.Option(None, "--plots/--no-plots", show_default=False,
                          help="Draw plots (matplotlib, the report extra); default: when matplotlib is "
                               "installed.")
_SOL_OPT = typer.Option(True, "--sol/--no-sol", help="Speed-of-light fractions (needs stored peaks).")


def report_command(
    out: Path = _OUT_OPT,
    label: list[str] = _LABEL_OPT,
    title: str = _TITLE_OPT,
    store_path: Path | None = common.StoreOpt,
    plots: bool | None = _PLOTS_OPT,
    sol: bool = _SOL_OPT,
) -> None:
    """Markdown and HTML report of the results store.

    Summaries per level and baseline, verdicts, kernel classes, flags, speed of light, audits, plots, and a
    table of every stored evaluation.
    """
    common.check_output_folder(out)  # made only when the report is written: a failure leaves no empty folder
    drawable = plots_available()
    if plots and not drawable:
        raise MissingDependencyError("matplotlib", "report", "report plots (or --no-plots)")
    store = common.open_existing_store(store_path)
    labels = list(label) or stored_labels(store)
    known = set(stored_labels(store, include_baselines=True))
    missing = [lb for lb in labels if lb not in known]
    if missing:
        raise SourceError(f"no results labelled {', '.join(missing)} in {store.path} "
                          f"(labels: {', '.join(sorted(known)) or 'none'})")
    skipped: list[tuple[dict[str, Any], str]] = []
    rows = rows_from_store(store, labels, with_sol=sol, skipped=skipped)
    results = [r for lb in labels for r in store.query_evaluations(label=lb) if unusable(r["result"]) is None]
    meta = report_meta(store, labels, results)
    if skipped:
        meta["skipped"] = skipped_note(skipped)
    with common.writing_into(out):
        written = write_report(rows, out, title=title, meta=meta, plots=drawable if plots is None else plots,
                               extra_blocks=evaluations_section(results))
    tasks = len({r["task_id"] for r in results})
    common.console.print(f"{len(results)} evaluation(s) of {tasks} task(s) from {len(labels)} label(s) -> "
                         + ", ".join(str(p) for p in written.values()), highlight=False, markup=False)
    if skipped:
        common.console.print(f"Skipped {meta['skipped']}", highlight=False, markup=False, soft_wrap=True)
    if plots is None and not drawable:
        common.console.print("No plots: matplotlib is not installed (pip install 'cudal1[report]').",
                             highlight=False, markup=False)


def register(app: typer.Typer) -> None:
    """Add `cudal1 report` to the CLI."""
    app.command("report")(report_command)
