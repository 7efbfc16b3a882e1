"""`cudal1 audit RELEASE.jsonl`: re-evaluate a published kernel collection here, resumably, and report."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from rich.table import Table
from rich.text import Text

from cudal1.audit import AuditConfig, AuditOutcome, profile_comparison, run_audit, survival_table
from cudal1.audit.compare import DEFAULT_TOLERANCE, AuditComparison, compare_audits, load_audit
from cudal1.audit.explain import explain_changes
from cudal1.audit.run import asked_by_runs, collect_audit, measured_on, report_audit, report_only_config
from cudal1.audit.saved import SavedAudit, load_saved_audit, report_saved_audit, saved_audit_path
from cudal1.baselines import parse_kinds
from cudal1.cli import common
from cudal1.cli.options import config_options
from cudal1.core.errors import MissingDependencyError, SourceError
from cudal1.core.types import EvalResult
from cudal1.eval.config import EvalConfig, profile_choices
from cudal1.metrics.rows import ResultRow
from cudal1.report import plots_available
from cudal1.tasks import Task

_RELEASE_OPT = typer.Argument(None, help="JSONL release in CUDA-L1's schema (e.g. h100.jsonl); optional when "
                                         "--report-only reports a saved audit.json.", show_default=False)
_PROFILE_OPT = typer.Option(None, "--profile", help=f"Correctness profile (default strict): "
                                                    f"{profile_choices(typed=True)}.",
                            show_default=False, callback=lambda value: None if value is None else
                            common.check_profile(value))
_LEVEL_OPT = typer.Option([], "--level", help="Only these levels.")
_SAMPLE_PER_LEVEL_OPT = typer.Option(None, "--sample-per-level", help="K items per level (seeded).")
_SEED_OPT = typer.Option(0, "--seed", help="Seed of --sample-per-level.")
_LIMIT_OPT = typer.Option(None, "--limit", min=1, help="At most N selected items.")
_CHUNK_OPT = typer.Option(None, "--chunk", help="Only chunk I/N of the selection, e.g. 2/5.")
_BASELINES_OPT = typer.Option("", "--baselines", help="Baselines to measure too, e.g. eager,cuda_graph.")
_OUT_OPT = typer.Option(None, "--out", "-o", help="Report folder (default audit-RELEASE-PROFILE).")
_TIME_BUDGET_S_OPT = typer.Option(None, "--time-budget-s", callback=common.positive, help="Stop starting batches after this.")
_BATCH_SIZE_OPT = typer.Option(16, "--batch-size", help="Items per parallel-build batch.")
_PLOTS_OPT = typer.Option(None, "--plots/--no-plots", show_default=False,
                          help="Draw plots (matplotlib, the report extra); default: when matplotlib is "
                               "installed.")
_REPORT_ONLY_OPT = typer.Option(False, "--report-only", help=(
    "Evaluate nothing; report the stored results of the GPU with the most of them (works without a GPU, e.g. "
    "on a store copied from the GPU machine)."))
_GPU_OPT = typer.Option(None, "--gpu", help="With --report-only: the GPU name whose results to report.")
_FROM_AUDIT_OPT = typer.Option(None, "--from-audit", help=(
    "With --report-only: report this saved audit.json (or its report folder, e.g. a committed one) instead "
    "of a store. Without --store, and with no store at the default place, the --out folder's audit.json is "
    "used."))
_COMPARE_TO_OPT = typer.Option(None, "--compare-to", help=(
    "An earlier audit.json (or its report folder): compare the shared tasks with it, write comparison.json, "
    "exit 1 when this run does not reproduce it."))
_TOLERANCE_OPT = typer.Option(DEFAULT_TOLERANCE, "--tolerance", min=0.001, callback=common.finite, help=(
    "New/earlier speedup medians must lie within x(1+T) either way (0.1: 0.909-1.100)."))
_EARLIER_ARG = typer.Argument(..., help="The earlier audit.json (or its report folder).")
_NEW_ARG = typer.Argument(..., help="The new audit.json (or its report folder).")
_JSON_OUT_OPT = typer.Option(None, "--json", help="Also write the comparison as JSON here.")


@config_options(EvalConfig, common.eval_options("device", "correctness_trials", "sizes", "buckets", "timeout_s",
                                                "sandbox"), into="evaluation")
def audit_command(
    release: Path | None = _RELEASE_OPT,
    profile: str | None = _PROFILE_OPT,
    level: list[int] = _LEVEL_OPT,
    sample_per_level: int | None = _SAMPLE_PER_LEVEL_OPT,
    seed: int = _SEED_OPT,
    limit: int | None = _LIMIT_OPT,
    chunk: str | None = _CHUNK_OPT,
    baselines: str = _BASELINES_OPT,
    out: Path | None = _OUT_OPT,
    time_budget_s: float | None = _TIME_BUDGET_S_OPT,
    batch_size: int = _BATCH_SIZE_OPT,
    store_path: Path | None = common.StoreOpt, force: bool = common.ForceOpt,
    plots: bool | None = _PLOTS_OPT, report_only: bool = _REPORT_ONLY_OPT, gpu: str | None = _GPU_OPT,
    from_audit: Path | None = _FROM_AUDIT_OPT,
    compare_to: Path | None = _COMPARE_TO_OPT, tolerance: float = _TOLERANCE_OPT,
    evaluation: dict[str, Any] | None = None,
) -> None:
    """Audit a release: which published speedups survive.

    Verdict, speedup, kernel class and flags next to each published score; which speedups survive.
    """
    earlier = load_audit(compare_to) if compare_to is not None else None  # a bad path fails before any work
    if plots and not plots_available():
        raise MissingDependencyError("matplotlib", "report", "report plots (or --no-plots)")
    plots = plots_available() if plots is None else plots
    if gpu and not report_only:
        raise typer.BadParameter("--gpu chooses whose results a report shows: use it with --report-only")
    if from_audit is not None and not report_only:
        raise typer.BadParameter("--from-audit reports a saved audit: use it with --report-only")
    default_out = Path(f"audit-{release.stem}-{profile or 'strict'}") if release is not None else None
    saved = _saved_source(from_audit, store_path, out or default_out) if report_only else None
    if saved is not None:
        audit = _check_saved(load_saved_audit(saved), release, profile, gpu, level, sample_per_level, limit)
        folder = common.output_folder(out or Path(f"audit-{audit.release_name}-{audit.profile}"))
        written = _report_saved(audit, folder, plots)
    else:
        if release is None:
            raise SourceError("give the RELEASE file to audit (a JSONL release in CUDA-L1's schema)")
        if not release.is_file():
            raise SourceError(f"no such release file: {release}")
        cfg = AuditConfig(
            release=str(release), profile=profile or "strict", levels=tuple(level),
            sample_per_level=sample_per_level, seed=seed, limit=limit, chunk=chunk,
            baselines=tuple(parse_kinds(baselines)) if baselines else (), batch_size=batch_size,
            time_budget_s=time_budget_s, force=force,
            eval_config=common.eval_config({**(evaluation or {}), "profile": profile or "strict"}))
        store = common.open_existing_store(store_path) if report_only else common.open_store(store_path, False)
        folder = common.check_output_folder(out or default_out)  # made when written: no empty folder left
        with common.writing_into(folder):
            written = _audit_store(cfg, store, folder, report_only=report_only, gpu=gpu, plots=plots)
    if earlier is not None:
        comparison = compare_audits(earlier, load_audit(written["audit.json"]), tolerance)
        (folder / "comparison.json").write_text(json.dumps(comparison.to_dict(), indent=1), encoding="utf-8")
        print_comparison(comparison)
        if not comparison.reproduced:
            raise typer.Exit(1)


def _audit_store(cfg: AuditConfig, store: Any, folder: Path, *, report_only: bool, gpu: str | None,
                 plots: bool) -> dict[str, Path]:
    """Run the audit (or, report-only, read its stored results) and write its report into `folder`."""
    if report_only:
        cfg = report_only_config(cfg, store, gpu)
        common.console.print(measured_on(cfg.environment))
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
    _print_written(written)
    return written


def _saved_source(from_audit: Path | None, store_path: Path | None, folder: Path | None) -> Path | None:
    """The saved audit.json a --report-only run reports from, or None to report from the results store:
    --from-audit; else, without --store and without a store at the default place, the output folder's."""
    from cudal1.store import default_store_path

    if from_audit is not None:
        if store_path is not None:
            raise SourceError("give --store or --from-audit, not both")
        return saved_audit_path(from_audit)
    if store_path is not None or default_store_path().is_file():
        return None
    if folder is not None and (folder / "audit.json").is_file():
        return folder / "audit.json"
    where = f"in {folder}" if folder is not None else "to report (no --out folder)"
    raise SourceError(f"no results store at {default_store_path()} and no audit.json {where}: give --store "
                      "PATH, or --from-audit AUDIT.json (a saved audit report)")


