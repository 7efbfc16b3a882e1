"""The arms of the study: how each one spends its evaluations, on the training tasks and on the held-out ones.

Every arm is scored on the held-out tasks in the same way (`search`): a task's exemplar database starts with
the same k0 random correct recipes in every arm (they count as its first k0 evaluations), then the arm
proposes recipes until exactly `budget` distinct recipes have been evaluated. An evaluation is a distinct
recipe, as the results store makes it: a repeated proposal is served from the store and an unparseable
answer is never evaluated, so neither spends the budget; they spend samples, at most `sample_cap` x `budget`
per task, after which the budget's remainder is filled with random recipes not evaluated yet (`fallback`,
counted per task): every arm ends with the same `budget` distinct evaluations per task. Each evaluation
draws the cell's measured noise (`TableEvaluations`): the scores a policy is shown are noisy, what is scored
is the table's median. How arms propose:
- a policy with a prompt style of `prompting.STYLES` (bucket, random, shuffled exemplars, or plain): rounds of
  `round_size` samples per task to one prompt built from the task's database (correct proposals enter it);
  with `plain` prompts the database is never shown (i.i.d. samples, best-of-N);
- `refine` (multi-turn refinement): `round_size` trajectories per task, each turn's prompt showing the
  trajectory's own last `refine_turns` attempts with their measured results (`prompting.RefineHistory`);
  a trajectory starts from two of the seeded recipes;
- `uniform` (random search): recipes not evaluated yet, uniformly;
- `lookup`: no learning and no feedback: recipes in the order of their mean fraction of the best over the
  training tasks whose visible features are the held-out task's (`lookup_rankings`).

`one_shot` draws `samples` answers per task to the prompt built from the k0 seeded recipes (the arm's own
style), and the within-policy mechanism test: answers to the k0 seeded recipes with their true scores, and
with the same scores permuted among them (the recipes kept).

RL arms first train with the project's stage 3 (`run_rl`: TRL's GRPO, `KernelReward` over noisy table
evaluations, the exemplar database, the arm's prompt builder, stage 3's default reward shaping) on the
training tasks, from the pre-trained improver.
"""

from __future__ import annotations

import hashlib
import random
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cudal1.core.types import EvalResult
from cudal1.exemplars import ExemplarDB
from cudal1.tasks.task import Task
from cudal1.train.common import completion_text
from experimental.contrastive_study.improver import sample
from experimental.contrastive_study.prompting import (
    RefineHistory,
    RefinePromptBuilder,
    StudyPromptBuilder,
    permuted,
    prompt_text,
)
from experimental.contrastive_study.recipes import SPACE, parse_recipe
from experimental.contrastive_study.table import Table

#: arm -> (how it trains: "grpo" or None, how it proposes: a prompt style of `prompting.STYLES`, "refine",
#: "uniform" or "lookup")
ARMS: dict[str, tuple[str | None, str]] = {
    "grpo-bucket": ("grpo", "bucket"),
    "grpo-random": ("grpo", "random"),
    "grpo-shuffled": ("grpo", "shuffled"),
    "grpo-plain": ("grpo", "plain"),
    "grpo-refine": ("grpo", "refine"),
    "evolution": (None, "bucket"),
    "random-search": (None, "uniform"),
    "sft-only": (None, "plain"),
    "lookup": (None, "lookup"),
}
#: Proposal kinds that need no policy.
ORDERED = ("uniform", "lookup")


@dataclass(frozen=True)
class Protocol:
    """The study's budgets and settings (fixed before the runs; see scripts/contrastive_study.py)."""

    exemplars: int = 4  # k: exemplars per prompt, and recipes seeded per held-out task (k0)
    budget: int = 32  # distinct evaluations per held-out task, the k0 seeds included, in every arm
    round_size: int = 8  # proposals per task per search round (refine: trajectories per task)
    samples: int = 32  # answers per held-out task for `one_shot`
    steps: int = 60  # GRPO steps
    tasks_per_step: int = 8  # prompts per GRPO step
    generations: int = 8  # completions per prompt (a GRPO group)
    learning_rate: float = 1e-4
    beta: float = 0.01  # KL weight to the pre-trained policy (stage 3's default): keeps some diversity
    checkpoints: tuple[int, ...] = (4, 8, 16, 32)  # evaluations at which held-out curves are reported
    sample_cap: int = 4  # samples per held-out task at most, in units of `budget`
    feature_set: str = "kind"  # what a policy sees of a task (`ops.FEATURE_SETS`)
    perturb_fields: int = 3  # held-out tasks: fields relabelled (`perturb.py`; 0: the table as measured)
    perturb_seed: int = 0
    noise_scale: float = 1.0  # x the measured per-cell noise of an evaluation (`Table.noise`)
    refine_turns: int = 2  # refine: own attempts shown per prompt
    search_repeats: int = 4  # held-out searches per trained policy (other seeded recipes), averaged
    pretrain_seeds: int = 4  # pre-trainings; study seed s starts from pre-training s % pretrain_seeds
    pretrain_examples: int = 24000


