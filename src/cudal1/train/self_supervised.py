"""Stage 2: self-supervised rounds: sample -> evaluate -> keep the successes -> fine-tune, repeated.

This is REINFORCE with a 0/1 reward and no baseline (design section 5): only correct candidates are
trained on, each with the same weight. Per round, every task of the split gets `samples_per_task`
completions of the plain prompt; each is evaluated by the hardened evaluator (in parallel); at most
`max_kept_per_task` distinct correct candidates per task (fastest first) become SFT examples; the policy is
fine-tuned on them (or on all rounds' successes with `accumulate`).

Every correct candidate of every round, with its speedup, also goes into the stage's exemplar database
(`exemplar_db`, by default `<output_dir>/exemplars.sqlite`), which stage 3 started from this stage's policy
seeds its contrastive prompts from.

Logged per round (into `<output_dir>/rounds.json`, the log, TensorBoard through the SFT trainer): sample
success rate, task success rate, mean speedup of the successes, examples kept, and the fine-tuning loss.
Every completion, with its verdict and whether it was kept: `<output_dir>/completions.jsonl`
(`log_completions`, see `completions.py`).
Stopping rule: `rounds` at most; earlier when the sample success rate reaches `target_success_rate`, or
after `patience` rounds without an improvement of `min_improvement`, or when `time_budget_s` is spent. With a
budget, each round's sampling gets at most `SAMPLING_SHARE` of what is left (a generation batch that runs
out returns what it has) and its fine-tuning stops at the stage's deadline.

Resume: with `resume_from_checkpoint` set, finished rounds (in `rounds.json`) are skipped and the policy of
the last finished round (`round_N/model`) is loaded.

The sampler is injectable (`CompletionSampler`): tests pass a scripted one that returns known correct and
incorrect candidates, while the evaluator and the fine-tuning stay real.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from cudal1.core.errors import ConfigError
from cudal1.core.types import EvalResult, Status
from cudal1.exemplars import ExemplarDB, normalized_hash
from cudal1.llm import LLMConfig, make_backend
from cudal1.llm.extract import extract_completion
from cudal1.llm.prompts import build_plain_prompt
from cudal1.tasks.task import Task
from cudal1.train.common import (
    EvaluateFn,
    RunRecorder,
    StageResult,
    check_evaluation_device,
    default_evaluator,
    evaluate_batch,
    fenced,
    first_failure,
    open_store,
    resolve_tasks,
    time_budget_callback,
    training_device,
    world_size,
)
from cudal1.train.completions import CompletionLog
from cudal1.train.config import SelfSupervisedConfig
from cudal1.train.models import load_policy, save_policy
from cudal1.train.sft import Record, fit_sft, loss_curve

logger = logging.getLogger(__name__)

#: The file a stage keeps its exemplars in, under its output directory (stage 3 looks for it beside a model).
EXEMPLARS_FILE = "exemplars.sqlite"
SAMPLING_SHARE = 0.4  # of the stage's remaining time budget, per round; evaluation and fine-tuning get the rest


class CompletionSampler(Protocol):
    """Produces `n` completion texts for each chat prompt."""

    def sample(self, prompts: list[list[dict[str, str]]], n: int) -> list[list[str]]:
        """One list of `n` texts per prompt, in prompt order."""
        ...


class PolicySampler:
    """Samples from the policy being trained through `HFBackend` (always the current weights)."""

    def __init__(self, model: Any, tokenizer: Any, config: SelfSupervisedConfig, batch_time_s: float | None = None):
        llm_cfg = LLMConfig(spec="hf:policy", temperature=config.temperature, top_p=config.top_p,
                            max_tokens=config.max_new_tokens, concurrency=config.generation_batch_size,
                            seed=config.seed, batch_time_limit_s=batch_time_s)
        self.backend = make_backend(llm_cfg, model=model, tokenizer=tokenizer)

    def sample(self, prompts: list[list[dict[str, str]]], n: int) -> list[list[str]]:
        groups = self.backend.generate(prompts, n=n)
        return [[c.text for c in group] for group in groups]


@dataclass
class RoundStats:
    """What one round did."""

    round: int
    samples: int
    correct: int
    success_rate: float
    tasks_solved: int
    task_success_rate: float
    mean_speedup: float | None
    kept: int
    statuses: dict[str, int] = field(default_factory=dict)
    loss_first: float | None = None
    loss_last: float | None = None
    model_dir: str = ""


def keep_successes(tasks: Sequence[Task], codes: Sequence[str | None], results: Sequence[EvalResult],
                   max_per_task: int) -> list[tuple[Task, str, float]]:
    """Distinct correct (task, code, speedup) triples, at most `max_per_task` per task, fastest first."""

    by_task: dict[str, list[tuple[Task, str, float]]] = {}
    seen: set[tuple[str, str]] = set()
    for task, code, result in zip(tasks, codes, results, strict=True):
        if result.status is not Status.CORRECT or code is None:
            continue
        key = (task.id, normalized_hash(code))
        if key in seen:
            continue
        seen.add(key)
        by_task.setdefault(task.id, []).append((task, code, float(result.speedup or 1.0)))
    kept = []
    for items in by_task.values():
        kept.extend(sorted(items, key=lambda x: -x[2])[:max_per_task])
    return kept


def sample_and_evaluate(tasks: Sequence[Task], sampler: CompletionSampler, evaluator: EvaluateFn,
                        config: SelfSupervisedConfig
                        ) -> tuple[list[Task], list[str | None], list[EvalResult], list, list[str]]:
    """Sample `samples_per_task` completions per task and evaluate them all; returns the flat lists (tasks,
    codes, verdicts, prompts, completion texts)."""

    prompts = [build_plain_prompt(t.source, form=config.form) for t in tasks]
    texts = sampler.sample(prompts, config.samples_per_task)
    flat_tasks, codes, flat_prompts, flat_texts = [], [], [], []
    for task, prompt, group in zip(tasks, prompts, texts, strict=True):
        for text in group:
            flat_tasks.append(task)
            codes.append(extract_completion(text).code)
            flat_prompts.append(prompt)
            flat_texts.append(text)
    results = evaluate_batch(evaluator, list(zip(flat_tasks, codes, strict=True)), config.eval_threads)
    return flat_tasks, codes, results, flat_prompts, flat_texts


def stage_exemplar_path(config: SelfSupervisedConfig) -> Path:
    """The stage's exemplar database: `exemplar_db`, or `<output_dir>/exemplars.sqlite` for auto."""
    if config.exemplar_db == "auto":
        return Path(config.output_dir) / EXEMPLARS_FILE
    return Path(config.exemplar_db)


