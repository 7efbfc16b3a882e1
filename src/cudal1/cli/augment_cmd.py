"""`cudal1 augment --llm A --llm B ... --source ...`: stage-1 SFT data (see cudal1.loops.augment)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from cudal1.cli import common
from cudal1.cli.optimize_cmd import EvalSetOpt, PoolOpt, open_pool
from cudal1.cli.options import config_options, opt
from cudal1.eval.config import EvalConfig
from cudal1.llm.prompts import FORM_CHOICES
from cudal1.loops.augment import AugmentConfig

LlmOpt = typer.Option([], "--llm", help="A model spec (repeat for several models).")
SourceOpt = typer.Option(["builtin"], "--source", "-s", help="Task sources to generate for.")
TaskOpt = typer.Option([], "--task", "-t", help="Only these task ids (repeatable).")
LevelOpt = typer.Option([], "--level", help="Only these levels (repeatable).")
FromReleaseOpt = typer.Option([], "--from-release", help="Import a JSONL release's candidates that pass "
                                                         "the evaluator (repeatable).")
OutDirOpt = typer.Option(Path("augment_data"), "--out-dir", "-o", help="Writes sft.jsonl and dataset/.")


AUGMENT_FIELDS = [
    opt("max_tasks", min=0), opt("splits_file"), opt("samples", min=1), opt("keep", min=1),
    opt("max_slowdown", callback=common.positive), opt("form", callback=common.choice(*FORM_CHOICES)),
    opt("contrastive", "--contrastive/--plain"), opt("from_examples"), opt("hf_dataset", "--hf-dataset/--no-hf-dataset"),
    opt("temperature", min=0), opt("max_tokens", min=1), opt("concurrency", min=1), opt("max_retries", min=0),
    opt("seed"), opt("run_name"), opt("resume", "--resume/--fresh"),
]
EVAL_FIELDS = common.eval_options("device", "profile", "correctness_trials", "sizes", "buckets", "timeout_s",
                                  "sandbox")


@config_options(AugmentConfig, AUGMENT_FIELDS, into="settings")
@config_options(EvalConfig, EVAL_FIELDS, into="evaluation")
def augment_command(
    llm: list[str] = LlmOpt,
    source: list[str] = SourceOpt,
    task: list[str] = TaskOpt,
    level: list[int] = LevelOpt,
    from_release: list[Path] = FromReleaseOpt,
    out_dir: Path = OutDirOpt,
    eval_set: list[str] = EvalSetOpt,
    store_path: Path | None = common.StoreOpt,
    pool: str = PoolOpt,
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
    settings: dict[str, Any] | None = None, evaluation: dict[str, Any] | None = None,
) -> None:
    """Build stage-1 SFT data from LLMs or releases.

    Build stage-1 SFT data: several models write variants per task; keep the executable, correct ones.
    """
    from cudal1.loops.augment import augment, ready_backends

    eval_cfg = common.eval_config(evaluation or {}, eval_set, "--eval-set")
    config = AugmentConfig(llms=list(llm), sources=list(source), task_ids=list(task), levels=list(level),
                           from_release=[str(p) for p in from_release], eval=eval_cfg, out_dir=str(out_dir),
                           **(settings or {}))
    backends = ready_backends(config)  # before any output: a missing extra is the only line printed
    store = common.open_store(store_path, False)
    evaluator_pool = open_pool(pool, eval_cfg, store)
    try:
        with common.progress_bar() as bar:
            job = bar.add_task("augmenting", total=None, best="", visible=not as_json)

            def on_progress(phase: str, done: int, total: int) -> None:
                bar.update(job, description=phase, completed=done, total=total)

            result = augment(config, backends=backends, store=store, pool=evaluator_pool,
                             progress=on_progress)
    finally:
        if evaluator_pool is not None:
            evaluator_pool.close()
        store.close()
    if as_json:
        typer.echo(json.dumps(result.to_dict()))
    else:
        _print_result(result)


def _print_result(result: Any) -> None:
    """The summary table of an augment run and where its data went."""
    from rich.table import Table

    table = Table(title=f"augment run {result.run_id}: {len(result.examples)} examples", title_justify="left")
    errors = any(row["generation_errors"] for row in result.stats)  # a column with a value in some row only
    table.add_column("model", overflow="fold")
    common.add_id_column(table, [row["task_id"] for row in result.stats])
    for col in ("samples", *(["gen. errors"] if errors else []), "correct", "kept"):
        table.add_column(col, justify="right")
    for row in result.stats:
        failed = [str(row["generation_errors"])] if errors else []
        table.add_row(model_name(row["model"]), row["task_id"], str(row["generated"]), *failed,
                      str(row["correct"]), str(row["kept"]))
    common.console.print(table)
    where = f" and {result.dataset_path}" if result.dataset_path else ""
    common.console.print(f"written to {result.jsonl_path}{where}")


def model_name(spec: str) -> str:
    """The model of a spec (`openai:MODEL@URL` -> MODEL), or a release's or the examples' label as it is."""
    kind, sep, rest = spec.partition(":")
    return rest.split("@", 1)[0] if sep and kind in ("openai", "hf") else spec


def register(app: typer.Typer) -> None:
    """Add `cudal1 augment` to the CLI."""
    app.command("augment")(augment_command)
