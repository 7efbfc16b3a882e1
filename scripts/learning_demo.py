"""Does contrastive RL learn? A task family whose answers really change the speed, measured on a GPU.

    PYTHONPATH=src python scripts/learning_demo.py measure OUT_DIR               # GPU: every recipe, every task
    PYTHONPATH=src python scripts/learning_demo.py train OUT_DIR --table OUT_DIR/table.json   # the arms
    PYTHONPATH=src python scripts/learning_demo.py all OUT_DIR                    # both, in one run
    PYTHONPATH=src python scripts/learning_demo.py recheck OUT_DIR --table T --recheck-n 16   # GPU: T still holds?
    PYTHONPATH=src python scripts/learning_demo.py train OUT_DIR --table T --seeds 1 \
        --against docs/results/learning_demo_runs.json      # one seed again, against the committed seeds' spread

The policy writes a short kernel *recipe* (`T256 V4 U4 C`: threads per block, floats per load, vectors per
thread, coalesced or blocked access) that a template turns into a raw-CUDA `ModelNew` for a fused
elementwise task (the reference is several PyTorch kernels; the candidate one). The recipe space is small
enough to be measured exhaustively, so the best possible speedup of every task is known:

1. `measure` runs every (task, recipe) candidate through the real evaluator (sandboxed runners, paired
   timing against the reference) and writes `table.json`: status and speedup of each.
2. `train` trains the arms at an equal evaluation budget (every arm sees `steps x batch` candidates; a
   candidate's reward is its measured result from the table, as the results store would return it):
   - `contrastive-bucket`: GRPO whose prompt shows exemplars from the growing database, drawn by CUDA-L1's
     bucket sampler (the project's `run_rl` with `ContrastivePromptBuilder`, `KernelReward`, `ExemplarDB`);
   - `contrastive-random`: the same with exemplars drawn uniformly;
   - `grpo-plain`: GRPO with the plain prompt (no exemplars);
   - `random-search`: recipes drawn uniformly;
   - `sft-only`: the warm-started policy (trained on the answer format only, random recipes), sampled.
   Every policy starts from the same warm start per seed: a tiny Llama trained from scratch on prompts of
   all styles with uniformly random recipes as answers (it learns the format, nothing about speed).
   Held-out tasks (never trained on) are scored before and after training.
3. The summary (`learning_demo.json`) and the figure (`learning_demo.png`) land in OUT_DIR; with `--against`
   (the committed run's `learning_demo_runs.json`) each arm's fraction of the best over its last 15 steps is
   compared with the 95 % prediction interval of the committed seeds (`against.json`).
4. `recheck` evaluates a random sample of the table's (task, recipe) pairs again through the real evaluator
   and writes `recheck.json`: each pair's speedup then and now, and the rank agreement of the sample.

The reward (`DEMO_REWARD`, stated in the summary's protocol): a candidate's raw speedup (failures 0), not
normalized and not clipped; GRPO's group-normalized advantage is the only scaling. Runs committed before
2026-12-04 paid min(speedup, 1.5) instead (the smoothing's clip was applied to raw speedups):
28 of gelu_2p24's 36 recipes earned the same reward there.

Per step and arm: the raw mean speedup of the batch (failures count 0), the fraction of the best possible
(each candidate's speedup over its task's best, averaged), the correct rate. Needs: a GPU for `measure`
(144 evaluations, about 4 s each on an H200: 9-10 minutes; `--measure-budget-s` stops it and a
second run measures what is missing); trl, datasets and matplotlib for `train` (3 seeds x 5 arms
in 13 minutes on a 2-core CPU: the policy is tiny, 0.36 M parameters). The measured table and the summary of
the committed run are in docs/results/ (`learning_demo_table.json`, `learning_demo.json`, the figure).
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import math
import random
import re
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))  # experimental/ (the contrastive study)

from cudal1.core.types import EvalResult, Status  # noqa: E402
from cudal1.exemplars import ExemplarDB  # noqa: E402
from cudal1.service.evaluator import as_evaluator  # noqa: E402
from cudal1.tasks.task import Task  # noqa: E402
from cudal1.train.common import completion_text  # noqa: E402
from cudal1.train.rewards import KernelReward, RewardConfig  # noqa: E402
from cudal1.train.rl import ContrastivePromptBuilder  # noqa: E402
from experimental.contrastive_study.stats import prediction_interval, spearman  # noqa: E402

logger = logging.getLogger("learning_demo")

# ----------------------------------------------------------------------------------------------- recipes

THREADS = (64, 256, 1024)
VECTOR = (1, 4)
UNROLL = (1, 4, 16)
ACCESS = ("C", "B")  # C: neighbouring threads take neighbouring vectors; B: each thread a contiguous run
_RECIPE = re.compile(r"T(\d+) V(\d+) U(\d+) ([A-Z])")


@dataclass(frozen=True)
class Recipe:
    threads: int
    vec: int
    unroll: int
    access: str

    @property
    def text(self) -> str:
        return f"T{self.threads} V{self.vec} U{self.unroll} {self.access}"


SPACE: tuple[Recipe, ...] = tuple(Recipe(*values) for values in itertools.product(THREADS, VECTOR, UNROLL, ACCESS))


def parse_recipe(text: str) -> str | None:
    """The canonical text of the first recipe in `text` that lies in the space, else None (unparseable)."""
    match = _RECIPE.search(text or "")
    if not match:
        return None
    recipe = Recipe(int(match[1]), int(match[2]), int(match[3]), match[4])
    return recipe.text if recipe in SPACE else None


# ----------------------------------------------------------------------------------------------- tasks

#: op name -> (the reference's PyTorch expression of x, the fused kernel's CUDA expression of v)
OPS = {
    "swish": ("x * torch.sigmoid(x) * 1.5 + 0.25", "v / (1.0f + expf(-v)) * 1.5f + 0.25f"),
    "gelu": ("0.5 * x * (1.0 + torch.erf(x * 0.7071067811865476))", "0.5f * v * (1.0f + erff(v * 0.70710678f))"),
    "mish": ("x * torch.tanh(torch.nn.functional.softplus(x))", "v * tanhf(v > 20.0f ? v : log1pf(expf(v)))"),
}
#: (op, log2 of the element count): trained on, and held out (an op at a size the policy never saw it at).
#: Kept small: every (task, recipe) pair is one evaluation on the GPU, about 4.5 s each on the H200 host.
TRAIN_TASKS = (("swish", 20), ("gelu", 24), ("mish", 18))
HELD_OUT_TASKS = (("swish", 24),)

REFERENCE = '''"""Fused elementwise {op} on 2^{log2} floats."""
import torch
import torch.nn as nn

N = {n}


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return {torch_expr}


def get_inputs():
    return [torch.randn(N)]


def get_init_inputs():
    return []
'''

CANDIDATE = '''import torch
import torch.nn as nn

from cudal1.raw_cuda import load_kernels

# recipe: {recipe}
SOURCE = r"""
__device__ __forceinline__ float op(float v) {{ return {cuda_expr}; }}

