"""Evaluate a trained policy on a task split: pass@k, success rate, speedups in the paper's format.

For each task of the split, `samples` completions of the plain (or contrastive) prompt are generated
(a local checkpoint through `HFBackend`, or any `--llm` spec), each is evaluated by the hardened evaluator,
and the report gives:
- pass@k for k = 1, 2, 4, ... up to `samples` (the unbiased estimator 1 - C(n-c, k) / C(n, k) of
  Chen et al. 2021, averaged over tasks);
- the sample success rate (correct samples / samples) and the task success rate;
- the mean / median / max / p25 / p75 of the best speedup per task, failures counted as 1.0x like
  CUDA-L1's tables (`cudal1.metrics.summarize`), plus fast_p and the geometric mean.

Run: `cudal1 evaluate-policy runs/rl/final --split test --samples 8`.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from cudal1.core.errors import ConfigError
from cudal1.core.types import Status
from cudal1.eval.config import EvalConfig, resolve_device
from cudal1.exemplars import ExemplarDB
from cudal1.llm import LLMConfig, make_backend
from cudal1.llm.extract import extract_completion
from cudal1.llm.prompts import build_plain_prompt, resolve_form
from cudal1.metrics import summarize
from cudal1.service.evaluator import make_evaluator
from cudal1.tasks import load_tasks
from cudal1.tasks.splits import SPLIT_NAMES, load_or_make_split, make_split, select_tasks
from cudal1.tasks.task import Task
from cudal1.train.common import EvaluateFn, evaluate_batch
from cudal1.train.models import load_policy
from cudal1.train.rl import ContrastivePromptBuilder

logger = logging.getLogger(__name__)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct (Chen et al. 2021)."""
    if not 0 <= c <= n or k < 1 or k > n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n (n={n}, c={c}, k={k})")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


@dataclass
class PolicyEvalConfig:
    """Settings of `evaluate-policy`."""

    checkpoint: str = field(default="", metadata={"help": "REQUIRED unless llm is set: model directory to sample."})
    llm: str = field(default="", metadata={"help": "Instead of a checkpoint: an LLM spec (openai:MODEL@URL, hf:PATH)."})
    source: str = field(default="builtin", metadata={"help": "Task source."})
    split: str = field(default="test", metadata={"help": "train, test or all."})
    splits_file: str = field(default="", metadata={"help": "Split JSON (as written by training); empty: no split "
                                                           "file means a fresh split from split_seed/test_fraction."})
    test_fraction: float = field(default=0.2, metadata={"help": "Held-out fraction for a fresh split."})
    split_seed: int = field(default=0, metadata={"help": "Seed for a fresh split."})
    samples: int = field(default=8, metadata={"help": "Completions per task (k of pass@k is at most this)."})
    temperature: float = field(default=1.0, metadata={"help": "Sampling temperature."})
    max_new_tokens: int = field(default=4096, metadata={"help": "Longest completion."})
    batch_size: int = field(default=8, metadata={"help": "Prompts per generation batch."})
    form: str = field(default="auto", metadata={
        "help": "Candidate form asked for: auto (torch when candidates are evaluated on this machine's CPU, "
                "else raw_cuda, as in training), raw_cuda, load_inline, torch or kernel (a JSON launch spec)."})
    exemplar_db: str = field(default="", metadata={"help": "Exemplar database (as stage 3 writes it): prompts are "
                                                           "then CUDA-L1's contrastive prompt, the distribution a "
                                                           "contrastively trained policy learnt on; empty: plain."})
    max_tasks: int = field(default=0, metadata={"help": "At most this many tasks (0: all)."})
    output: str = field(default="", metadata={"help": "Write the JSON report here (optional)."})
    seed: int = field(default=0, metadata={"help": "Sampling seed."})

    def __post_init__(self) -> None:
        if not (self.checkpoint or self.llm):
            raise ConfigError("give a checkpoint directory or --llm SPEC")
        if self.split not in SPLIT_NAMES:
            raise ConfigError(f"split must be one of {', '.join(SPLIT_NAMES)}, not {self.split!r}")
        if self.samples < 1:
            raise ConfigError("samples must be >= 1")
        if self.exemplar_db and not Path(self.exemplar_db).is_file():
            raise ConfigError(f"exemplar database {self.exemplar_db} does not exist")


@dataclass
class TaskOutcome:
    """Samples and successes of one task."""

    task_id: str
    level: int | None
    n: int
    correct: int
    best_speedup: float | None
    statuses: dict[str, int] = field(default_factory=dict)


@dataclass
class PolicyEvalReport:
    """The result of `evaluate_policy`."""

    split: str
    samples: int
    tasks: list[TaskOutcome]
    pass_at: dict[int, float]
    success_rate: float
    task_success_rate: float
    speedup: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["pass_at"] = {f"pass@{k}": v for k, v in self.pass_at.items()}
        return out

    def table_rows(self) -> list[tuple[str, str]]:
        """(metric, value) rows in the paper's order."""
        def num(x: Any, spec: str = ".2f", suffix: str = "x") -> str:
            return "-" if x is None else f"{x:{spec}}{suffix}"

        s = self.speedup
        rows = [("tasks", str(len(self.tasks))), ("samples/task", str(self.samples))]
        rows += [(f"pass@{k}", f"{v:.3f}") for k, v in self.pass_at.items()]
        rows += [("success rate (samples)", f"{self.success_rate:.1%}"),
                 ("success rate (tasks)", f"{self.task_success_rate:.1%}"),
                 ("mean speedup", num(s.get("mean"))), ("median speedup", num(s.get("median"))),
                 ("max speedup", num(s.get("max"))), ("p25", num(s.get("p25"))), ("p75", num(s.get("p75"))),
                 ("> 1.01x", str(s.get("count_above_1_01", 0))), ("geomean (successes)", num(s.get("geomean")))]
        return rows


