"""`cudal1 optimize TASK_ID|FILE --llm SPEC`: the iterative contrastive loop on one task (see cudal1.loops)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from cudal1.cli import common, verdicts
from cudal1.cli.options import config_options, opt, parse_sets
from cudal1.eval.config import EvalConfig
from cudal1.llm import LLMConfig
from cudal1.llm.prompts import FORM_CHOICES
from cudal1.loops.optimize import OptimizeConfig
from cudal1.tasks import Task, find_task

EvalSetOpt = typer.Option([], "--eval-set", help="Any evaluation setting as KEY=VALUE (repeatable), e.g. "
                                                 "target_bucket_ms=20 or warm_buckets=0.")
PoolOpt = typer.Option("", "--workers", "--pool", help="Evaluate through an evaluator pool: local, ray:auto or "
                                                     "ray://HOST:PORT (default: this machine, one candidate at "
                                                     "a time).")
SourceOpt = typer.Option(["builtin"], "--source", "-s", help="Where task ids are looked up.")
OutOpt = typer.Option(None, "--out", "-o", help="Best candidate file (default <task name>_best.py).")
ExemplarDbOpt = typer.Option(None, "--exemplar-db", help="Exemplar database (default: the store).")


def parse_eval_sets(items: list[str]) -> dict[str, Any]:
    """`KEY=VALUE` strings -> EvalConfig overrides, each value converted to the field's type."""
    return parse_sets(EvalConfig, items, "--eval-set")


def resolve_task(spec: str, sources: list[str]) -> Task:
    """A task id looked up in `sources`, or a path to the user's own module file."""
    from cudal1.tasks.sources import load_file

    path = Path(spec)
    if path.suffix == ".py" and path.is_file():
        return load_file(path)
    return find_task(spec, sources)


def open_pool(spec: str, config: EvalConfig, store: Any) -> Any:
    """An evaluator pool from `--workers` (alias `--pool`), or None when it is empty."""
    if not spec:
        return None
    from cudal1.service import make_pool

    return make_pool(spec, config, store=store)


OPTIMIZE_FIELDS = [
    opt("rounds", min=1), opt("samples", min=1), opt("sampler"),
    opt("form", callback=common.choice(*FORM_CHOICES)), opt("feedback", "--feedback/--no-feedback"), opt("seed"),
    opt("run_name"), opt("resume", "--resume/--fresh"),
    opt("seed_from_store", "--seed-from-store/--no-seed-from-store"), opt("baselines"),
    opt("time_budget_s", min=0),
]
LLM_FIELDS = [opt("temperature", min=0), opt("max_tokens", min=1), opt("concurrency", min=1),
              opt("max_retries", min=0)]
EVAL_FIELDS = common.eval_options("device", "profile", "correctness_trials", "sizes", "buckets", "timeout_s",
                                  "sandbox")


@config_options(OptimizeConfig, OPTIMIZE_FIELDS, into="settings")
@config_options(LLMConfig, LLM_FIELDS, into="sampling")
@config_options(EvalConfig, EVAL_FIELDS, into="evaluation")
def optimize_command(
    task: str = typer.Argument(..., help="Task id (looked up in --source) or a module file (Model, get_inputs, "
                                          "get_init_inputs)."),
    llm: str = typer.Option(..., "--llm", help="Model: 'openai:MODEL@http://host:port/v1' or 'hf:PATH'."),
    source: list[str] = SourceOpt,
    eval_set: list[str] = EvalSetOpt,
    out: Path | None = OutOpt,
    store_path: Path | None = common.StoreOpt,
    exemplar_db: Path | None = ExemplarDbOpt,
    pool: str = PoolOpt,
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
    settings: dict[str, Any] | None = None, sampling: dict[str, Any] | None = None,
    evaluation: dict[str, Any] | None = None,
) -> None:
    """Make one task faster with an LLM, verified.

    Make one task faster: LLM samples, verified by the evaluator, fed back as scored exemplars.
    """
    from cudal1.loops.optimize import LLMUnavailableError, optimize

    eval_cfg = common.eval_config(evaluation or {}, eval_set, "--eval-set")
    config = OptimizeConfig(llm=LLMConfig(spec=llm, **(sampling or {})), eval=eval_cfg,
                            out=str(common.output_file(out)) if out else None,
                            exemplar_db=str(exemplar_db) if exemplar_db else None, **(settings or {}))
    the_task = resolve_task(task, source)
    from cudal1.llm import make_backend

    backend = make_backend(config.llm)  # before any output: a missing extra is the only line printed
    store = common.open_store(store_path, False)
    evaluator_pool = open_pool(pool, eval_cfg, store)
    try:
        with common.progress_bar() as bar:
            job = bar.add_task(f"optimizing {the_task.name}", total=config.rounds * config.samples, best="", visible=not as_json)

            def on_event(event: Any) -> None:
                bar.update(job, advance=1 if event.kind == "sample" else 0,
                           best=f"round {event.round}: {_best_so_far(event)}")

            result = optimize(the_task, config, backend=backend, store=store, pool=evaluator_pool,
                              progress=on_event)
    finally:
        if evaluator_pool is not None:
            evaluator_pool.close()
        store.close()
    if result.failure:  # e.g. the server is down: no table, since its only result would be the store's
        raise LLMUnavailableError(result.failure)
    _report(result, as_json)
    if result.best_result is None:
        raise typer.Exit(1)


def _best_so_far(event: Any) -> str:
    """The progress line's best, saying when it is a candidate the store knew before this run."""
    if not event.best_speedup:
        return "no correct candidate yet"
    return f"best {event.best_speedup:.2f}x" + (" (stored earlier)" if event.best_from_store else "")


def _report(result: Any, as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(result.to_dict(), default=str))
        return
    from rich.table import Table

    table = Table(title=f"{result.task_id}: run {result.run_id}" + (" (resumed)" if result.resumed else ""),
                  title_justify="left")
    reused = any(h.reused for h in result.history)  # columns with a value in some row only
    errors = any(h.generation_errors for h in result.history)
    columns = ["round", "prompt", "samples", *(["reused"] if reused else []),
               *(["gen. errors"] if errors else []), "verdicts", "best", "best so far"]
    for col in columns:
        table.add_column(col, overflow="fold", justify="right" if col.startswith("best") else "left")
    for h in result.history:
        counts = ", ".join(f"{k} {v}" for k, v in sorted(h.statuses.items()))
        cells = [str(h.round), h.prompt_kind + (" +feedback" if h.with_feedback else ""), str(h.samples),
                 *([str(h.reused)] if reused else []), *([str(h.generation_errors)] if errors else []),
                 counts,
                 verdicts.fmt(h.best_speedup, ".2f", "x"), verdicts.fmt(h.best_so_far, ".2f", "x")]
        table.add_row(*cells)
    common.console.print(table)
    if result.stopped:
        common.console.print(f"stopped early: {result.stopped}")
    if result.best_result is None:
        common.console.print("[red]no correct candidate found[/red]")
        return
    verdicts.print_verdicts(common.console, [(result.task_id, result.best_result)], "best verified candidate")
    if result.best_origin.get("origin") == "store":
        run = result.best_origin.get("run")
        common.console.print("(a candidate the store already knew" + (f", from run {run}" if run else "")
                             + ": this run found none faster)")
    common.console.print(f"written to {result.out_path} (and {result.sidecar_path})")


def register(app: typer.Typer) -> None:
    """Add `cudal1 optimize` to the CLI."""
    app.command("optimize")(optimize_command)
