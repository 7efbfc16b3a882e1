"""Pieces every training stage shares: tasks of a split, TRL/transformers arguments, callbacks, run records,
and parallel evaluation of a batch of candidates.

Argument names of transformers/TRL move between versions (tested: transformers 5.24, TRL 1.16); they are
mapped in one place, `make_training_args`, which keeps only the names the installed version knows.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cudal1.core.errors import ConfigError
from cudal1.core.types import EvalResult, Status
from cudal1.eval.config import resolve_device
from cudal1.integrations.common import completion_text  # noqa: F401 - used by the stages
from cudal1.service.evaluator import Evaluator, as_evaluator, make_evaluator
from cudal1.store import ResultsStore
from cudal1.tasks import load_tasks
from cudal1.tasks.splits import TaskSplit, load_or_make_split, select_tasks
from cudal1.tasks.task import Task
from cudal1.train.config import CommonTrainConfig, write_resolved_config

logger = logging.getLogger(__name__)

#: A plain function `(task, candidate source) -> EvalResult`. Where a stage evaluates it takes one of these or an
#: `Evaluator` (`service.evaluator`: this process, a pool, a reward server); `as_evaluator` makes either one.
EvaluateFn = Callable[[Task, str], EvalResult]


def resolve_tasks(config: CommonTrainConfig, tasks: Sequence[Task] | None = None) -> list[Task]:
    """The tasks of `config.split` from `config.source` (or from `tasks`), at most `max_tasks` of them."""
    if tasks is None:
        tasks = load_tasks(config.source)
    split, split_path = run_split(config, tasks)
    chosen = select_tasks(tasks, config.split, split)
    if config.max_tasks > 0:
        chosen = chosen[:config.max_tasks]
    if not chosen:
        raise ConfigError(f"no tasks in split {config.split!r} of {config.source!r} (split file {split_path})")
    return chosen


def run_split(config: CommonTrainConfig, tasks: Sequence[Task]) -> tuple[TaskSplit, str]:
    """The run's train/test split and its file: `splits_file`, else `<output_dir>/splits.json` (made there
    when missing). Every stage reads the same file, so held-out tasks stay held out."""
    split_path = config.splits_file or str(Path(config.output_dir) / "splits.json")
    return load_or_make_split(split_path, tasks, test_fraction=config.test_fraction, seed=config.split_seed), split_path


def _arg_names(args_cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(args_cls)}


def make_training_args(args_cls: type, config: CommonTrainConfig, **extra: Any) -> Any:
    """A TRL/transformers args object from a stage config plus stage-specific `extra` values.

    Unknown names (another TRL version) are dropped with a warning rather than failing the run.
    """
    names = _arg_names(args_cls)
    values: dict[str, Any] = {
        "output_dir": config.output_dir, "learning_rate": config.learning_rate,
        "lr_scheduler_type": config.lr_scheduler_type, "weight_decay": config.weight_decay,
        "max_grad_norm": config.max_grad_norm, "num_train_epochs": config.num_train_epochs,
        "max_steps": config.max_steps, "per_device_train_batch_size": config.per_device_train_batch_size,
        "gradient_accumulation_steps": config.gradient_accumulation_steps, "seed": config.seed,
        "bf16": config.bf16, "logging_steps": config.logging_steps, "save_steps": config.save_steps,
        "save_total_limit": config.save_total_limit, "report_to": config.report_targets,
        "use_cpu": config.use_cpu, "save_strategy": "steps", "disable_tqdm": True,
    }
    if "warmup_ratio" in names:
        values["warmup_ratio"] = config.warmup_ratio
    else:
        values["warmup_steps"] = config.warmup_ratio  # transformers >= 5: a float < 1 is a ratio
    ckpt_name = "activation_checkpointing" if "activation_checkpointing" in names else "gradient_checkpointing"
    values[ckpt_name] = config.gradient_checkpointing
    if config.gradient_checkpointing and "gradient_checkpointing_kwargs" in names:
        values["gradient_checkpointing_kwargs"] = {"use_reentrant": False}
    values.update(extra)
    dropped = sorted(k for k in values if k not in names)
    if dropped:
        logger.warning("%s does not know %s; ignored", args_cls.__name__, ", ".join(dropped))
    return args_cls(**{k: v for k, v in values.items() if k in names})


def resolve_resume(config: CommonTrainConfig) -> str | None:
    """The checkpoint to resume from: a path, the newest under output_dir ('latest'), or None."""
    spec = config.resume_from_checkpoint
    if not spec:
        return None
    if spec in ("latest", "auto", "true"):
        ckpts = sorted(Path(config.output_dir).glob("checkpoint-*"),
                       key=lambda p: int(p.name.split("-")[-1]) if p.name.split("-")[-1].isdigit() else -1)
        if not ckpts:
            logger.warning("resume requested but %s has no checkpoint; starting fresh", config.output_dir)
            return None
        return str(ckpts[-1])
    if not Path(spec).is_dir():
        raise ConfigError(f"resume_from_checkpoint {spec!r} is not a checkpoint directory")
    return spec


def training_device(config: Any) -> str:
    """Where the trainer will put the model: the GPU when one is visible, unless `use_cpu`."""
    import torch

    return "cpu" if getattr(config, "use_cpu", False) or not torch.cuda.is_available() else "cuda"


def time_budget_callback(budget_s: float, save: bool = True) -> Any:
    """A transformers `TrainerCallback` that stops training cleanly after `budget_s` seconds, saving a
    checkpoint there unless `save` is False (a caller that saves the model itself)."""
    import transformers

    class TimeBudgetCallback(transformers.TrainerCallback):
        """Stops training once the wall-clock budget of the stage is spent."""

        def __init__(self) -> None:
            self.started_s = time.monotonic()
            self.stopped_early = False

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.started_s = time.monotonic()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            if budget_s > 0 and time.monotonic() - self.started_s >= budget_s:
                logger.info("time budget of %.0f s spent at step %d; stopping", budget_s, state.global_step)
                self.stopped_early = True
                control.should_training_stop = True
                control.should_save = save
            return control

    return TimeBudgetCallback()


@dataclass
class StageResult:
    """What a stage leaves behind: where the final policy is, its log and a summary."""

    stage: str
    output_dir: str
    final_model_dir: str
    log_history: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    run_id: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def world_size() -> int:
    """Processes of this run (torchrun and accelerate set WORLD_SIZE; 1 alone)."""
    return int(os.environ.get("WORLD_SIZE", "1") or 1)


def process_rank() -> int:
    """This process's rank in a multi-process run (0 alone)."""
    return int(os.environ.get("RANK", "0") or 0)