def record_successes(db: ExemplarDB, tasks: Sequence[Task], codes: Sequence[str | None],
                     results: Sequence[EvalResult], meta: dict[str, Any]) -> int:
    """Every correct candidate with a finite speedup into the exemplar database; returns how many."""
    added = 0
    for task, code, result in zip(tasks, codes, results, strict=True):
        speedup = result.speedup
        if result.status is Status.CORRECT and code is not None and speedup is not None and math.isfinite(speedup):
            db.add(task.id, code, float(speedup), meta)
            added += 1
    return added


def _round_stats(index: int, tasks: Sequence[Task], flat_tasks: list[Task], results: list[EvalResult],
                 kept: int) -> RoundStats:
    correct = [(t, r) for t, r in zip(flat_tasks, results, strict=True) if r.status is Status.CORRECT]
    speedups = [r.speedup for _, r in correct if r.speedup is not None]
    statuses: dict[str, int] = {}
    for r in results:
        statuses[r.status.value] = statuses.get(r.status.value, 0) + 1
    solved = len({t.id for t, _ in correct})
    return RoundStats(round=index, samples=len(results), correct=len(correct),
                      success_rate=len(correct) / len(results) if results else 0.0, tasks_solved=solved,
                      task_success_rate=solved / len(tasks) if tasks else 0.0,
                      mean_speedup=sum(speedups) / len(speedups) if speedups else None, kept=kept,
                      statuses=statuses)


def should_stop(history: Sequence[RoundStats], config: SelfSupervisedConfig,
                deadline: float | None = None) -> str | None:
    """Why to stop after the last round (None: go on); `deadline` is a `time.monotonic()` value."""
    if history and len(history) >= config.rounds:
        return "rounds"
    if deadline is not None and time.monotonic() >= deadline:
        return "time_budget"
    if not history:
        return None
    if config.target_success_rate > 0 and history[-1].success_rate >= config.target_success_rate:
        return "target_success_rate"
    if config.patience > 0 and len(history) > config.patience:
        best_before = max(r.success_rate for r in history[:-config.patience])
        recent = max(r.success_rate for r in history[-config.patience:])
        if recent < best_before + config.min_improvement:
            return "patience"
    return None


def _load_finished(config: SelfSupervisedConfig) -> list[RoundStats]:
    path = Path(config.output_dir) / "rounds.json"
    if not (config.resume_from_checkpoint and path.is_file()):
        return []
    return [RoundStats(**r) for r in json.loads(path.read_text())]