def sub_seed(*parts: Any) -> int:
    return int(hashlib.sha256(repr(parts).encode()).hexdigest()[:8], 16)


def search_seed(seed: int, repeat: int) -> int:
    """The seed of a study seed's `repeat`-th held-out search (its seeded recipes, noise and proposals)."""
    return seed if repeat == 0 else sub_seed("repeat", seed, repeat)


def seed_recipes(table: Table, task_ids: Sequence[str], k: int, seed: int) -> dict[str, list[str]]:
    """k random correct recipes per task (the same for every arm of a seed)."""
    return {tid: random.Random(sub_seed("seed-recipes", seed, tid)).sample(table.correct_recipes(tid), k)
            for tid in task_ids}


class TableEvaluations:
    """The study's evaluator: every evaluation of a cell draws its measured noise (`Table.noisy_result`), from a
    generator seeded by (seed, task, recipe, how many times the cell was evaluated), so a run is reproducible
    whatever order it evaluates in. `last` keeps (task id, recipe, speedup) of the evaluations since it was
    cleared (the refinement's history reads them)."""

    def __init__(self, table: Table, seed: int, scale: float = 1.0):
        self.table = table
        self.seed = seed
        self.scale = scale
        self.counts: Counter[tuple[str, str]] = Counter()
        self.last: list[tuple[str, str, float]] = []

    def __call__(self, task: Task, recipe: str) -> EvalResult:
        n = self.counts[(task.id, recipe)]
        self.counts[(task.id, recipe)] += 1
        result = self.table.noisy_result(task, recipe, random.Random(sub_seed("eval", self.seed, task.id, recipe, n)),
                                         self.scale)
        self.last.append((task.id, recipe, float(result.speedup or 0.0)))
        return result

    def score(self, task_id: str, recipe: str) -> float:
        """One noisy evaluation's speedup (0 for a failure), by task id."""
        n = self.counts[(task_id, recipe)]
        self.counts[(task_id, recipe)] += 1
        return self.table.draw(task_id, recipe, random.Random(sub_seed("eval", self.seed, task_id, recipe, n)),
                               self.scale)[0]


def fill_db(db: ExemplarDB, recipes: dict[str, list[str]], scores: dict[str, dict[str, float]]) -> ExemplarDB:
    for tid, chosen in recipes.items():
        for recipe in chosen:
            db.add(tid, recipe, scores[tid][recipe], {"source": "seed"})
    return db


def curve(table: Table, task_id: str, evaluated: Sequence[str], checkpoints: Sequence[int]) -> list[float]:
    """The best speedup found within each checkpoint's number of evaluations, as a fraction of the task's best
    (the table's medians, not the noisy draws the policy saw)."""
    best = table.best(task_id)
    values = [table.speedup(task_id, r) for r in evaluated]
    return [round(max(values[:n], default=0.0) / best, 5) for n in checkpoints]


def lookup_rankings(table: Table, held_ids: Sequence[str], features: dict[str, list[str]]) -> dict[str, list[str]]:
    """Per held-out task, every recipe by its mean fraction of the best over the training tasks whose visible
    features are the task's (the same kind when none is), best first: a prior with no learning and no
    feedback."""
    train_ids, _ = table.split()
    out = {}
    for tid in held_ids:
        siblings = [t for t in train_ids if features[t] == features[tid]] or \
            [t for t in train_ids if table.tasks[t]["kind"] == table.tasks[tid]["kind"]]
        value = {r.text: statistics.fmean(table.speedup(t, r.text) / table.best(t) for t in siblings) for r in SPACE}
        out[tid] = sorted(value, key=lambda r: -value[r])
    return out