def ks_for(samples: int) -> list[int]:
    """1, 2, 4, ... up to `samples`, and `samples` itself."""
    ks, k = [], 1
    while k < samples:
        ks.append(k)
        k *= 2
    return ks + [samples]


def build_report(split: str, tasks: Sequence[Task], per_task: dict[str, list[Any]], samples: int) -> PolicyEvalReport:
    """A report from each task's evaluation results."""

    outcomes = []
    for task in tasks:
        results = per_task.get(task.id, [])
        speedups = [r.speedup for r in results if r.status is Status.CORRECT and r.speedup is not None]
        statuses: dict[str, int] = {}
        for r in results:
            statuses[r.status.value] = statuses.get(r.status.value, 0) + 1
        outcomes.append(TaskOutcome(task.id, task.level, len(results),
                                    sum(r.status is Status.CORRECT for r in results),
                                    max(speedups) if speedups else None, statuses))
    n_samples = sum(o.n for o in outcomes)
    pass_at = {k: sum(pass_at_k(o.n, o.correct, k) for o in outcomes) / len(outcomes)
               for k in ks_for(samples)} if outcomes and all(o.n >= samples for o in outcomes) else {}
    summary = summarize([o.best_speedup for o in outcomes])
    return PolicyEvalReport(split=split, samples=samples, tasks=outcomes, pass_at=pass_at,
                            success_rate=sum(o.correct for o in outcomes) / n_samples if n_samples else 0.0,
                            task_success_rate=(sum(o.correct > 0 for o in outcomes) / len(outcomes)
                                               if outcomes else 0.0),
                            speedup=summary.to_dict())


def _tasks_of(config: PolicyEvalConfig, tasks: Sequence[Task] | None) -> list[Task]:
    if tasks is None:
        tasks = load_tasks(config.source)
    split = None
    if config.split != "all":
        if config.splits_file:
            if not Path(config.splits_file).is_file():
                raise ConfigError(f"split file {config.splits_file} does not exist")
            split = load_or_make_split(config.splits_file, tasks)
        else:
            split = make_split(tasks, test_fraction=config.test_fraction, seed=config.split_seed)
    chosen = select_tasks(tasks, config.split, split)
    return chosen[:config.max_tasks] if config.max_tasks > 0 else chosen


def _backend(config: PolicyEvalConfig) -> Any:
    spec = config.llm or f"hf:{config.checkpoint}"
    llm_cfg = LLMConfig(spec=spec, temperature=config.temperature, max_tokens=config.max_new_tokens,
                        concurrency=config.batch_size, seed=config.seed)
    if spec.startswith("hf:") and not config.llm:
        model, tok = load_policy(config.checkpoint)
        import torch

        if torch.cuda.is_available():
            model = model.to("cuda")
        return make_backend(llm_cfg, model=model, tokenizer=tok)
    return make_backend(llm_cfg)


def _prompts(config: PolicyEvalConfig, tasks: Sequence[Task], device: str) -> list[list[dict[str, str]]]:
    """Plain prompts, or with `exemplar_db` the contrastive prompts stage 3 builds (same sampler and seed)."""
    form = resolve_form(config.form, device)
    if not config.exemplar_db:
        return [build_plain_prompt(t.source, form=form) for t in tasks]
    builder = ContrastivePromptBuilder(ExemplarDB(config.exemplar_db), form=form, seed=config.seed)
    return [builder.build(t) for t in tasks]


def evaluate_policy(config: PolicyEvalConfig, *, eval_config: EvalConfig | None = None, store: Any = None,
                    threads: int = 4, backend: Any = None, evaluator: EvaluateFn | None = None,
                    tasks: Sequence[Task] | None = None) -> PolicyEvalReport:
    """Sample, evaluate and report (see the module docstring).

    `evaluator` defaults to the hardened evaluator with `eval_config` (default `EvalConfig()`) and `store`;
    `backend` defaults to the checkpoint (or `config.llm`); `threads` candidates are evaluated at once.
    """
    chosen = _tasks_of(config, tasks)
    if not chosen:
        raise ConfigError(f"no tasks in split {config.split!r} of {config.source!r}")
    backend = backend or _backend(config)
    if evaluator is None:
        evaluator = make_evaluator("", eval_config or EvalConfig(), store=store,
                                   label=f"policy:{config.checkpoint or config.llm}")
    remote = str(getattr(evaluator, "spec", "")).startswith(("ray", "http"))  # candidates run elsewhere
    where = "remote" if remote else resolve_device((eval_config or EvalConfig()).device)
    prompts = _prompts(config, chosen, where)
    groups = backend.generate(prompts, n=config.samples)
    items = [(task, extract_completion(c.text).code if c.ok else None)
             for task, group in zip(chosen, groups, strict=True) for c in group]
    results = evaluate_batch(evaluator, items, threads)
    per_task: dict[str, list[Any]] = {}
    for (task, _), result in zip(items, results, strict=True):
        per_task.setdefault(task.id, []).append(result)
    report = build_report(config.split, chosen, per_task, config.samples)
    if config.output:
        Path(config.output).parent.mkdir(parents=True, exist_ok=True)
        Path(config.output).write_text(json.dumps(report.to_dict(), indent=1, default=str))
    return report
