"""`cudal1 audit-chunk`, `audit-ingest`, `audit-pages`: an audit of every release, one GPU run at a time.

    cudal1 audit-chunk h100 --out OUT --budget-s 400          # on the GPU: the next chunk, its record in OUT
    cudal1 audit-ingest OUT                                   # here: copy the record in, rebuild the pages
    cudal1 audit-pages --static-from RELEASES_DIR             # the static half of every release, and the pages
"""

from __future__ import annotations

from pathlib import Path

import typer

from cudal1.audit.chunks import (
    DEFAULT_AUDIT_DIR,
    DEFAULT_DATA_DIR,
    ChunkConfig,
    describe_plan,
    ingest_chunks,
    plan_next,
    run_chunk,
)
from cudal1.audit.pages import PagesConfig, rebuild
from cudal1.baselines import parse_kinds
from cudal1.cli import common

_AUDIT_DIR_OPT = typer.Option(DEFAULT_AUDIT_DIR, "--audit-dir", help="The audit folder (static/, chunks/, pages).")
_PLOTS_OPT = typer.Option(True, "--plots/--no-plots", help="Draw the audit folders' plots (matplotlib).")
_EARLIER_OPT = typer.Option(["h100=docs/audit/cuda-l1-h100-h200"], "--earlier",
                            help="RELEASE=FOLDER: an earlier audit to explain changed verdicts against.")


def audit_chunk_command(
    release: str = typer.Argument(..., help="Release name (h100, a100, l40, h20, 3090) or a JSONL path."),
    out: Path = typer.Option(..., "--out", "-o", help="Folder the chunk record is written to."),
    audit_dir: Path = _AUDIT_DIR_OPT,
    data_dir: Path = typer.Option(Path(DEFAULT_DATA_DIR), "--data-dir", help="Where release names are found."),
    budget_s: float = typer.Option(400.0, "--budget-s", min=1.0, help="Wall-clock budget of the chunk."),
    baselines: str = typer.Option("cuda_graph,eager,torch_compile", "--baselines",
                                  help="Baselines each task needs ('' none)."),
    device: str = typer.Option("cuda", "--device", callback=common.check_device, help="cuda, cuda:N or cpu."),
    max_items: int | None = typer.Option(None, "--max-items", min=1, help="At most N evaluations."),
    task: list[str] = typer.Option([], "--task", help="Only this task id (repeat the option)."),
    redo: bool = typer.Option(False, "--redo", help="Re-check: evaluate the tasks even when done."),
    commit: str | None = typer.Option(None, "--commit", help="The code's commit (a folder without git)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan; run and write nothing."),
) -> None:
    """The next chunk of a release's audit, on the GPU.

    Plans what the committed records leave, runs it within the budget and writes its record into OUT.
    """
    config = ChunkConfig(release=release, out_dir=str(out), audit_dir=str(audit_dir), data_dir=str(data_dir),
                         budget_s=budget_s, baselines=tuple(parse_kinds(baselines)) if baselines else (),
                         device=device, max_items=max_items, tasks=tuple(task), redo=redo, commit=commit)
    if dry_run:
        common.console.print(describe_plan(plan_next(config)), highlight=False)
        return
    common.output_folder(out)
    outcome = run_chunk(config)
    plan = outcome.plan
    common.console.print(
        f"{outcome.path}: {outcome.evaluated} of {len(plan.items)} planned evaluations, {outcome.baselines} "
        f"baselines, in {outcome.elapsed_s:.0f} s (estimated {plan.estimate_s:.0f} s); pending before: "
        f"{plan.pending}" + (f"; left for the next chunk: {len(outcome.left)}" if outcome.left else ""),
        highlight=False)
    if plan.empty:
        common.console.print("nothing left to do for this release on this card", highlight=False)


def audit_ingest_command(
    records: Path = typer.Argument(..., help="A chunk record, or a folder holding them (a GPU run's OUT)."),
    audit_dir: Path = _AUDIT_DIR_OPT, earlier: list[str] = _EARLIER_OPT, plots: bool = _PLOTS_OPT,
) -> None:
    """Copy returned chunk records in; rebuild the pages."""
    added = ingest_chunks([records], audit_dir)
    written = rebuild(PagesConfig(audit_dir=str(audit_dir), earlier=tuple(earlier), plots=plots))
    common.console.print(f"{len(added)} new chunk record(s); {len(written)} files written under {audit_dir}",
                         highlight=False)


def audit_pages_command(
    audit_dir: Path = _AUDIT_DIR_OPT,
    static_from: Path | None = typer.Option(None, "--static-from", help=(
        "Write the static records first, from the releases NAME.jsonl in this folder.")),
    release: list[str] = typer.Option(["h100", "a100", "l40", "h20", "3090"], "--release",
                                      help="Release names --static-from reads."),
    earlier: list[str] = _EARLIER_OPT, plots: bool = _PLOTS_OPT,
) -> None:
    """Rebuild an audit's pages from its records.

    With --static-from, the static records of every release are written first.
    """
    written = rebuild(PagesConfig(audit_dir=str(audit_dir), static_from=None if static_from is None else str(static_from),
                                  releases=tuple(release), earlier=tuple(earlier), plots=plots))
    common.console.print(f"{len(written)} files written under {audit_dir}", highlight=False)


def register(app: typer.Typer) -> None:
    """Add `cudal1 audit-chunk`, `audit-ingest` and `audit-pages` to the CLI."""
    app.command("audit-chunk")(audit_chunk_command)
    app.command("audit-ingest")(audit_ingest_command)
    app.command("audit-pages")(audit_pages_command)