@dataclass
class Search:
    """One held-out task's search: the distinct recipes evaluated, in order, and how it got them."""

    evaluated: list[str]
    samples: int = 0  # policy answers drawn
    fallback: int = 0  # evaluations filled with random recipes after the sample cap
    copies: int = 0  # answers that repeat a recipe shown in their own prompt


def _ordered(runs: dict[str, Search], orders: dict[str, list[str]], budget: int) -> dict[str, Search]:
    for tid, run in runs.items():
        start = len(run.evaluated)
        run.evaluated += [r for r in orders[tid] if r not in run.evaluated][:budget - start]
        run.samples = budget - start
    return runs


def search(table: Table, tasks: dict[str, Task], features: dict[str, list[str]], style: str, protocol: Protocol,
           seed: int, work_dir: Path, policy: Any = None, *, repeat: int = 0,
           lookup: dict[str, list[str]] | None = None) -> dict[str, Search]:
    """Every held-out task's search, seeds first (module docstring); `repeat` draws other seeded recipes."""
    rseed = search_seed(seed, repeat)
    seeds = seed_recipes(table, list(tasks), protocol.exemplars, rseed)
    evals = TableEvaluations(table, sub_seed("held-out", rseed), protocol.noise_scale)
    scores = {tid: {r: evals.score(tid, r) for r in chosen} for tid, chosen in seeds.items()}
    runs = {tid: Search(list(chosen)) for tid, chosen in seeds.items()}
    if style == "uniform":
        orders = {tid: random.Random(sub_seed("random-search", rseed, tid)).sample([r.text for r in SPACE], len(SPACE))
                  for tid in tasks}
        return _ordered(runs, orders, protocol.budget)
    if style == "lookup":
        return _ordered(runs, lookup or {}, protocol.budget)
    model, tok = policy
    cap = protocol.sample_cap * protocol.budget

    def going(run: Search) -> bool:
        return len(run.evaluated) < protocol.budget and run.samples < cap

    def spend(tid: str, recipe: str | None, shown: Sequence[str]) -> float | None:
        """Account for one answer; returns its (noisy) score when it was evaluated or served from the store."""
        run = runs[tid]
        run.samples += 1
        if recipe is None:
            return None
        run.copies += recipe in shown
        if recipe not in run.evaluated:
            run.evaluated.append(recipe)
            scores[tid][recipe] = evals.score(tid, recipe)
            if scores[tid][recipe] > 0 and db is not None:
                db.add(tid, recipe, scores[tid][recipe], {"source": "search"})
        return scores[tid][recipe]

    db = None
    if style == "refine":
        history = RefineHistory(protocol.refine_turns)
        for tid, chosen in seeds.items():
            for j in range(protocol.round_size):
                for recipe in (chosen[j % len(chosen)], chosen[(j + 1) % len(chosen)]):
                    history.add((tid, j), recipe, scores[tid][recipe])
    else:
        db = fill_db(ExemplarDB(work_dir / f"held_out{repeat}.sqlite", context=table.context), seeds, scores)
        builder = StudyPromptBuilder(db, style, protocol.exemplars, features, seed=sub_seed("builder", rseed))
    step = 0
    while any(going(r) for r in runs.values()):
        todo = [tid for tid, run in runs.items() if going(run)]
        round_seed = sub_seed("round", rseed, step)
        if style == "refine":
            keys = [(tid, j) for tid in todo for j in range(protocol.round_size)]
            answers = sample(model, tok, [prompt_text(features[tid], history.shown((tid, j))) for tid, j in keys],
                             1, round_seed)
            for (tid, j), (recipe,) in zip(keys, answers, strict=True):
                if going(runs[tid]):
                    score = spend(tid, recipe, [r for r, _ in history.shown((tid, j))])
                    if score is not None:
                        history.add((tid, j), recipe, score)
        else:
            prompts = [builder.build(tasks[tid], step) for tid in todo]
            answers = sample(model, tok, prompts, protocol.round_size, round_seed)
            for tid, proposals in zip(todo, answers, strict=True):
                shown = [e.code for e in builder.last_exemplars[tid]]
                for recipe in proposals:
                    if going(runs[tid]):
                        spend(tid, recipe, shown)
        step += 1
    for tid, run in runs.items():  # equal budgets: what a repeating policy left, at random
        missing = protocol.budget - len(run.evaluated)
        if missing > 0:
            rest = [r.text for r in SPACE if r.text not in run.evaluated]
            run.evaluated += random.Random(sub_seed("fallback", rseed, tid)).sample(rest, missing)
            run.fallback = missing
    return runs


