"""`cudal1 audit RELEASE.jsonl`: re-evaluate a published kernel collection here, resumably, and report."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.table import Table
from rich.text import Text

from cudal1.audit import AuditConfig, AuditOutcome, profile_comparison, run_audit, survival_table
from cudal1.audit.compare import DEFAULT_TOLERANCE, AuditComparison, compare_audits, load_audit
from cudal1.audit.run import asked_by_runs, collect_audit, measured_on, report_audit, report_only_config
from cudal1.baselines import parse_kinds
from cudal1.cli import common
from cudal1.core.types import EvalResult
from cudal1.tasks import Task

_RELEASE_OPT = typer.Argument(..., help="JSONL release in CUDA-L1's schema (e.g. h100.jsonl).")
_PROFILE_OPT = typer.Option("strict", "--profile", help="strict (ours) or cuda-l1 (their tolerance).")
_LEVEL_OPT = typer.Option([], "--level", help="Only these levels.")
_SAMPLE_PER_LEVEL_OPT = typer.Option(None, "--sample-per-level", help="K items per level (seeded).")
_SEED_OPT = typer.Option(0, "--seed", help="Seed of --sample-per-level.")
_LIMIT_OPT = typer.Option(None, "--limit", min=1, help="At most N selected items.")
_CHUNK_OPT = typer.Option(None, "--chunk", help="Only chunk I/N of the selection, e.g. 2/5.")
_BASELINES_OPT = typer.Option("", "--baselines", help="Baselines to measure too, e.g. eager,cuda_graph.")
_OUT_OPT = typer.Option(None, "--out", "-o", help="Report folder (default audit-RELEASE-PROFILE).")
_TIME_BUDGET_S_OPT = typer.Option(None, "--time-budget-s", help="Stop starting batches after this.")
_BATCH_SIZE_OPT = typer.Option(16, "--batch-size", help="Items per parallel-build batch.")
_PLOTS_OPT = typer.Option(True, "--plots/--no-plots", help="Draw plots (needs matplotlib).")
_REPORT_ONLY_OPT = typer.Option(False, "--report-only", help=(
    "Evaluate nothing; report the stored results of the GPU with the most of them (works without a GPU, e.g. "
    "on a store copied from the GPU machine)."))
_GPU_OPT = typer.Option(None, "--gpu", help="With --report-only: the GPU name whose results to report.")
_COMPARE_TO_OPT = typer.Option(None, "--compare-to", help=(
    "An earlier audit.json (or its report folder): compare the shared tasks with it, write comparison.json, "
    "exit 1 when this run does not reproduce it."))
_TOLERANCE_OPT = typer.Option(DEFAULT_TOLERANCE, "--tolerance", min=0.001, help=(
    "New/earlier speedup medians must lie within x(1+T) either way (0.1: 0.909-1.100)."))
_EARLIER_ARG = typer.Argument(..., help="The earlier audit.json (or its report folder).")
_NEW_ARG = typer.Argument(..., help="The new audit.json (or its report folder).")
_JSON_OUT_OPT = typer.Option(None, "--json", help="Also write the comparison as JSON here.")


def audit_command(
    release: Path = _RELEASE_OPT,
    profile: str = _PROFILE_OPT,
    level: list[int] = _LEVEL_OPT,
    sample_per_level: int | None = _SAMPLE_PER_LEVEL_OPT,
    seed: int = _SEED_OPT,
    limit: int | None = _LIMIT_OPT,
    chunk: str | None = _CHUNK_OPT,
    baselines: str = _BASELINES_OPT,
    out: Path | None = _OUT_OPT,
    time_budget_s: float | None = _TIME_BUDGET_S_OPT,
    batch_size: int = _BATCH_SIZE_OPT,
    device: str = common.DeviceOpt, trials: int = common.TrialsOpt, sizes: str = common.SizesOpt,
    buckets: int = common.BucketsOpt, timeout_s: float = common.TimeoutOpt, sandbox: str = common.SandboxOpt,
    store_path: Path | None = common.StoreOpt, force: bool = common.ForceOpt,
    plots: bool = _PLOTS_OPT, report_only: bool = _REPORT_ONLY_OPT, gpu: str | None = _GPU_OPT,
    compare_to: Path | None = _COMPARE_TO_OPT, tolerance: float = _TOLERANCE_OPT,
) -> None:
    """Verdict, speedup, kernel class and flags next to each published score; which speedups survive."""
    earlier = load_audit(compare_to) if compare_to is not None else None  # a bad path fails before any work
    cfg = AuditConfig(
        release=str(release), profile=profile, levels=tuple(level), sample_per_level=sample_per_level, seed=seed,
        limit=limit, chunk=chunk, baselines=tuple(parse_kinds(baselines)) if baselines else (),
        batch_size=batch_size, time_budget_s=time_budget_s, force=force,
        eval_config=common.make_config(device, profile, trials, sizes, buckets=buckets, timeout_s=timeout_s,
                                       sandbox=sandbox))
    if gpu and not report_only:
        raise typer.BadParameter("--gpu chooses whose results a report shows: use it with --report-only")
    store = common.open_existing_store(store_path) if report_only else common.open_store(store_path, False)
    folder = common.output_folder(out or Path(f"audit-{cfg.release_name}-{profile}"))
    if report_only:
        cfg = report_only_config(cfg, store, gpu)
        common.console.print(measured_on(cfg.environment))
    if report_only:
        outcome = collect_audit(cfg, store)  # reads the store, writes nothing to it
    else:
        with common.progress_bar() as bar:
            job = bar.add_task("auditing", total=None, best="")

            def on_result(task: Task, result: EvalResult) -> None:
                bar.update(job, advance=1, best=f"{task.id}: {result.status.value}")

            outcome = run_audit(cfg, store, on_result=on_result)
    # Each baseline is counted over the tasks that this and earlier runs asked it for, not over every task.
    written = report_audit(outcome, cfg, store, folder, plots=plots, asked=asked_by_runs(store, cfg))
    common.console.print(summary_table(outcome, cfg))
    per_task = ", ".join(str(written[name]) for name in ("audit_tasks.md", "audit_baselines.md") if name in written)
    common.console.print(f"report: {written['report.html']}  (per task: {per_task})")
    if earlier is not None:
        comparison = compare_audits(earlier, load_audit(written["audit.json"]), tolerance)
        (folder / "comparison.json").write_text(json.dumps(comparison.to_dict(), indent=1), encoding="utf-8")
        print_comparison(comparison)
        if not comparison.reproduced:
            raise typer.Exit(1)


def audit_compare_command(
    earlier: Path = _EARLIER_ARG, new: Path = _NEW_ARG, tolerance: float = _TOLERANCE_OPT,
    json_out: Path | None = _JSON_OUT_OPT,
) -> None:
    """Does NEW reproduce EARLIER? Verdicts, speedups and baselines of their shared tasks (exit 1 if not)."""
    comparison = compare_audits(load_audit(earlier), load_audit(new), tolerance)
    if json_out is not None:
        common.output_file(json_out).write_text(json.dumps(comparison.to_dict(), indent=1), encoding="utf-8")
    print_comparison(comparison)
    if not comparison.reproduced:
        raise typer.Exit(1)


def print_comparison(comparison: AuditComparison) -> None:
    """The comparison's lines, its verdict line in colour."""
    first, *rest = comparison.lines()
    common.console.print(Text(first, style="green" if comparison.reproduced else "red"))
    for line in rest:
        common.console.print(line, highlight=False, markup=False)