extern "C" __global__ void fused(const float* __restrict__ x, float* __restrict__ y, long long n) {{
    const long long nvec = n / {vec};
    const long long first = (long long)blockIdx.x * {threads} * {unroll};
#pragma unroll
    for (int k = 0; k < {unroll}; ++k) {{
        const long long v = {index};
        if (v < nvec) {{
{body}
        }}
    }}
    const long long rest = n - nvec * {vec};  // elements a vector load would overrun
    if (blockIdx.x == 0 && threadIdx.x < rest) {{
        const long long i = nvec * {vec} + threadIdx.x;
        y[i] = op(x[i]);
    }}
}}
"""
kernels = load_kernels(SOURCE)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        n = x.numel()
        per_block = {threads} * {unroll} * {vec}
        kernels.fused(grid=(max(1, (n + per_block - 1) // per_block),), block=({threads},), args=(x, y, n))
        return y
'''

_BODY = {
    1: "            y[v] = op(x[v]);",
    4: ("            float4 a = reinterpret_cast<const float4*>(x)[v];\n"
        "            a.x = op(a.x); a.y = op(a.y); a.z = op(a.z); a.w = op(a.w);\n"
        "            reinterpret_cast<float4*>(y)[v] = a;"),
}
_INDEX = {"C": "first + (long long)k * {threads} + threadIdx.x", "B": "first + (long long)threadIdx.x * {unroll} + k"}


def task_id(op: str, log2: int) -> str:
    return f"demo/{op}_2p{log2}"


def make_task(op: str, log2: int) -> Task:
    source = REFERENCE.format(op=op, log2=log2, n=1 << log2, torch_expr=OPS[op][0])
    return Task(task_id(op, log2), source, level=1, origin="learning_demo")


def candidate_source(task: Task, recipe_text: str) -> str:
    """The raw-CUDA `ModelNew` a recipe stands for, for `task`."""
    op = task.name.split("_")[0]
    r = next(r for r in SPACE if r.text == recipe_text)
    index = _INDEX[r.access].format(threads=r.threads, unroll=r.unroll)
    return CANDIDATE.format(recipe=r.text, cuda_expr=OPS[op][1], vec=r.vec, threads=r.threads, unroll=r.unroll,
                            index=index, body=_BODY[r.vec])


def all_tasks() -> tuple[list[Task], list[Task]]:
    return [make_task(*t) for t in TRAIN_TASKS], [make_task(*t) for t in HELD_OUT_TASKS]


# ----------------------------------------------------------------------------------------------- measure

def measure(out_dir: Path, *, profile: str, device: str, time_budget_s: float) -> Path:
    """Every recipe of every task through the real evaluator; `table.json` (rewritten as results arrive)."""
    from cudal1.eval.config import EvalConfig
    from cudal1.service.evaluator import make_evaluator

    train, held = all_tasks()
    tasks = train + held
    out = out_dir / "table.json"
    table: dict[str, Any] = {"protocol": {"profile": profile, "device": device, "space": [r.text for r in SPACE]},
                             "tasks": {t.id: {"held_out": t in held, "source": t.source, "recipes": {}}
                                       for t in tasks}}
    if out.is_file():  # a run cut short: measure what is missing
        kept = json.loads(out.read_text())
        table["tasks"].update({tid: entry for tid, entry in kept["tasks"].items() if tid in table["tasks"]})
        table.update({k: kept[k] for k in ("environment", "measure_s") if k in kept})
    todo = [(task, r.text) for task in tasks for r in SPACE if r.text not in table["tasks"][task.id]["recipes"]]
    pairs = [(task, candidate_source(task, recipe)) for task, recipe in todo]
    started = time.monotonic()
    spent = float(table.get("measure_s", 0.0))

    def on_result(i: int, result: EvalResult) -> None:
        task, recipe = todo[i]
        table["tasks"][task.id]["recipes"][recipe] = {
            "status": result.status.value, "speedup": result.speedup, "ref_ms": result.ref_ms,
            "candidate_ms": result.candidate_ms, "message": result.message[:200],
            "clock_retried": "clock_rejected_series" in result.protocol}
        table.setdefault("environment", result.environment)
        table["protocol"]["evaluator"] = result.protocol.get("version")
        done = sum(len(t["recipes"]) for t in table["tasks"].values())
        out.write_text(json.dumps(table, indent=1))
        logger.info("%d/%d %s %s: %s %s ref %s ms (%.0f s)", done, len(tasks) * len(SPACE), task.id, recipe,
                    result.status.value, f"{result.speedup:.2f}x" if result.speedup else "",
                    f"{result.ref_ms:.4f}" if result.ref_ms else "-", time.monotonic() - started)

    evaluator = make_evaluator("", EvalConfig(profile=profile, device=device))
    try:
        evaluator.evaluate(pairs, on_result=on_result, force=True,
                           should_stop=lambda: time.monotonic() - started > time_budget_s)
    finally:
        evaluator.close()
    table["measure_s"] = round(spent + time.monotonic() - started, 1)
    out.write_text(json.dumps(table, indent=1))
    return out


def recheck(table_path: Path, out_dir: Path, *, n: int, seed: int, profile: str, device: str) -> dict[str, Any]:
    """A random sample of the table's correct (task, recipe) pairs evaluated again: does the table still hold
    on this machine? Writes recheck.json: the speedups then and now, their ratio, the sample's rank
    agreement (Spearman's rho) and the median absolute log-ratio."""
    from cudal1.eval.config import EvalConfig
    from cudal1.service.evaluator import make_evaluator

    table = Table.load(table_path)
    tasks = {t.id: t for t in sum(all_tasks(), [])}
    correct = [(tid, recipe) for tid in sorted(table.tasks) for recipe, row in sorted(table.tasks[tid]["recipes"].items())
               if row["status"] == "correct" and row.get("speedup")]
    sample = random.Random(seed).sample(correct, min(n, len(correct)))
    pairs = [(tasks[tid], candidate_source(tasks[tid], recipe)) for tid, recipe in sample]
    rows: list[dict[str, Any]] = [{} for _ in sample]

    def on_result(i: int, result: EvalResult) -> None:
        tid, recipe = sample[i]
        then = table.speedup(tid, recipe)
        now = result.speedup if result.status is Status.CORRECT else None
        rows[i] = {"task": tid, "recipe": recipe, "then": round(then, 4), "now": round(now, 4) if now else None,
                   "status": result.status.value, "ratio": round(now / then, 4) if now else None}
        logger.info("%s %s: %.3fx then, %s now", tid, recipe, then, f"{now:.3f}x" if now else result.status.value)

    started = time.monotonic()
    evaluator = make_evaluator("", EvalConfig(profile=profile, device=device))
    try:
        evaluator.evaluate(pairs, on_result=on_result, force=True)
    finally:
        evaluator.close()
    both = [r for r in rows if r.get("now")]
    summary = {"n": len(sample), "correct_now": len(both), "seconds": round(time.monotonic() - started, 1),
               "spearman": round(spearman([r["then"] for r in both], [r["now"] for r in both]), 4) if len(both) > 2 else None,
               "median_abs_log_ratio": round(statistics.median(abs(math.log(r["ratio"])) for r in both), 4) if both else None,
               "rows": rows}
    (out_dir / "recheck.json").write_text(json.dumps(summary, indent=1))
    return summary


def against(runs: dict[str, list[dict[str, Any]]], committed: dict[str, list[dict[str, Any]]],
            window: int = 15) -> dict[str, Any]:
    """Each arm's fraction of the best over its last `window` steps, per seed of this run, against the 95 %
    prediction interval of the committed run's seeds (`prediction_interval`; their range is recorded too).
    A seed re-runs bit for bit only on the same machine with the same libraries; elsewhere (another CPU, a
    GPU, another torch) its numerics differ and GRPO amplifies the difference, so it is a new draw."""
    def tail(run: dict[str, Any]) -> float:
        return statistics.fmean(s["fraction_of_best"] for s in run["steps"][-window:])

    out: dict[str, Any] = {}
    for arm, arm_runs in runs.items():
        if arm not in committed:
            continue
        spread = [tail(r) for r in committed[arm]]
        lo, hi = prediction_interval(spread)
        now = [tail(r) for r in arm_runs]
        out[arm] = {"now": [round(v, 4) for v in now], "committed_seeds": len(spread),
                    "committed_min": round(min(spread), 4), "committed_max": round(max(spread), 4),
                    "interval": [round(lo, 4), round(hi, 4)], "inside": all(lo <= v <= hi for v in now)}
    return out


# ----------------------------------------------------------------------------------------------- table

class Table:
    """The measured results: a candidate's reward is looked up, as the results store would return it."""

    def __init__(self, data: dict[str, Any]):
        self.data = data
        self.tasks = data["tasks"]

    @classmethod
    def load(cls, path: Path) -> Table:
        return cls(json.loads(path.read_text()))

    def result(self, task: Task, recipe: str) -> EvalResult:
        row = self.tasks[task.id]["recipes"].get(recipe)
        if row is None:
            return EvalResult(Status.INFRA_ERROR, "not measured", task_id=task.id)
        return EvalResult(Status(row["status"]), row.get("message", ""), task_id=task.id, speedup=row["speedup"])

    def speedup(self, task_id: str, recipe: str | None) -> float:
        """The raw reward of a recipe: its speedup when correct, else 0."""
        row = self.tasks[task_id]["recipes"].get(recipe or "")
        return float(row["speedup"]) if row and row["status"] == "correct" and row["speedup"] else 0.0

    def best(self, task_id: str) -> float:
        return max(self.speedup(task_id, r) for r in self.tasks[task_id]["recipes"])

    def landscape(self, task_id: str) -> dict[str, float]:
        values = [self.speedup(task_id, r.text) for r in SPACE]
        return {"best": max(values), "median": statistics.median(values), "worst": min(values),
                "uniform_mean": statistics.fmean(values),
                "best_recipe": max(SPACE, key=lambda r: self.speedup(task_id, r.text)).text,
                "correct": sum(v > 0 for v in values), "recipes": len(values)}


# ----------------------------------------------------------------------------------------------- prompts

def task_line(task: Task) -> str:
    op, size = task.name.split("_")
    return f"task {op} n={size.replace('p', '^')}\n"


class RecipePromptBuilder(ContrastivePromptBuilder):
    """Recipe prompts: the task, then (contrastive) exemplars from the database with their speedups, worst
    first as CUDA-L1 shows them; with `sampler=None` the plain prompt. Exemplars are drawn exactly as stage 3
    draws them (the project's builder, only the rendering differs)."""

    def __init__(self, db: Any, sampler: str | None, n: int, seed: int):
        super().__init__(db, sampler=sampler or "random", sampler_config={"n": n}, seed=seed)
        self.show = sampler is not None

    def render(self, task: Task, exemplars: Any) -> list[dict[str, str]]:
        shown = exemplars if self.show else []
        return [{"role": "user", "content": prompt_text(task, [(e.code, e.score) for e in shown])}]


def prompt_text(task: Task, exemplars: list[tuple[str, float]]) -> str:
    return task_line(task) + "".join(f"{code} -> {score:.2f}x\n" for code, score in exemplars) + "recipe:"


# ----------------------------------------------------------------------------------------------- policy

MODEL_SPEC = "scratch:hidden=128,layers=2,heads=4,intermediate=256,max_positions=512"


def warm_start(out_dir: Path, tasks: list[Task], *, seed: int, records: int, epochs: int, use_cpu: bool) -> Path:
    """A tiny policy that writes well-formed recipes (uniformly random ones) after prompts of every style."""
    from cudal1.train.config import SFTStageConfig, load_config
    from cudal1.train.models import load_policy, save_policy
    from cudal1.train.sft import fit_sft

    rng = random.Random(seed)
    rows = []
    for _ in range(records):
        task = rng.choice(tasks)
        shown = sorted(((rng.choice(SPACE).text, rng.uniform(0.1, 4.0)) for _ in range(rng.choice((0, 0, 2, 4)))),
                       key=lambda e: e[1])
        rows.append({"prompt": [{"role": "user", "content": prompt_text(task, shown)}],
                     "completion": [{"role": "assistant", "content": " " + rng.choice(SPACE).text}]})
    model, tok = load_policy(MODEL_SPEC, seed=seed)
    config = load_config(SFTStageConfig, None, _common(out_dir / "sft", use_cpu, seed, learning_rate=3e-3,
                                                       dataset="(in memory)",
                                                       num_train_epochs=epochs, per_device_train_batch_size=32))
    trainer = fit_sft(model, tok, rows, [], config, output_dir=str(out_dir / "sft"), max_length=256)
    return save_policy(trainer.model, tok, out_dir / "sft" / "final")


def _common(output_dir: Path, use_cpu: bool, seed: int, **extra: Any) -> dict[str, Any]:
    values = {"model": MODEL_SPEC, "output_dir": str(output_dir), "use_cpu": use_cpu, "report_to": "none",
              "store": "none", "split": "all", "seed": seed, "gradient_accumulation_steps": 1, "logging_steps": 1,
              "warmup_ratio": 0.0, "lr_scheduler_type": "constant", "save_steps": 100000}
    values.update(extra)
    return values


def sample_recipes(model: Any, tok: Any, messages: list[dict[str, str]], k: int, seed: int) -> list[str | None]:
    """k sampled answers to one prompt (temperature 1), parsed to recipes."""
    import torch

    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tok(text, return_tensors="pt", add_special_tokens=False).input_ids.to(model.device)
    torch.manual_seed(seed)
    with torch.no_grad():
        out = model.generate(ids.repeat(k, 1), do_sample=True, temperature=1.0, top_p=1.0, max_new_tokens=18,
                             pad_token_id=tok.pad_token_id)
    return [parse_recipe(tok.decode(row[ids.shape[1]:], skip_special_tokens=True)) for row in out]


# ----------------------------------------------------------------------------------------------- arms

GRPO_ARMS = {"contrastive-bucket": "bucket", "contrastive-random": "random", "grpo-plain": None}
ARMS = (*GRPO_ARMS, "random-search", "sft-only")


@dataclass
class Budget:
    steps: int
    generations: int  # per task per step (a GRPO group)

    def per_step(self, tasks: int) -> int:
        return self.generations * tasks


def step_metrics(table: Table, batch: list[tuple[str, str | None]]) -> dict[str, float]:
    raws = [table.speedup(tid, recipe) for tid, recipe in batch]
    fractions = [table.speedup(tid, recipe) / table.best(tid) for tid, recipe in batch]
    return {"raw_reward_mean": statistics.fmean(raws), "fraction_of_best": statistics.fmean(fractions),
            "correct_rate": statistics.fmean(r > 0 for r in raws)}


def held_out_scores(table: Table, model: Any, tok: Any, builder: Any, tasks: list[Task], k: int,
                    seed: int) -> dict[str, dict[str, float]]:
    out = {}
    for task in tasks:
        recipes = sample_recipes(model, tok, builder.build(task, 0), k, seed)
        out[task.id] = step_metrics(table, [(task.id, r) for r in recipes])
    return out


def held_out_db(table: Table, path: Path, tasks: list[Task], seed: int, n: int = 4) -> ExemplarDB:
    """Exemplars for held-out prompts: `n` random recipes of each held-out task with their measured speedups
    (the same for every arm of a seed), as a user would seed a new task's database."""
    db = ExemplarDB(path)
    rng = random.Random(seed)
    for task in tasks:
        for r in rng.sample(SPACE, n):
            if table.speedup(task.id, r.text) > 0:
                db.add(task.id, r.text, table.speedup(task.id, r.text), {"source": "seed"})
    return db


def demo_reward(failure_rewards: dict[str, float], generations: int) -> RewardConfig:
    """The demo's reward: raw speedups (failures 0), not normalized and not clipped."""
    return RewardConfig(failure_rewards=failure_rewards, normalize=False, group_size=generations, eval_threads=1)


class RecordingReward:
    """The project's `KernelReward`, remembering which recipe each completion named (for the step metrics)."""

    __name__ = "kernel_reward"

    def __init__(self, reward: KernelReward):
        self.reward = reward
        self.batches: list[list[tuple[str, str | None]]] = []

    def __call__(self, completions: Any, task_id: Any, **kwargs: Any) -> list[float]:
        self.batches.append([(t, parse_recipe(completion_text(c))) for c, t in zip(completions, task_id, strict=True)])
        return self.reward(completions, task_id, **kwargs)


def run_grpo_arm(arm: str, table: Table, start: Path, out_dir: Path, train: list[Task], held: list[Task],
                 budget: Budget, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    """One GRPO arm through the project's stage 3 (`run_rl`), rewarded by `KernelReward` over the table."""
    from cudal1.train.config import RLStageConfig, load_config
    from cudal1.train.models import load_policy
    from cudal1.train.rl import run_rl

    sampler = GRPO_ARMS[arm]
    model, tok = load_policy(str(start))
    db = ExemplarDB(out_dir / "exemplars.sqlite")
    held_builder = RecipePromptBuilder(held_out_db(table, out_dir / "held_db.sqlite", held, seed), sampler,
                                       args.exemplars, seed)
    before = held_out_scores(table, model, tok, held_builder, held, args.held_out_samples, seed)
    config = load_config(RLStageConfig, None, _common(
        out_dir / "grpo", args.use_cpu, seed, num_generations=budget.generations,
        per_device_train_batch_size=budget.per_step(len(train)), max_steps=budget.steps, max_completion_length=18,
        learning_rate=args.lr, beta=0.0, temperature=1.0, top_p=1.0, vllm="transformers"))
    reward = RecordingReward(KernelReward(
        train, as_evaluator(table.result), demo_reward(config.failure_rewards, budget.generations),
        exemplar_db=db, extract=parse_recipe))
    run_rl(config, model=model, tokenizer=tok, tasks=train, reward_funcs=[reward], exemplar_db=db,
           prompt_builder=RecipePromptBuilder(db, sampler, args.exemplars, seed))
    after = held_out_scores(table, model, tok, held_builder, held, args.held_out_samples, seed)
    return {"steps": [step_metrics(table, b) for b in reward.batches], "held_out_before": before,
            "held_out_after": after, "exemplars": {t.id: db.count(t.id) for t in train}}


def run_sampling_arm(arm: str, table: Table, start: Path, train: list[Task], held: list[Task], budget: Budget,
                     seed: int, args: argparse.Namespace) -> dict[str, Any]:
    """`random-search` (uniform recipes) or `sft-only` (the warm start sampled with the plain prompt)."""
    steps = []
    rng = random.Random(seed)
    if arm == "random-search":
        for _ in range(budget.steps):
            steps.append(step_metrics(table, [(t.id, rng.choice(SPACE).text) for t in train
                                              for _ in range(budget.generations)]))
        uniform = {t.id: step_metrics(table, [(t.id, r.text) for r in SPACE]) for t in held}
        return {"steps": steps, "held_out_before": uniform, "held_out_after": uniform}
    from cudal1.train.models import load_policy

    model, tok = load_policy(str(start))
    builder = RecipePromptBuilder(None, None, args.exemplars, seed)
    for step in range(budget.steps):
        batch = []
        for task in train:
            batch += [(task.id, r) for r in sample_recipes(model, tok, builder.build(task, step), budget.generations,
                                                           seed * 100003 + step)]
        steps.append(step_metrics(table, batch))
    held_scores = held_out_scores(table, model, tok, builder, held, args.held_out_samples, seed)
    return {"steps": steps, "held_out_before": held_scores, "held_out_after": held_scores}


def train_arms(table_path: Path, out_dir: Path, args: argparse.Namespace) -> dict[str, Any]:
    table = Table.load(table_path)
    train, held = all_tasks()
    missing = [t.id for t in train + held if len(table.tasks.get(t.id, {}).get("recipes", {})) < len(SPACE)]
    if missing:
        raise SystemExit(f"{table_path}: not every recipe was measured for {', '.join(missing)}")
    budget = Budget(args.steps, args.generations)
    runs: dict[str, list[dict[str, Any]]] = {arm: [] for arm in args.arms}
    started = time.monotonic()
    for seed in range(args.seeds):
        seed_dir = out_dir / "runs" / f"seed{seed}"
        start = warm_start(seed_dir, train + held, seed=seed, records=args.sft_records, epochs=args.sft_epochs,
                           use_cpu=args.use_cpu)
        for arm in args.arms:
            arm_dir = seed_dir / arm
            t0 = time.monotonic()
            if arm in GRPO_ARMS:
                run = run_grpo_arm(arm, table, start, arm_dir, train, held, budget, seed, args)
            else:
                run = run_sampling_arm(arm, table, start, train, held, budget, seed, args)
            run["seconds"] = round(time.monotonic() - t0, 1)
            runs[arm].append(run)
            last = run["steps"][-1] if run["steps"] else {}
            logger.info("seed %d %s: %d steps, last raw mean %.3f, fraction of best %.3f (%.0f s; %.0f s so far)",
                        seed, arm, len(run["steps"]), last.get("raw_reward_mean", 0.0),
                        last.get("fraction_of_best", 0.0), run["seconds"], time.monotonic() - started)
    summary = summarize(table, runs, train, held, budget, args)
    summary["protocol"]["train_s"] = round(time.monotonic() - started, 1)
    (out_dir / "learning_demo.json").write_text(json.dumps(summary, indent=1))
    (out_dir / "learning_demo_runs.json").write_text(json.dumps(runs, indent=1))
    plot(summary, out_dir / "learning_demo.png")
    if args.against:
        summary["against"] = against(runs, json.loads(args.against.read_text()))
        (out_dir / "against.json").write_text(json.dumps(summary["against"], indent=1))
        for arm, entry in summary["against"].items():
            print(f"{arm:20s} last-15 fraction of best {entry['now']} vs the {entry['committed_seeds']} committed "
                  f"seeds' 95 % interval {entry['interval'][0]}-{entry['interval'][1]} (their range "
                  f"{entry['committed_min']}-{entry['committed_max']}): {'inside' if entry['inside'] else 'OUTSIDE'}")
    return summary


def _mean_curve(runs: list[dict[str, Any]], key: str) -> list[float]:
    length = min(len(r["steps"]) for r in runs)
    return [round(statistics.fmean(r["steps"][i][key] for r in runs), 4) for i in range(length)]


def summarize(table: Table, runs: dict[str, list[dict[str, Any]]], train: list[Task], held: list[Task],
              budget: Budget, args: argparse.Namespace) -> dict[str, Any]:
    best_possible = statistics.fmean(table.best(t.id) for t in train)
    arms = {}
    for arm, arm_runs in runs.items():
        curve = _mean_curve(arm_runs, "raw_reward_mean")
        arms[arm] = {"seeds": len(arm_runs), "steps": list(range(1, len(curve) + 1)), "raw_reward_mean": curve,
                     "fraction_of_best": _mean_curve(arm_runs, "fraction_of_best"),
                     "correct_rate": _mean_curve(arm_runs, "correct_rate"), "best_possible": round(best_possible, 4),
                     "last5_raw_reward_per_seed": [round(statistics.fmean(s["raw_reward_mean"]
                                                                          for s in r["steps"][-5:]), 4)
                                                   for r in arm_runs]}
    held_out = {}
    for arm, arm_runs in runs.items():
        held_out[arm] = {when: {t.id: {k: round(statistics.fmean(r[f"held_out_{when}"][t.id][k] for r in arm_runs), 4)
                                       for k in ("raw_reward_mean", "fraction_of_best", "correct_rate")}
                                for t in held}
                         for when in ("before", "after")}
    held_out["best_possible"] = {t.id: round(table.best(t.id), 4) for t in held}
    return {"arms": arms, "held_out": held_out,
            "protocol": {"evaluations_per_arm_and_seed": budget.steps * budget.per_step(len(train)),
                         "steps": budget.steps, "batch": budget.per_step(len(train)),
                         "generations_per_task": budget.generations, "train_tasks": [t.id for t in train],
                         "held_out_tasks": [t.id for t in held], "recipes": len(SPACE), "model": MODEL_SPEC,
                         "learning_rate": args.lr, "exemplars_per_prompt": args.exemplars,
                         "reward": demo_reward({}, budget.generations).describe(),
                         "sft_records": args.sft_records, "sft_epochs": args.sft_epochs,
                         "held_out_samples": args.held_out_samples,
                         "table": {"profile": table.data["protocol"].get("profile"),
                                   "evaluator_protocol": table.data["protocol"].get("evaluator"),
                                   "gpu": (table.data.get("environment") or {}).get("gpu_name"),
                                   "measure_s": table.data.get("measure_s")},
                         "landscape": {t.id: table.landscape(t.id) for t in train + held}}}


def plot(summary: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for arm, entry in summary["arms"].items():
        axes[0].plot(entry["steps"], entry["raw_reward_mean"], label=f"{arm} ({entry['seeds']} seeds)")
        axes[1].plot(entry["steps"], entry["fraction_of_best"], label=arm)
    best = next(iter(summary["arms"].values()))["best_possible"]
    axes[0].axhline(best, color="grey", linestyle=":", label="best possible (mean over tasks)")
    axes[0].set(xlabel="step", ylabel="raw mean speedup (failures 0)", title="training tasks")
    axes[1].set(xlabel="step", ylabel="fraction of the best possible", title="training tasks", ylim=(0, 1.05))
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ----------------------------------------------------------------------------------------------- main

def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("command", choices=("measure", "train", "all", "recheck"))
    p.add_argument("out_dir", type=Path)
    p.add_argument("--table", type=Path, help="A measured table.json (train; default OUT_DIR/table.json).")
    p.add_argument("--profile", default="cuda-l1", help="Evaluation profile of the measurement.")
    p.add_argument("--device", default="cuda", help="Evaluator device of the measurement.")
    p.add_argument("--measure-budget-s", type=float, default=480.0, help="Stop measuring after this long.")
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--generations", type=int, default=8, help="Candidates per task per step (a GRPO group).")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--exemplars", type=int, default=4, help="Exemplars per contrastive prompt.")
    p.add_argument("--sft-records", type=int, default=2000)
    p.add_argument("--sft-epochs", type=int, default=4)
    p.add_argument("--held-out-samples", type=int, default=64)
    p.add_argument("--gpu-training", action="store_true", help="Train the policies on the GPU (default: CPU).")
    p.add_argument("--against", type=Path, help="A committed learning_demo_runs.json: compare with its seeds.")
    p.add_argument("--recheck-n", type=int, default=16, help="Pairs of the table that `recheck` evaluates again.")
    args = p.parse_args(argv)
    args.use_cpu = not args.gpu_training
    return args


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    for noisy in ("cudal1", "httpx", "transformers", "trl"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    args = parse_args(argv)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    table = args.table or args.out_dir / "table.json"
    if args.command in ("measure", "all"):
        table = measure(args.out_dir, profile=args.profile, device=args.device, time_budget_s=args.measure_budget_s)
    if args.command == "recheck":
        found = recheck(table, args.out_dir, n=args.recheck_n, seed=0, profile=args.profile, device=args.device)
        print(f"recheck: {found['correct_now']}/{found['n']} correct again, Spearman {found['spearman']}, "
              f"median |log(now/then)| {found['median_abs_log_ratio']} ({found['seconds']} s)")
    if args.command in ("train", "all"):
        summary = train_arms(table, args.out_dir, args)
        for arm, entry in summary["arms"].items():
            curve = entry["raw_reward_mean"]
            print(f"{arm:20s} raw mean speedup first {curve[0]:.3f} last {curve[-1]:.3f} "
                  f"(best possible {entry['best_possible']:.3f}); fraction of best last "
                  f"{entry['fraction_of_best'][-1]:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