def _check_saved(audit: SavedAudit, release: Path | None, profile: str | None, gpu: str | None,
                 level: list[int], sample_per_level: int | None, limit: int | None) -> SavedAudit:
    """`audit`, unless the options ask for other results or for a selection, which only a store can make:
    then a one-line SourceError."""
    if level or sample_per_level is not None or limit is not None:
        raise SourceError(f"--level, --sample-per-level and --limit select results from a store; {audit.path} "
                          "is reported whole")
    return audit.check(release=release, profile=profile, gpu=gpu)


def _report_saved(audit: SavedAudit, folder: Path, plots: bool) -> dict[str, Path]:
    """Write the report of a saved audit into `folder`, with the same summary lines as from a store."""
    common.console.print(f"reporting results measured on {audit.machine}, saved in {audit.path}")
    written = report_saved_audit(audit, folder, plots=plots)
    common.console.print(_survival_summary(audit.label, audit.own_rows, audit.selected, audit.fraction))
    _print_written(written)
    return written


def _print_written(written: dict[str, Path]) -> None:
    per_task = ", ".join(str(written[name]) for name in ("audit_tasks.md", "audit_baselines.md") if name in written)
    common.console.print(f"report: {written['report.html']}  (per task: {per_task})")


_EXPLAIN_OPT = typer.Option(False, "--explain", help=(
    "Name the protocol change that explains each changed verdict (for audits under different protocols)."))


