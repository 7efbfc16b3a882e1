"""The arms of the study: how each one spends its evaluations, on the training tasks and on the held-out ones.

Every arm is scored on the held-out tasks in the same way (`search`): a task's exemplar database starts with
the same k0 random correct recipes in every arm (they count as its first k0 evaluations), then the arm
proposes recipes in rounds of `round_size` per task until `budget` evaluations: the improver sampled with
the arm's prompt style, each correct proposal entering the database that later prompts draw from (with
`plain` prompts the database is never shown: i.i.d. samples, best-of-N); `uniform` (random search) proposes
recipes not evaluated yet, uniformly. An evaluation is a distinct recipe, as the results store makes it: a
repeated proposal is served from the store and an unparseable answer is never evaluated, so neither spends
the budget; they spend samples, at most `sample_cap` x `budget` per task (a policy that keeps repeating itself
stops there with fewer evaluations, its curve flat from its last one). `sampled_with_exemplars` draws n
answers per task to the prompt built from the same k0 seeded recipes (the policy's one-shot skill with
exemplars).

RL arms first train with the project's stage 3 (`run_rl`: TRL's GRPO, `KernelReward` over the table, the
exemplar database, the arm's prompt builder) on the training tasks, from the pre-trained improver.
"""

from __future__ import annotations

import hashlib
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cudal1.exemplars import ExemplarDB
from cudal1.service.evaluator import as_evaluator
from cudal1.study.improver import sample
from cudal1.study.prompting import StudyPromptBuilder
from cudal1.study.recipes import SPACE, parse_recipe
from cudal1.study.table import Table
from cudal1.tasks.task import Task
from cudal1.train.common import completion_text
from cudal1.train.rewards import KernelReward, RewardConfig

#: arm -> (how it trains: "grpo" or None, how it proposes: a prompt style of `prompting.STYLES`, or "uniform")
ARMS: dict[str, tuple[str | None, str]] = {
    "grpo-bucket": ("grpo", "bucket"),
    "grpo-random": ("grpo", "random"),
    "grpo-shuffled": ("grpo", "shuffled"),
    "grpo-plain": ("grpo", "plain"),
    "evolution": (None, "bucket"),
    "random-search": (None, "uniform"),
    "sft-only": (None, "plain"),
}


@dataclass(frozen=True)
class Protocol:
    """The study's budgets and settings (fixed before the runs; see scripts/contrastive_study.py)."""

    exemplars: int = 4  # k: exemplars per prompt, and recipes seeded per held-out task (k0)
    budget: int = 64  # evaluations per held-out task, the k0 seeds included
    round_size: int = 8  # proposals per task per search round
    samples: int = 32  # answers per held-out task for `sampled_with_exemplars`
    steps: int = 100  # GRPO steps
    tasks_per_step: int = 8  # prompts per GRPO step
    generations: int = 8  # completions per prompt (a GRPO group)
    learning_rate: float = 1e-4
    beta: float = 0.01  # KL weight to the pre-trained policy (stage 3's default): keeps some diversity
    checkpoints: tuple[int, ...] = (4, 8, 16, 32, 64)  # evaluations at which held-out curves are reported
    sample_cap: int = 4  # samples per held-out task at most, in units of `budget`


def sub_seed(*parts: Any) -> int:
    return int(hashlib.sha256(repr(parts).encode()).hexdigest()[:8], 16)


def seed_recipes(table: Table, task_ids: Sequence[str], k: int, seed: int) -> dict[str, list[str]]:
    """k random correct recipes per task (the same for every arm of a seed)."""
    return {tid: random.Random(sub_seed("seed-recipes", seed, tid)).sample(table.correct_recipes(tid), k)
            for tid in task_ids}


def fill_db(db: ExemplarDB, table: Table, recipes: dict[str, list[str]]) -> ExemplarDB:
    for tid, chosen in recipes.items():
        for recipe in chosen:
            db.add(tid, recipe, table.speedup(tid, recipe), {"source": "seed"})
    return db


def curve(table: Table, task_id: str, evaluated: Sequence[str], checkpoints: Sequence[int]) -> list[float]:
    """The best speedup found within each checkpoint's number of evaluations, as a fraction of the task's best
    (past the last evaluation, the best found)."""
    best = table.best(task_id)
    values = [table.speedup(task_id, r) for r in evaluated]
    return [round(max(values[:n], default=0.0) / best, 5) for n in checkpoints]


@dataclass
class Search:
    """One held-out task's search: the distinct recipes evaluated, in order, and the samples drawn."""

    evaluated: list[str]
    samples: int = 0


def search(table: Table, tasks: dict[str, Task], features: dict[str, list[str]], style: str, protocol: Protocol,
           seed: int, work_dir: Path, policy: Any = None) -> dict[str, Search]:
    """Every held-out task's search, seeds first (module docstring)."""
    seeds = seed_recipes(table, list(tasks), protocol.exemplars, seed)
    runs = {tid: Search(list(chosen)) for tid, chosen in seeds.items()}
    if style == "uniform":
        for tid, run in runs.items():
            rest = [r.text for r in SPACE if r.text not in seeds[tid]]
            run.evaluated += random.Random(sub_seed("random-search", seed, tid)).sample(
                rest, protocol.budget - protocol.exemplars)
            run.samples = protocol.budget - protocol.exemplars
        return runs
    model, tok = policy
    db = fill_db(ExemplarDB(work_dir / "held_out.sqlite"), table, seeds)
    builder = StudyPromptBuilder(db, style, protocol.exemplars, features, seed=sub_seed("builder", seed))
    cap = protocol.sample_cap * protocol.budget

    def going(run: Search) -> bool:
        return len(run.evaluated) < protocol.budget and run.samples < cap

    step = 0
    while any(going(r) for r in runs.values()):
        todo = [tid for tid, run in runs.items() if going(run)]
        prompts = [builder.build(tasks[tid], step) for tid in todo]
        for tid, answers in zip(todo, sample(model, tok, prompts, protocol.round_size, sub_seed("round", seed, step)),
                                strict=True):
            run = runs[tid]
            for recipe in answers:
                if not going(run):
                    break
                run.samples += 1
                if recipe is None or recipe in run.evaluated:
                    continue  # never evaluated, or served by the store
                run.evaluated.append(recipe)
                if table.speedup(tid, recipe) > 0:
                    db.add(tid, recipe, table.speedup(tid, recipe), {"source": "search", "round": step})
        step += 1
    return runs