def _answers_summary(table: Table, tid: str, answers: Sequence[str | None]) -> dict[str, float]:
    values = [table.speedup(tid, r) for r in answers]
    return {"fraction_of_best": round(statistics.fmean(values) / table.best(tid), 5),
            "correct_rate": round(statistics.fmean(v > 0 for v in values), 5), "distinct": len(set(answers))}


def one_shot(table: Table, tasks: dict[str, Task], features: dict[str, list[str]], style: str, protocol: Protocol,
             seed: int, work_dir: Path, policy: Any = None,
             lookup: dict[str, list[str]] | None = None) -> dict[str, dict]:
    """Per held-out task: the mean fraction of the best, correct rate and distinct answers of `samples` answers to
    the prompt built from the k0 seeded recipes in the arm's own style (random search: the expectation over the
    whole space; lookup: its first proposal); for a policy also `true_scores` and `permuted_scores`, the mean
    fraction of the best of answers to the k0 seeded recipes shown with their scores and with the scores
    permuted among them (the mechanism test, the same prompts for every arm of a seed)."""
    seeds = seed_recipes(table, list(tasks), protocol.exemplars, seed)
    evals = TableEvaluations(table, sub_seed("held-out", seed), protocol.noise_scale)
    scores = {tid: {r: evals.score(tid, r) for r in chosen} for tid, chosen in seeds.items()}
    if style == "uniform":
        return {tid: {"fraction_of_best": round(statistics.fmean(table.speedup(tid, r.text) for r in SPACE)
                                                / table.best(tid), 5),
                      "correct_rate": round(statistics.fmean(table.speedup(tid, r.text) > 0 for r in SPACE), 5)}
                for tid in tasks}
    if style == "lookup":
        first = {tid: next(r for r in (lookup or {})[tid] if r not in seeds[tid]) for tid in tasks}
        return {tid: _answers_summary(table, tid, [first[tid]]) for tid in tasks}
    model, tok = policy
    if style == "refine":
        prompts = [prompt_text(features[tid], sorted(((r, scores[tid][r]) for r in seeds[tid][:2]),
                                                    key=lambda e: e[1])) for tid in tasks]
    else:
        db = fill_db(ExemplarDB(work_dir / "one_shot.sqlite", context=table.context), seeds, scores)
        builder = StudyPromptBuilder(db, style, protocol.exemplars, features, seed=sub_seed("one-shot", seed))
        prompts = [builder.build(tasks[tid], 0) for tid in tasks]
    out = {tid: _answers_summary(table, tid, answers) for tid, answers in
           zip(tasks, sample(model, tok, prompts, protocol.samples, sub_seed("one-shot", seed)), strict=True)}
    rng = random.Random(sub_seed("mechanism", seed))
    true, shuffled = [], []
    for tid in tasks:
        shown = sorted(scores[tid].items(), key=lambda e: e[1])
        true.append(prompt_text(features[tid], shown))
        shuffled.append(prompt_text(features[tid], permuted(shown, rng)))
    for name, prompts in (("true_scores", true), ("permuted_scores", shuffled)):
        for tid, answers in zip(tasks, sample(model, tok, prompts, protocol.samples, sub_seed("mechanism", seed)),
                                strict=True):
            out[tid][name] = _answers_summary(table, tid, answers)["fraction_of_best"]
    return out