def audit_compare_command(
    earlier: Path = _EARLIER_ARG, new: Path = _NEW_ARG, tolerance: float = _TOLERANCE_OPT,
    json_out: Path | None = _JSON_OUT_OPT, explain: bool = _EXPLAIN_OPT,
) -> None:
    """Does NEW reproduce EARLIER? Exit 1 if not.

    Compares the verdicts, speedups and baselines of the tasks both audits hold.
    """
    a, b = load_audit(earlier), load_audit(new)
    comparison = compare_audits(a, b, tolerance)
    explained = explain_changes(a, b) if explain else None
    if json_out is not None:
        document = {**comparison.to_dict(), **({"explained": explained} if explained is not None else {})}
        common.output_file(json_out).write_text(json.dumps(document, indent=1), encoding="utf-8")
    print_comparison(comparison)
    if explained is not None:
        for change in explained["changes"]:
            common.console.print(f"{change['task_id']}: {change['earlier']} -> {change['new']}: "
                                 f"{'; '.join(change['changes']) or 'unexplained'} ({change['evidence']})",
                                 highlight=False, markup=False)
        for name, count in explained["by_change"].items():
            common.console.print(f"{count:4d}  {name}", highlight=False, markup=False)
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
    counts = (f" ({outcome.evaluated} now, {outcome.reused} reused, {outcome.skipped_for_time} left for later)"
              if outcome.evaluated or outcome.reused or outcome.skipped_for_time else "")
    return _survival_summary(outcome.label, outcome.rows, len(outcome.selected), cfg.survive_fraction, counts)


def _survival_summary(label: str, rows: list[ResultRow], selected: int, fraction: float, counts: str = "") -> Table:
    line = profile_comparison(rows, fraction)
    head = line[0] if line else {"correct": 0, "survive": 0, "published": 0}
    table = Table(title=(f"{label}: {len(rows)}/{selected} evaluated{counts}; {head['correct']} correct; "
                         f"{head['survive']}/{head['published']} published speedups survive"))
    for col in ("kernel class", "rows", "correct", "published", "survive"):
        table.add_column(col, justify="left" if col == "kernel class" else "right")
    for name, cell in survival_table(rows, "kernel_class", fraction).items():
        table.add_row(name, *(str(cell[k]) for k in ("rows", "correct", "published", "survive")))
    return table


def register(app: typer.Typer) -> None:
    """Add `cudal1 audit` and `cudal1 audit-compare` to the CLI."""
    app.command("audit")(audit_command)
    app.command("audit-compare")(audit_compare_command)
