"""`cudal1 eval`: evaluate one candidate, or a batch (a JSONL release or a folder of candidates)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from cudal1.cli import common, verdicts
from cudal1.cli.options import config_options
from cudal1.core.errors import SourceError
from cudal1.core.types import EvalResult
from cudal1.eval import evaluate_candidate
from cudal1.eval.config import EvalConfig, resolve_device
from cudal1.service.evaluator import make_evaluator
from cudal1.tasks import Task, find_task, load_tasks
from cudal1.tasks.sources import load_candidates, load_file

SetOpt = typer.Option([], "--set", help="Any other evaluation setting as KEY=VALUE (repeatable), e.g. "
                                        "target_bucket_ms=20 or warm_buckets=0 (docs/configuration.md).")
EVAL_FIELDS = common.eval_options("device", "profile", "correctness_trials", "sizes", "buckets", "timeout_s",
                                  "sandbox", "policy", "round_toward_one", "estimator", "bracket_work_ms",
                                  "runner_pairs")


@config_options(EvalConfig, EVAL_FIELDS, into="evaluation")
def eval_command(
    candidate: Path | None = typer.Option(None, "--candidate", "-c", help="Candidate: a module defining ModelNew, or a "
                                      "kernel-form spec (JSON: docs/kernel_form.md)."),
    ref: Path | None = typer.Option(None, "--ref", help="Reference module file (Model, get_inputs, get_init_inputs)."),
    task: str | None = typer.Option(None, "--task", "-t", help="Task id instead of --ref."),
    source: list[str] = typer.Option(["builtin"], "--source", "-s", help="Where --task ids are looked up."),
    release: Path | None = typer.Option(None, "--release", help="Batch: every candidate of a JSONL release."),
    candidates_dir: Path | None = typer.Option(None, "--candidates-dir",
                                               help="Batch: a folder of NAME.py (or kernel-form "
                                                    "NAME.json) candidates for --source's tasks."),
    limit: int | None = typer.Option(None, "--limit", min=1, help="Batch: at most this many candidates."),
    level: list[int] = typer.Option([], "--level", help="Batch: only these levels."),
    store_path: Path | None = common.StoreOpt, no_store: bool = common.NoStoreOpt, force: bool = common.ForceOpt,
    label: str = typer.Option("", "--label", help="Label stored with the results (e.g. a model name)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object per candidate."),
    workers: str = typer.Option("", "--workers", help="Batch: evaluate through an evaluator pool: local (one slot "
                                                      "per local GPU), ray:auto or ray://HOST:PORT, or a reward "
                                                      "server's http(s)://HOST:PORT (default: this process, "
                                                      "builds first)."),
    sets: list[str] = SetOpt,
    evaluation: dict[str, Any] | None = None,
) -> None:
    """Evaluate candidates: verdict, speedup, flags.

    The speedup is vs eager PyTorch, with cold and warm L2 caches, with its stability across timing buckets.
    """
    cfg = common.eval_config(evaluation or {}, sets)
    pairs = _collect(candidate, ref, task, source, release, candidates_dir)
    if level:
        pairs = [(t, s) for t, s in pairs if t.level in level]
    pairs = pairs[:limit] if limit else pairs
    if not pairs:
        raise SourceError("nothing to evaluate: the selection holds no candidate")
    store = common.open_store(store_path, no_store)
    run_id = store.start_run("eval", {"config": cfg.to_dict(), "n": len(pairs)}) if store and len(pairs) > 1 else None
    rows: list[tuple[str, EvalResult]] = []
    with common.progress_bar() as bar:
        job = bar.add_task("evaluating", total=len(pairs), best="", visible=len(pairs) > 1 and not as_json)

        def on_build(done: int, total: int) -> None:
            bar.update(job, description=f"building {done}/{total}")

        def on_result(t: Task, result: EvalResult) -> None:
            rows.append((t.id, result))
            if as_json:
                typer.echo(json.dumps(result.to_dict()))
            best = max((r.speedup for _, r in rows if r.speedup), default=None)
            bar.update(job, advance=1, description="evaluating", best=f"best {best:.2f}x" if best else "")

        if len(pairs) == 1 and not workers:  # one candidate: no build pool, no spare worker
            on_result(pairs[0][0], evaluate_candidate(pairs[0][0], pairs[0][1], cfg, store=store, force=force,
                                                      label=label, run_id=run_id))
        else:  # this process (builds in parallel first, then the evaluations) or a pool (one slot per GPU)
            with make_evaluator(workers or "", cfg, store=store, label=label, run_id=run_id) as evaluator:
                evaluator.evaluate(pairs, on_result=lambda i, result: on_result(pairs[i][0], result),
                                   on_build=on_build, force=force)
    if store and run_id:
        store.finish_run(run_id, {"n": len(rows), "correct": sum(r.status.is_success for _, r in rows)})
    if as_json:  # stdout stays one JSON object per line; how to read the numbers goes to stderr
        for note in verdicts.notes(rows):
            typer.echo(f"note: {note}", err=True)
    else:
        n = len(rows)
        verdicts.print_verdicts(common.console, rows, f"{n} candidate{'s' if n != 1 else ''} on "
                                f"{resolve_device(cfg.device)}")


def _collect(candidate: Path | None, ref: Path | None, task_id: str | None, sources: list[str],
             release: Path | None, candidates_dir: Path | None) -> list[tuple[Task, str]]:
    if release is not None:
        return [(t, c.source) for t, c in load_candidates(str(release)) if c is not None]
    if candidates_dir is not None:
        if not candidates_dir.is_dir():
            raise SourceError(f"no such folder of candidates: {candidates_dir}")
        tasks = {t.name: t for spec in sources for t in load_tasks(spec)}
        files = sorted([*candidates_dir.glob("*.py"), *candidates_dir.glob("*.json")])
        if not files:
            raise SourceError(f"no NAME.py or NAME.json candidates in {candidates_dir}")
        unmatched = [f.name for f in files if f.stem.split("__")[0] not in tasks]
        if unmatched:
            raise SourceError(f"no task named like {', '.join(unmatched[:5])} in {', '.join(sources)}")
        return [(tasks[f.stem.split("__")[0]], common.read_source(f, "candidate")) for f in files]
    if candidate is None:
        raise SourceError("give --candidate (with --ref or --task), or --release, or --candidates-dir")
    source = common.read_source(candidate, "candidate")
    if (ref is None) == (task_id is None):
        raise SourceError("give exactly one of --ref FILE or --task ID with --candidate")
    the_task = load_file(ref) if ref is not None else find_task(task_id, sources)
    return [(the_task, source)]
