"""`cudal1 augment --llm A --llm B ... --source ...`: stage-1 SFT data (see cudal1.loops.augment)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from cudal1.cli import common
from cudal1.cli.optimize_cmd import EvalSetOpt, PoolOpt, open_pool, parse_eval_sets
from cudal1.eval.config import EvalConfig

LlmOpt = typer.Option([], "--llm", help="A model spec (repeat for several models).")
SourceOpt = typer.Option(["builtin"], "--source", "-s", help="Task sources to generate for.")
TaskOpt = typer.Option([], "--task", "-t", help="Only these task ids (repeatable).")
LevelOpt = typer.Option([], "--level", help="Only these levels (repeatable).")
FromReleaseOpt = typer.Option([], "--from-release", help="Import a JSONL release's candidates that pass "
                                                         "the evaluator (repeatable).")
OutDirOpt = typer.Option(Path("augment_data"), "--out-dir", "-o", help="Writes sft.jsonl and dataset/.")


def augment_command(
    llm: list[str] = LlmOpt,
    source: list[str] = SourceOpt,
    task: list[str] = TaskOpt,
    level: list[int] = LevelOpt,
    max_tasks: int = typer.Option(0, "--max-tasks", min=0, help="At most this many tasks (0: all)."),
    splits_file: str = typer.Option("", "--splits-file", help="Split JSON written by training: only its train "
                                    "tasks are used (held-out tasks stay out of the SFT data)."),
    samples: int = typer.Option(4, "--samples", min=1, help="Completions per task per model."),
    keep: int = typer.Option(2, "--keep", min=1, help="At most this many examples per task per model."),
    max_slowdown: float = typer.Option(1000.0, "--max-slowdown", callback=common.positive,
                                       help="Keep only candidates at most this many times slower than the "
                                            "reference."),
    form: str = common.FormOpt,
    contrastive: bool = typer.Option(True, "--contrastive/--plain", help="Contrastive prompts once exemplars exist."),
    from_release: list[Path] = FromReleaseOpt,
    from_examples: bool = typer.Option(False, "--from-examples",
                                       help="Import cudal1's example candidates that run here "
                                            "(PyTorch-level ones on a CPU) once they pass the evaluator: "
                                            "stage-1 data without an LLM."),
    out_dir: Path = OutDirOpt,
    no_hf_dataset: bool = typer.Option(False, "--no-hf-dataset", help="Write only the JSONL."),
    device: str = common.DeviceOpt, profile: str = common.ProfileOpt, trials: int = common.TrialsOpt,
    sizes: str = common.SizesOpt, buckets: int = common.BucketsOpt, timeout_s: float = common.TimeoutOpt,
    sandbox: str = common.SandboxOpt, eval_set: list[str] = EvalSetOpt,
    temperature: float = typer.Option(1.0, "--temperature", min=0, callback=common.finite, help="Sampling temperature."),
    max_tokens: int = typer.Option(8192, "--max-tokens", min=1, help="Maximum completion tokens per sample."),
    concurrency: int = typer.Option(16, "--concurrency", min=1, help="Requests in flight per model."),
    max_retries: int = typer.Option(5, "--max-retries", min=0, help="Retries of a failed request."),
    seed: int = typer.Option(0, "--seed", help="Seed of exemplar sampling."),
    run_name: str = typer.Option("", "--run-name", help="Run to create or continue (default: from the settings)."),
    fresh: bool = typer.Option(False, "--fresh", help="Start a new run instead of continuing an identical one."),
    store_path: Path | None = common.StoreOpt,
    pool: str = PoolOpt,
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
) -> None:
    """Build stage-1 SFT data from LLMs or releases.

    Build stage-1 SFT data: several models write variants per task; keep the executable, correct ones.
    """
    from cudal1.loops.augment import AugmentConfig, augment

    eval_cfg = EvalConfig(**{**dict(device=device, profile=profile, correctness_trials=trials, sizes=sizes,
                                    buckets=buckets, timeout_s=timeout_s, sandbox=sandbox), **parse_eval_sets(eval_set)})
    config = AugmentConfig(llms=list(llm), sources=list(source), task_ids=list(task), levels=list(level),
                           max_tasks=max_tasks, splits_file=splits_file, samples=samples, keep=keep, max_slowdown=max_slowdown, form=form,
                           contrastive=contrastive, from_release=[str(p) for p in from_release],
                           from_examples=from_examples, eval=eval_cfg,
                           out_dir=str(out_dir), hf_dataset=not no_hf_dataset, temperature=temperature,
                           max_tokens=max_tokens, concurrency=concurrency, max_retries=max_retries, seed=seed,
                           run_name=run_name, resume=not fresh)
    from cudal1.loops.augment import ready_backends

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
        return
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
