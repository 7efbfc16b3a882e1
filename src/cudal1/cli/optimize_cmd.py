"""`cudal1 optimize TASK_ID|FILE --llm SPEC`: the iterative contrastive loop on one task (see cudal1.loops)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import typer

from cudal1.cli import common, verdicts
from cudal1.core.errors import ConfigError
from cudal1.eval.config import EvalConfig
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
    """`KEY=VALUE` strings -> EvalConfig overrides, each value converted to the field's default's type."""
    defaults = EvalConfig()
    names = {f.name for f in dataclasses.fields(EvalConfig)}
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or key not in names:
            raise ConfigError(f"bad --eval-set {item!r}: use KEY=VALUE with KEY one of {', '.join(sorted(names))}")
        default = getattr(defaults, key)
        raw = raw.strip()
        try:
            if raw.lower() in ("none", "null") and (default is None or key == "memory_bytes"):
                value: Any = None
            elif isinstance(default, bool):
                if raw.lower() not in ("true", "false", "1", "0", "yes", "no"):
                    raise ValueError(raw)
                value = raw.lower() in ("true", "1", "yes")
            elif isinstance(default, int):
                value = int(raw)
            elif isinstance(default, float):
                value = float(raw)
            else:
                value = raw
        except ValueError:
            raise ConfigError(f"bad value for --eval-set {key}: {raw!r}") from None
        out[key] = value
    return out


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


def optimize_command(
    task: str = typer.Argument(..., help="Task id (looked up in --source) or a module file (Model, get_inputs, "
                                          "get_init_inputs)."),
    llm: str = typer.Option(..., "--llm", help="Model: 'openai:MODEL@http://host:port/v1' or 'hf:PATH'."),
    rounds: int = typer.Option(4, "--rounds", min=1, help="Rounds of generate -> evaluate -> update."),
    samples: int = typer.Option(8, "--samples", min=1, help="Completions per round, generated in parallel."),
    sampler: str = typer.Option("bucket", "--sampler", help="Exemplar sampler: bucket, island or random."),
    form: str = common.FormOpt,
    source: list[str] = SourceOpt,
    device: str = common.DeviceOpt, profile: str = common.ProfileOpt, trials: int = common.TrialsOpt,
    sizes: str = common.SizesOpt,
    buckets: int = common.BucketsOpt, timeout_s: float = common.TimeoutOpt, sandbox: str = common.SandboxOpt,
    eval_set: list[str] = EvalSetOpt,
    feedback: bool = typer.Option(True, "--feedback/--no-feedback", help="Feed the last round's failure back."),
    seed: int = typer.Option(0, "--seed", help="Seed of exemplar sampling."),
    out: Path | None = OutOpt,
    run_name: str = typer.Option("", "--run-name", help="Run to create or continue (default: from the settings)."),
    fresh: bool = typer.Option(False, "--fresh", help="Start a new run instead of continuing an identical one."),
    store_path: Path | None = common.StoreOpt,
    exemplar_db: Path | None = ExemplarDbOpt,
    seed_from_store: bool = typer.Option(True, "--seed-from-store/--no-seed-from-store",
                                         help="Start from the correct candidates the store already knows."),
    baselines: str = typer.Option("auto", "--baselines", help="Baselines for the header: auto, none or a list."),
    time_budget_s: float = typer.Option(0.0, "--time-budget-s", min=0, callback=common.finite,
                                        help="Stop after this many seconds (0: none)."),
    temperature: float = typer.Option(1.0, "--temperature", min=0, callback=common.finite, help="Sampling temperature."),
    max_tokens: int = typer.Option(8192, "--max-tokens", min=1, help="Maximum completion tokens per sample."),
    concurrency: int = typer.Option(16, "--concurrency", min=1, help="Requests in flight."),
    max_retries: int = typer.Option(5, "--max-retries", min=0, help="Retries of a failed request."),
    pool: str = PoolOpt,
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Make one task faster with an LLM, verified.

    Make one task faster: LLM samples, verified by the evaluator, fed back as scored exemplars.
    """
    from cudal1.llm import LLMConfig
    from cudal1.loops.optimize import LLMUnavailableError, OptimizeConfig, optimize

    eval_cfg = EvalConfig(**{**dict(device=device, profile=profile, correctness_trials=trials, sizes=sizes,
                                    buckets=buckets, timeout_s=timeout_s, sandbox=sandbox), **parse_eval_sets(eval_set)})
    config = OptimizeConfig(
        llm=LLMConfig(spec=llm, temperature=temperature, max_tokens=max_tokens, concurrency=concurrency,
                      max_retries=max_retries),
        rounds=rounds, samples=samples, sampler=sampler, form=form, eval=eval_cfg, feedback=feedback, seed=seed,
        out=str(common.output_file(out)) if out else None, run_name=run_name, resume=not fresh,
        exemplar_db=str(exemplar_db) if exemplar_db else None, seed_from_store=seed_from_store,
        baselines=baselines, time_budget_s=time_budget_s)
    the_task = resolve_task(task, source)
    from cudal1.llm import make_backend

    backend = make_backend(config.llm)  # before any output: a missing extra is the only line printed
    store = common.open_store(store_path, False)
    evaluator_pool = open_pool(pool, eval_cfg, store)
    try:
        with common.progress_bar() as bar:
            job = bar.add_task(f"optimizing {the_task.name}", total=rounds * samples, best="", visible=not as_json)

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