def sampled_with_exemplars(table: Table, tasks: dict[str, Task], features: dict[str, list[str]], style: str,
                           protocol: Protocol, seed: int, work_dir: Path, policy: Any = None) -> dict[str, dict]:
    """Per held-out task: mean fraction of the best and correct rate of `samples` answers to the prompt built
    from the k0 seeded recipes (uniform proposals: the expectation over the whole space)."""
    out = {}
    if style == "uniform":
        for tid in tasks:
            values = [table.speedup(tid, r.text) for r in SPACE]
            out[tid] = {"fraction_of_best": round(statistics.fmean(values) / table.best(tid), 5),
                        "correct_rate": round(statistics.fmean(v > 0 for v in values), 5)}
        return out
    model, tok = policy
    db = fill_db(ExemplarDB(work_dir / "one_shot.sqlite"), table, seed_recipes(table, list(tasks), protocol.exemplars,
                                                                               seed))
    builder = StudyPromptBuilder(db, style, protocol.exemplars, features, seed=sub_seed("one-shot", seed))
    prompts = [builder.build(tasks[tid], 0) for tid in tasks]
    for tid, answers in zip(tasks, sample(model, tok, prompts, protocol.samples, sub_seed("one-shot", seed)),
                            strict=True):
        values = [table.speedup(tid, r) for r in answers]
        out[tid] = {"fraction_of_best": round(statistics.fmean(values) / table.best(tid), 5),
                    "correct_rate": round(statistics.fmean(v > 0 for v in values), 5),
                    "distinct": len(set(answers))}
    return out


class RecordingReward:
    """The project's `KernelReward`, remembering which recipe each completion named (training curves)."""

    __name__ = "kernel_reward"

    def __init__(self, reward: KernelReward, table: Table):
        self.reward = reward
        self.table = table
        self.steps: list[dict[str, float]] = []

    def __call__(self, completions: Any, task_id: Any, **kwargs: Any) -> list[float]:
        pairs = [(t, parse_recipe(completion_text(c))) for c, t in zip(completions, task_id, strict=True)]
        self.steps.append({"fraction_of_best": round(statistics.fmean(self.table.speedup(t, r) / self.table.best(t)
                                                                      for t, r in pairs), 5),
                           "correct_rate": round(statistics.fmean(self.table.speedup(t, r) > 0 for t, r in pairs), 5)})
        return self.reward(completions, task_id, **kwargs)


def train_grpo(start: Path, table: Table, tasks: dict[str, Task], features: dict[str, list[str]], style: str,
               protocol: Protocol, seed: int, work_dir: Path) -> tuple[Any, Any, dict[str, Any]]:
    """Stage 3 on the training tasks from the pre-trained improver; returns (model, tokenizer, its record)."""
    from cudal1.train.config import RLStageConfig, load_config
    from cudal1.train.models import load_policy
    from cudal1.train.rl import run_rl

    model, tok = load_policy(str(start))
    db = fill_db(ExemplarDB(work_dir / "exemplars.sqlite"), table,
                 seed_recipes(table, list(tasks), protocol.exemplars, sub_seed("train-db", seed)))
    g = protocol.generations
    config = load_config(RLStageConfig, None, {
        "model": str(start), "output_dir": str(work_dir / "grpo"), "use_cpu": True, "report_to": "none",
        "store": "none", "split": "all", "seed": seed, "num_generations": g,
        "per_device_train_batch_size": g * protocol.tasks_per_step, "gradient_accumulation_steps": 1,
        "max_steps": protocol.steps, "max_completion_length": 7, "learning_rate": protocol.learning_rate,
        "beta": protocol.beta, "temperature": 1.0, "top_p": 1.0, "vllm": "transformers", "logging_steps": 50,
        "save_steps": 10**9, "warmup_ratio": 0.0, "lr_scheduler_type": "constant", "exemplar_seed": "none",
        "exemplars_per_prompt": protocol.exemplars})
    reward_config = RewardConfig(failure_rewards=config.failure_rewards, group_size=g, eval_threads=1)
    reward = RecordingReward(KernelReward(list(tasks.values()), as_evaluator(table.result), reward_config,
                                          exemplar_db=db, extract=parse_recipe), table)
    builder = StudyPromptBuilder(db, style, protocol.exemplars, features, seed=sub_seed("train-builder", seed))
    run_rl(config, model=model, tokenizer=tok, tasks=list(tasks.values()), reward_funcs=[reward], exemplar_db=db,
           prompt_builder=builder)
    return model, tok, {"steps": reward.steps, "reward": reward_config.describe(),
                        "evaluations": sum(1 for _ in reward.steps) * g * protocol.tasks_per_step}