def summary_table(outcome: AuditOutcome, cfg: AuditConfig) -> Table:
    """Survival per kernel class, with the run's counts in the title."""
    line = profile_comparison(outcome.rows, cfg.survive_fraction)
    head = line[0] if line else {"correct": 0, "survive": 0, "published": 0}
    counts = (f" ({outcome.evaluated} now, {outcome.reused} reused, {outcome.skipped_for_time} left for later)"
              if outcome.evaluated or outcome.reused or outcome.skipped_for_time else "")
    table = Table(title=(f"{outcome.label}: {len(outcome.rows)}/{len(outcome.selected)} evaluated{counts}; "
                         f"{head['correct']} correct; {head['survive']}/{head['published']} "
                         "published speedups survive"))
    for col in ("kernel class", "rows", "correct", "published", "survive"):
        table.add_column(col, justify="left" if col == "kernel class" else "right")
    for name, cell in survival_table(outcome.rows, "kernel_class", cfg.survive_fraction).items():
        table.add_row(name, *(str(cell[k]) for k in ("rows", "correct", "published", "survive")))
    return table


def register(app: typer.Typer) -> None:
    """Add `cudal1 audit` and `cudal1 audit-compare` to the CLI."""
    app.command("audit")(audit_command)
    app.command("audit-compare")(audit_compare_command)
