"""`cudal1 evaluate-policy CHECKPOINT --split test`: pass@k, success rate and speedups of a trained policy."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from cudal1.cli import common
from cudal1.cli.options import config_options
from cudal1.eval.config import EvalConfig, resolve_device
from cudal1.metrics.noise import cpu_noise_note


@config_options(EvalConfig, common.eval_options("device", "profile", "correctness_trials", "sizes", "sandbox"),
                into="evaluation")
def evaluate_policy_command(
    checkpoint: str = typer.Argument("", help="Model directory (a training stage's final/ or checkpoint)."),
    llm: str = typer.Option("", "--llm", help="Instead of a checkpoint: openai:MODEL@URL or hf:PATH."),
    source: str = typer.Option("builtin", "--source", "-s", help="Task source."),
    split: str = typer.Option("test", "--split", help="train, test or all."),
    splits_file: str = typer.Option("", "--splits-file", help="Split JSON written by training (splits.json)."),
    samples: int = typer.Option(8, "--samples", "-k", min=1, help="Completions per task."),
    temperature: float = typer.Option(1.0, "--temperature", min=0, callback=common.finite, help="Sampling temperature."),
    max_new_tokens: int = typer.Option(4096, "--max-new-tokens", min=1, help="Longest completion."),
    max_tasks: int = typer.Option(0, "--max-tasks", min=0, help="At most this many tasks (0: all)."),
    form: str = common.FormOpt,
    exemplar_db: str = typer.Option("", "--exemplar-db", help="Exemplar database of stage 3: contrastive prompts "
                                    "(as the policy was trained on) instead of plain ones."),
    # --eval-workers: its name before "workers" came to mean an evaluator pool only; still accepted.
    eval_threads: int = typer.Option(4, "--eval-threads", "--eval-workers", min=1,
                                     help="Candidates evaluated in parallel (as eval_threads in training)."),
    workers: str = common.WorkersOpt,
    output: str = typer.Option("", "--output", help="Write the JSON report here."),
    store_path: Path | None = common.StoreOpt, no_store: bool = common.NoStoreOpt,
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
    evaluation: dict[str, Any] | None = None,
) -> None:
    """Score a policy on a task split: pass@k, speedups.

    Sample k completions per task of a split, evaluate them, report pass@k and speedups (paper format).
    """
    from cudal1.train.policy_eval import PolicyEvalConfig, evaluate_policy

    cfg = PolicyEvalConfig(checkpoint=checkpoint, llm=llm, source=source, split=split, splits_file=splits_file,
                           samples=samples, temperature=temperature, max_new_tokens=max_new_tokens,
                           max_tasks=max_tasks, form=form, exemplar_db=exemplar_db,
                           output=str(common.output_file(Path(output))) if output else "")
    if workers.isdigit():  # before 2026-12 `--workers N` counted parallel candidates here, unlike elsewhere
        typer.echo(f"note: --workers {workers} is read as --eval-threads {workers}; --workers names an "
                   "evaluator pool, as in eval, optimize and serve", err=True)
        eval_threads, workers = int(workers), ""
    eval_cfg = common.eval_config(evaluation or {})
    store = common.open_store(store_path, no_store)
    from cudal1.service.evaluator import make_evaluator

    with make_evaluator(workers, eval_cfg, store=store, label=f"policy:{checkpoint or llm}") as evaluator:
        report = evaluate_policy(cfg, eval_config=eval_cfg, store=store, threads=eval_threads,
                                 evaluator=evaluator)
    if as_json:
        common.console.print(json.dumps(report.to_dict(), indent=1, default=str), markup=False, highlight=False)
        return
    table = Table(title=f"policy {checkpoint or llm} on split {split!r}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for name, value in report.table_rows():
        table.add_row(name, value)
    common.console.print(table)
    if not workers and resolve_device(eval_cfg.device) == "cpu":  # timed here, on a CPU
        common.console.print(cpu_noise_note(), style="yellow", highlight=False)


def register(app: typer.Typer) -> None:
    """Add `cudal1 evaluate-policy`."""
    app.command("evaluate-policy")(evaluate_policy_command)
