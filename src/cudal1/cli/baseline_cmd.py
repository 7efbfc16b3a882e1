"""`cudal1 baseline`: measure and cache baselines (and the device's peaks) for a task source."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.markup import escape
from rich.table import Table

from cudal1.baselines import (
    BaselineRecord,
    baseline_cell,
    ensure_baselines,
    measure_peaks,
    null_test_summary,
    parse_kinds,
)
from cudal1.cli import common
from cudal1.cli.options import config_options
from cudal1.core.errors import SourceError
from cudal1.eval.config import EvalConfig, resolve_device
from cudal1.tasks import Task, load_tasks

_SOURCE_OPT = typer.Option(["builtin"], "--source", "-s", help="Task source(s): builtin, DIR, hf:, FILE.")
_KIND_OPT = typer.Option("eager,torch_compile,torch_compile_reduce_overhead,cuda_graph,cudnn", "--kind",
                             help="Comma-separated baselines (or `all`, which adds tf32).")
_LEVEL_OPT = typer.Option([], "--level", help="Only these levels.")
_TASK_OPT = typer.Option([], "--task", "-t", help="Only these task ids (or built-in names).")
_LIMIT_OPT = typer.Option(None, "--limit", min=1, help="At most this many tasks.")
_PEAKS_OPT = typer.Option(True, "--peaks/--no-peaks", help="Also measure the device's peaks (cached).")


@config_options(EvalConfig, common.eval_options("device", "correctness_trials", "sizes", "buckets", "timeout_s",
                                                "sandbox"), into="evaluation")
def baseline_command(
    source: list[str] = _SOURCE_OPT,
    kind: str = _KIND_OPT,
    level: list[int] = _LEVEL_OPT,
    task: list[str] = _TASK_OPT,
    limit: int | None = _LIMIT_OPT,
    store_path: Path | None = common.StoreOpt, force: bool = common.ForceOpt,
    peaks: bool = _PEAKS_OPT, evaluation: dict[str, Any] | None = None,
) -> None:
    """Time and cache baselines per task (resumable).

    Baselines: eager, torch.compile, CUDA Graph, cuDNN flags; eager also runs the null test.
    """
    kinds = parse_kinds(kind)
    cfg = common.eval_config(evaluation or {})
    tasks = _select(source, level, task, limit)
    store = common.open_store(store_path, False)
    if peaks:
        found = measure_peaks(cfg.device, store, force=force)
        common.console.print(f"peaks of {found['gpu_name']}: copy {found['copy_bytes_per_s'] / 1e9:.0f} GB/s, "
                             f"fp32 matmul {found['matmul_flops_per_s']['float32'] / 1e12:.1f} TFLOP/s")
    records: list[BaselineRecord] = []
    with common.progress_bar() as bar:
        job = bar.add_task("baselines", total=len(tasks) * len(kinds), best="")

        def on_result(t: Task, k: str, record: BaselineRecord) -> None:
            records.append(record)
            failed = sum(not r.ok for r in records)
            bar.update(job, advance=1, best=f"{t.name}:{k}" + (f"  ({failed} failed)" if failed else ""))

        ensure_baselines(tasks, kinds, cfg, store=store, force=force, on_result=on_result)
    common.console.print(baseline_table(records, kinds, f"baselines on {resolve_device(cfg.device)}"))
    summary = null_test_summary(records)
    if summary:
        common.console.print(summary)


def _select(sources: list[str], levels: list[int], ids: list[str], limit: int | None) -> list[Task]:
    tasks = [t for spec in sources for t in load_tasks(spec)]
    if levels:
        tasks = [t for t in tasks if t.level in levels]
    if ids:
        unknown = [i for i in ids if not any(i in (t.id, t.name) for t in tasks)]
        if unknown:
            raise SourceError(f"no task {', '.join(unknown)} in {', '.join(sources)}"
                              + (f" at level {', '.join(map(str, levels))}" if levels else ""))
        tasks = [t for t in tasks if t.id in ids or t.name in ids]
    if not tasks:
        raise SourceError(f"no tasks selected from {', '.join(sources)}")
    return tasks[:limit] if limit else tasks


def baseline_table(records: list[BaselineRecord], kinds: list[str], title: str) -> Table:
    """One row per task: each kind's time in ms and speedup vs eager, or `failed` (reasons listed below)."""
    table = Table(title=title, caption="ms (speedup vs eager); failures: see the store or --verbose")
    by_task: dict[str, dict[str, BaselineRecord]] = {}
    for r in records:
        by_task.setdefault(r.task_id, {})[r.name] = r
    common.add_id_column(table, by_task)
    for k in kinds:
        table.add_column(k, justify="right")
    for task_id, row in by_task.items():
        cells = []
        for k in kinds:
            cell, r = escape(baseline_cell(row.get(k))), row.get(k)
            cells.append(cell.replace("failed", "[red]failed[/red]", 1) if r is not None and not r.ok else cell)
        table.add_row(task_id, *cells)
    return table


def register(app: typer.Typer) -> None:
    """Add `cudal1 baseline` to the CLI."""
    app.command("baseline")(baseline_command)