def is_main_process() -> bool:
    """Whether this process writes the run's files (rank 0 of a multi-process run, or the only process)."""
    return int(os.environ.get("RANK", "0") or 0) == 0


class RunRecorder:
    """Writes the resolved config into the run directory and the store's run record; finishes both. In a
    multi-process run only the main process writes (the others would race it for the same files)."""

    def __init__(self, kind: str, config: CommonTrainConfig, store: Any = None):
        self.kind = kind
        self.config = config
        self.store = store
        self.dir = Path(config.output_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.writes = is_main_process()
        if self.writes:
            write_resolved_config(config, self.dir)
        self.run_id = (store.start_run(kind, {"stage": kind, **config.to_dict(), "world_size": world_size()})
                       if store is not None and self.writes else None)

    def finish(self, result: StageResult) -> StageResult:
        """Write `summary.json` and `log_history.json`, close the store's run record; return `result`."""
        result.run_id = self.run_id
        result.summary.setdefault("world_size", world_size())
        if not self.writes:
            return result
        (self.dir / "log_history.json").write_text(json.dumps(result.log_history, indent=1, default=str))
        (self.dir / "summary.json").write_text(json.dumps(result.summary, indent=1, default=str))
        if self.store is not None and self.run_id is not None:
            self.store.finish_run(self.run_id, result.summary)
        return result


def open_store(spec: str) -> Any:
    """The results store of a run: '' default, 'none' disabled, else a path."""
    if spec == "none":
        return None

    return ResultsStore(spec or None)


def check_evaluation_device(config: CommonTrainConfig) -> None:
    """`ConfigError` (fix: device=cpu) when this machine evaluates the rewards (no pool elsewhere) on a GPU it
    does not have: called first by the stages that evaluate, before a model is loaded, where `--set
    eval_device=cuda` on a CPU machine failed every reward later. Not in the config's checks: a recipe for a GPU
    machine is a valid config anywhere."""
    if not config.workers or config.workers == "local":
        resolve_device(config.eval_config().device)


def default_evaluator(config: CommonTrainConfig, store: Any = None, run_id: str | None = None,
                      label: str = "") -> Evaluator:
    """`(task, source) -> EvalResult` through the hardened evaluator with the run's settings and store, where
    `config.workers` says (this process, a pool or a reward server); the caller closes it."""
    return make_evaluator(config.workers, config.eval_config(), store=store, label=label, run_id=run_id)


def evaluate_batch(evaluator: EvaluateFn | Evaluator, items: Sequence[tuple[Task, str | None]],
                   threads: int) -> list[EvalResult]:
    """Evaluate a batch of (task, source) pairs through the evaluator interface (`service.evaluator`), in
    order. A None source (no code could be extracted) is UNPARSEABLE without evaluation; a candidate the
    evaluator failed on is INFRA_ERROR (the evaluator failed, not the candidate). `threads` is the number of
    calls at once for a plain function or requests in flight to a reward server; in this process and in
    pools the evaluator schedules the batch itself (builds in parallel, one timed candidate per GPU)."""
    runnable = [(task, source) for task, source in items if source is not None]
    judged = iter(as_evaluator(evaluator, concurrency=threads).evaluate(runnable))
    results = []
    for task, source in items:
        result = next(judged) if source is not None else None
        results.append(result or EvalResult.unparseable(task.id, "no ModelNew code block found"))
    return results


def first_failure(results: Sequence[EvalResult]) -> str:
    """The first failed result as 'status: message' (trimmed), '' when none failed: a log line that says why
    a batch earned nothing."""
    failed = next((r for r in results if r.status is not Status.CORRECT), None)
    if failed is None:
        return ""
    message = " ".join((failed.message or "").split())
    return f"{failed.status.value}: {message[:160]}"


def fenced(code: str) -> str:
    """The assistant answer used as an SFT target for a code-only example."""
    return f"```python\n{code.rstrip()}\n```"