class RecordingReward:
    """The project's `KernelReward`, remembering per step the fraction of the best and the correct rate of the
    completions (the table's medians) and how many repeat a recipe their prompt shows; a refinement's history
    continues with one attempt of each group."""

    __name__ = "kernel_reward"

    def __init__(self, reward: Any, table: Table, evaluations: TableEvaluations,
                 history: RefineHistory | None = None, seed: int = 0):
        self.reward = reward
        self.table = table
        self.evaluations = evaluations
        self.history = history
        self.rng = random.Random(seed)
        self.steps: list[dict[str, float]] = []

    def __call__(self, completions: Any, task_id: Any, prompts: Any = None, **kwargs: Any) -> list[float]:
        pairs = [(t, parse_recipe(completion_text(c))) for c, t in zip(completions, task_id, strict=True)]
        texts = [completion_text(p) for p in prompts] if prompts is not None else [""] * len(pairs)
        self.steps.append({"fraction_of_best": round(statistics.fmean(self.table.speedup(t, r) / self.table.best(t)
                                                                      for t, r in pairs), 5),
                           "correct_rate": round(statistics.fmean(self.table.speedup(t, r) > 0 for t, r in pairs), 5),
                           "copies": round(statistics.fmean(r is not None and r in p
                                                            for (_, r), p in zip(pairs, texts, strict=True)), 5)})
        self.evaluations.last = []
        rewards = self.reward(completions, task_id, prompts=prompts, **kwargs)
        if self.history is not None:
            drawn = iter(self.evaluations.last)
            attempts: dict[str, list[tuple[str, float]]] = {}
            for tid, recipe in pairs:
                if recipe is not None:
                    attempts.setdefault(tid, []).append((recipe, next(drawn)[2]))
            for tid, tried in attempts.items():
                self.history.add(tid, *self.rng.choice(tried))
        return rewards


def train_grpo(start: Path, table: Table, tasks: dict[str, Task], features: dict[str, list[str]], style: str,
               protocol: Protocol, seed: int, work_dir: Path) -> tuple[Any, Any, dict[str, Any]]:
    """Stage 3 on the training tasks from the pre-trained improver; returns (model, tokenizer, its record)."""
    from cudal1.train.config import RLStageConfig, load_config
    from cudal1.train.models import load_policy
    from cudal1.train.rewards import KernelReward
    from cudal1.train.rl import reward_config, run_rl

    model, tok = load_policy(str(start))
    seeds = seed_recipes(table, list(tasks), protocol.exemplars, sub_seed("train-db", seed))
    evals = TableEvaluations(table, sub_seed("train", seed), protocol.noise_scale)
    scores = {tid: {r: evals.score(tid, r) for r in chosen} for tid, chosen in seeds.items()}
    db = fill_db(ExemplarDB(work_dir / "exemplars.sqlite", context=table.context), seeds, scores)
    g = protocol.generations
    config = load_config(RLStageConfig, None, {
        "model": str(start), "output_dir": str(work_dir / "grpo"), "use_cpu": True, "report_to": "none",
        "store": "none", "split": "all", "seed": seed, "num_generations": g,
        "per_device_train_batch_size": g * protocol.tasks_per_step, "gradient_accumulation_steps": 1,
        "max_steps": protocol.steps, "max_completion_length": 7, "learning_rate": protocol.learning_rate,
        "beta": protocol.beta, "temperature": 1.0, "top_p": 1.0, "vllm": "transformers", "logging_steps": 50,
        "save_steps": 10**9, "warmup_ratio": 0.0, "lr_scheduler_type": "constant", "exemplar_seed": "none",
        "exemplars_per_prompt": protocol.exemplars, "eval_threads": 1, "log_completions": False})
    history = None
    if style == "refine":
        history = RefineHistory(protocol.refine_turns)
        for tid, chosen in seeds.items():
            for recipe in chosen[:2]:
                history.add(tid, recipe, scores[tid][recipe])
        builder: Any = RefinePromptBuilder(history, features)
    else:
        builder = StudyPromptBuilder(db, style, protocol.exemplars, features, seed=sub_seed("train-builder", seed))
    shaping = reward_config(config)
    reward = RecordingReward(KernelReward(list(tasks.values()), evals, shaping, exemplar_db=db, extract=parse_recipe),
                             table, evals, history, seed=sub_seed("refine", seed))
    run_rl(config, model=model, tokenizer=tok, tasks=list(tasks.values()), reward_funcs=[reward], exemplar_db=db,
           prompt_builder=builder)
    return model, tok, {"steps": reward.steps, "reward": shaping.describe(),
                        "evaluations": len(reward.steps) * g * protocol.tasks_per_step}