def run_self_supervised(config: SelfSupervisedConfig, *, model: Any = None, tokenizer: Any = None,
                        tasks: Sequence[Task] | None = None, sampler: CompletionSampler | None = None,
                        evaluator: EvaluateFn | None = None) -> StageResult:
    """Stage 2 end to end (see the module docstring); the final policy is saved in `<output_dir>/final`."""
    if world_size() > 1:
        raise ConfigError("stage 2 (self-supervised) runs in one process: each round samples every task, then "
                          "fine-tunes briefly; launch it without torchrun/accelerate")
    started = time.monotonic()
    deadline = started + config.time_budget_s if config.time_budget_s > 0 else None
    if evaluator is None:
        check_evaluation_device(config)
    store = open_store(config.store)
    recorder = RunRecorder("self_supervised", config, store)
    tasks = resolve_tasks(config, tasks)
    history = _load_finished(config)
    if history and history[-1].model_dir:
        model, tokenizer = load_policy(history[-1].model_dir)
    elif model is None or tokenizer is None:
        model, tokenizer = load_policy(config.model, config.tokenizer, seed=config.seed)
    if getattr(model, "hf_device_map", None) is None:  # a dispatched (device_map) model stays where it is
        model = model.to(training_device(config))  # sample where training will run (a loaded policy is on cpu)
    made = None if evaluator is not None else default_evaluator(config, store, recorder.run_id,
                                                                 label=f"self_supervised:{config.model}")
    evaluator = evaluator or made
    db = None
    if config.exemplar_db not in ("", "none"):
        db = ExemplarDB(stage_exemplar_path(config))
    all_kept: list[Record] = []
    log: list[dict[str, Any]] = []
    completions = CompletionLog.for_run(config)  # stage 2 runs in one process
    reason = should_stop(history, config, deadline)
    while reason is None:
        index = len(history)
        round_sampler = sampler or PolicySampler(model, tokenizer, config, _batch_time_s(config, len(tasks), deadline))
        flat_tasks, codes, results, prompts, texts = sample_and_evaluate(tasks, round_sampler, evaluator,
                                                                         config)
        kept = keep_successes(flat_tasks, codes, results, config.max_kept_per_task)
        if completions is not None:
            kept_codes = {(t.id, code) for t, code, _ in kept}
            kept_flags = [(t.id, code) in kept_codes for t, code in zip(flat_tasks, codes, strict=True)]
            completions.write(stage="self_supervised", tasks=flat_tasks, texts=texts, codes=codes,
                              results=results, prompts=prompts, round=index, kept=kept_flags)
        stats = _round_stats(index, tasks, flat_tasks, results, len(kept))
        prompt_of = {t.id: p for t, p in zip(flat_tasks, prompts, strict=True)}
        records = [{"prompt": prompt_of[t.id], "completion": [{"role": "assistant", "content": fenced(code)}],
                    "task_id": t.id} for t, code, _ in kept]
        if db is not None:  # every correct evaluation: its score joins the source's (stage 3's exemplars)
            record_successes(db, flat_tasks, codes, results, {"model": config.model, "source": f"self_supervised:{index}"})
        all_kept.extend(records)
        train_on = all_kept if config.accumulate else records
        round_dir = Path(config.output_dir) / f"round_{index}"
        left_s = deadline - time.monotonic() if deadline is not None else None
        if train_on and (left_s is None or left_s > 0):
            model, stats, round_log = _fine_tune_round(model, tokenizer, train_on, config, round_dir, stats,
                                                       budget_s=left_s or 0.0)
            log.extend({**e, "round": index} for e in round_log)
        logger.info("self-supervised round %d: %d/%d samples correct (%.0f%%), %d tasks solved, %d kept; "
                    "statuses %s%s", index, stats.correct, stats.samples, 100 * stats.success_rate,
                    stats.tasks_solved, stats.kept, stats.statuses,
                    f"; first failure {why}" if (why := first_failure(results)) else "")
        stats.model_dir = str(save_policy(model, tokenizer, round_dir / "model"))
        history.append(stats)
        (Path(config.output_dir) / "rounds.json").write_text(json.dumps([asdict(r) for r in history], indent=1))
        reason = should_stop(history, config, deadline)
    if made is not None:
        made.close()
    final = save_policy(model, tokenizer, Path(config.output_dir) / "final")
    summary = {"rounds": [asdict(r) for r in history], "stopped_because": reason,
               "success_rate_last": history[-1].success_rate if history else None}
    return recorder.finish(StageResult("self_supervised", config.output_dir, str(final), log, summary))


def _batch_time_s(config: SelfSupervisedConfig, n_prompts: int, deadline: float | None) -> float | None:
    """Time limit of one generation batch: an even share of this round's sampling budget (None: unbudgeted)."""
    if deadline is None:
        return None
    batches = max(1, math.ceil(n_prompts / config.generation_batch_size))
    return max(1.0, SAMPLING_SHARE * (deadline - time.monotonic()) / batches)


def _fine_tune_round(model: Any, tokenizer: Any, records: list[Record], config: SelfSupervisedConfig,
                     round_dir: Path, stats: RoundStats, budget_s: float = 0.0
                     ) -> tuple[Any, RoundStats, list[dict[str, Any]]]:
    """Fine-tune on this round's successes (stopping after `budget_s` if > 0); LoRA adapters are merged so the
    next round starts clean."""
    trainer = fit_sft(model, tokenizer, records, [], config, output_dir=str(round_dir), max_length=config.max_length,
                      extra_args={"save_strategy": "no"},
                      callbacks=[time_budget_callback(budget_s, save=False)] if budget_s > 0 else None)
    curve = loss_curve(trainer.state.log_history)
    stats.loss_first = curve[0][1] if curve else None
    stats.loss_last = curve[-1][1] if curve else None
    trained = trainer.model
    if hasattr(trained, "merge_and_unload"):
        trained = trained.merge_and_unload()
    return trained, stats, list(trainer.state.log_history)
