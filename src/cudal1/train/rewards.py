"""The GRPO reward: the hardened evaluator's verdict -> raw reward -> reward smoothing, with side effects.

Per completion: extract the `ModelNew` code; evaluate it (a batch runs in parallel, each candidate in its own
isolated process); the raw reward (`cudal1.core.rewards.reward_of`) is the speedup for a CORRECT candidate
and `failure_rewards[status]` (default 0.0, the paper's) for any failure; then the configured transform
(`transform`: `speedup` as it is, `log`, or `bounded` to [0, 3]; `cudal1.core.rewards.transform_reward`).
Then reward smoothing (`cudal1.core.rewards.smooth_rewards`, design section 5), when `normalize` is set:
normalize within each group of `group_size` completions of one prompt (`scope=group`, the default: one
task's large speedups cannot set the scale of another task's rewards) or over the whole batch
(`scope=batch`), and clip the normalized values to [-k, k] (k = 1.5). The normalization has a dead band
(`noise_floor`): a group is divided by max(std, noise_floor x its mean), so candidates within measurement
noise of each other get small rewards, not +-1 (with `transform=log`, whose differences are relative, the
floor is `noise_floor` itself). Without `normalize` the transformed rewards pass unchanged: the clip belongs
to the smoothing and never caps raw speedups (a cap on raw speedups is `transform=bounded`). GRPO then forms
the advantage from these values; stage 3 tells TRL not to scale them again (`scale_rewards: none`: TRL's own
division by the group's std would undo both the clip and the dead band).

An exemplar copy (`copy_reward`): a correct candidate whose normalised source (`norm_hash`) is one of the
exemplars its prompt showed (the trainer passes them as `shown_exemplars`) is paid as that exemplar's score
less `copy_margin` of it (`margin`, the default), nothing (`zero`), or as evaluated (`full`, the paper's
way, which paid the study's policy for copying 13 % of the time). It is still evaluated, so its speedup
joins the exemplar's evaluations (a once-evaluated exemplar's noisy score is measured again), and it is
flagged: `exemplar_copy` in completions.jsonl, `kernel/exemplar_copies` in the metrics.

Side effects, by design:
- every CORRECT candidate enters the exemplar database with its speedup as score (the contrastive prompts
  built afterwards can show it);
- an optional judge (`Judge.check(task, source, result) -> bool | None`, True = legitimate, None = no
  verdict) is asked about a speedup above `judge_jump_factor` x the task's best so far; a "cheat" verdict
  sets the reward to the HACK_DETECTED failure value and keeps the candidate out of the database;
- a judge that raises or gives no verdict *fails closed* by default (`judge_on_error="closed"`): the
  candidate is flagged `judge.error`, stays out of the database, and pays no more than the task's best
  verified speedup so far; with no verified speedup yet it is an INFRA_ERROR (its failure reward), since
  nothing vouches for it. `judge_on_error="open"` keeps the evaluator's verdict instead (a judge outage then
  lets a cheat through: without `openai` installed a 50x cheat kept its 50);
- metrics: TRL logs this function's smoothed output as `rewards/kernel_reward/mean`; the raw speedups,
  success rate and judge vetoes go through TRL's `log_metric` hook when present, and into `self.history`.

This module is the trainer-side reward used by `cudal1 train rl`. `cudal1.integrations.trl` (the public TRL
adapter) shares the verdict -> reward rule with it through `cudal1.core.rewards`.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from cudal1.core.rewards import (
    DEFAULT_LOG_FLOOR,
    DEFAULT_NOISE_FLOOR,
    DEFAULT_REWARD_BOUND,
    REWARD_TRANSFORMS,
    SPEEDUP_ESTIMATES,
    check_failure_rewards,
    failure_reward,
    finite,
    reward_of,
    smooth_rewards,
    transform_reward,
)
from cudal1.core.types import EvalResult, Flag, Severity, Status
from cudal1.exemplars.db import normalized_hash, score_context
from cudal1.llm.extract import extract_completion
from cudal1.tasks.task import Task
from cudal1.train.common import EvaluateFn, completion_text, evaluate_batch, first_failure

logger = logging.getLogger(__name__)


@runtime_checkable
class Judge(Protocol):
    """Second opinion on a suspicious speedup: True when the candidate looks legitimate, False for a cheat."""

    def check(self, task: Task, source: str, result: EvalResult) -> bool | None:
        """Inspect one candidate and its verdict: True legitimate, False a cheat, None no verdict."""
        ...


#: What a judge's failure does to a candidate's reward (`RewardConfig.judge_on_error`).
JUDGE_ON_ERROR = ("closed", "open")
#: What a copy of an exemplar shown in its prompt earns (`RewardConfig.copy_reward`).
COPY_REWARDS = ("margin", "zero", "full")


@dataclass
class RewardConfig:
    """How verdicts become rewards."""

    failure_rewards: dict[str, float] = field(default_factory=dict, metadata={
        "help": "Raw reward per failure status (missing statuses: 0.0)."})
    transform: str = field(default="speedup", metadata={
        "help": "Raw reward -> reward: speedup (as it is, the paper's), log (ln of max(raw, log_floor)) or "
                "bounded (clipped to [0, bound], Dr.Kernel's [0, 3])."})
    speedup_estimate: str = field(default="point", metadata={
        "help": "Speedup a correct candidate earns: point (the evaluator's) or lower (the low end of its 95 % "
                "interval: a gain the measurement cannot tell from noise earns about 1x)."})
    bound: float = field(default=DEFAULT_REWARD_BOUND, metadata={"help": "transform=bounded: the cap."})
    log_floor: float = field(default=DEFAULT_LOG_FLOOR, metadata={
        "help": "transform=log: raw rewards below this (failures' 0) are taken as this before the logarithm."})
    normalize: bool = field(default=True, metadata={
        "help": "Reward smoothing: normalize rewards by mean/std (then clip to [-clip_k, clip_k]); off: the "
                "transformed rewards pass unchanged, unclipped."})
    clip_k: float = field(default=1.5, metadata={"help": "Clip normalized rewards to [-k, k] (only with normalize)."})
    noise_floor: float = field(default=DEFAULT_NOISE_FLOOR, metadata={
        "help": "Dead band of the normalization: divide a group by max(std, noise_floor x its mean) (transform=log: "
                "by max(std, noise_floor)); 0: plain standardisation."})
    copy_reward: str = field(default="margin", metadata={
        "help": "A correct copy of an exemplar shown in its prompt (same norm_hash) earns: margin (the exemplar's "
                "score less copy_margin of it), zero, or full (as evaluated)."})
    copy_margin: float = field(default=0.05, metadata={
        "help": "copy_reward=margin: the share of the exemplar's score a copy does not earn."})
    scope: str = field(default="group", metadata={
        "help": "Normalization scope: group (each prompt's group_size completions on their own) or batch."})
    group_size: int = field(default=8, metadata={
        "help": "Completions per prompt (scope=group): TRL's num_generations (8 by default, as stage 3's)."})
    judge_jump_factor: float = field(default=3.0, metadata={
        "help": "Ask the judge above this factor x the task's best speedup so far."})
    judge_on_error: str = field(default="closed", metadata={
        "help": "When the judge raises or gives no verdict: closed (flag the candidate, keep it out of the "
                "exemplar database, pay at most the task's best verified speedup, or INFRA_ERROR's reward when "
                "there is none) or open (keep the evaluator's verdict)."})
    eval_threads: int = field(default=4, metadata={"help": "Candidates evaluated in parallel."})

    def __post_init__(self) -> None:
        for name in ("clip_k", "bound", "log_floor", "judge_jump_factor", "noise_floor", "copy_margin"):
            finite(getattr(self, name), name)
        check_failure_rewards(self.failure_rewards)
        if self.clip_k <= 0:
            raise ValueError("clip_k must be > 0")
        if self.scope not in ("batch", "group"):
            raise ValueError("scope must be batch or group")
        if self.normalize and self.scope == "group" and self.group_size < 2:
            raise ValueError("scope=group normalizes each prompt's completions: set group_size >= 2 (TRL's "
                             "num_generations), or scope=batch, or normalize=False")
        if self.transform not in REWARD_TRANSFORMS:
            raise ValueError(f"transform must be one of {', '.join(REWARD_TRANSFORMS)}, not {self.transform!r}")
        if self.bound <= 0 or self.log_floor <= 0:
            raise ValueError("bound and log_floor must be > 0")
        if self.speedup_estimate not in SPEEDUP_ESTIMATES:
            raise ValueError(f"speedup_estimate must be one of {', '.join(SPEEDUP_ESTIMATES)}, "
                             f"not {self.speedup_estimate!r}")
        if self.judge_on_error not in JUDGE_ON_ERROR:
            raise ValueError(f"judge_on_error must be closed or open, not {self.judge_on_error!r}")
        if self.noise_floor < 0:
            raise ValueError(f"noise_floor must be >= 0, got {self.noise_floor}")
        if self.copy_reward not in COPY_REWARDS:
            raise ValueError(f"copy_reward must be one of {', '.join(COPY_REWARDS)}, not {self.copy_reward!r}")
        if not 0.0 <= self.copy_margin <= 1.0:
            raise ValueError(f"copy_margin must be in [0, 1], got {self.copy_margin}")

    def describe(self) -> str:
        """The reward in one line, as a report states it (e.g. 'raw speedup, unnormalized, unclipped')."""
        paid = "speedup" if self.speedup_estimate == "point" else "speedup's 95 % low end"
        kind = {"speedup": f"raw {paid}", "log": f"ln(max({paid}, {self.log_floor:g}))",
                "bounded": f"{paid} clipped to [0, {self.bound:g}]"}[self.transform]
        if not self.normalize:
            return f"{kind} (failures: their failure reward), not normalized, not clipped"
        where = f"per group of {self.group_size}" if self.scope == "group" else "over the batch"
        band = f" (std floored at {self.noise_floor:g}{'' if self.transform == 'log' else ' x mean'})" \
            if self.noise_floor else ""
        copies = {"margin": f"; a copy of a shown exemplar earns its score less {self.copy_margin:g} of it",
                  "zero": "; a copy of a shown exemplar earns 0", "full": ""}[self.copy_reward]
        return f"{kind}, normalized {where}{band}, clipped to [-{self.clip_k:g}, {self.clip_k:g}]{copies}"


class KernelReward:
    """TRL reward function `(completions, task_id, **kwargs) -> list[float]` backed by the evaluator."""

    __name__ = "kernel_reward"  # TRL names the logged metric after the function

    def __init__(self, tasks: Sequence[Task], evaluator: EvaluateFn, config: RewardConfig | None = None, *,
                 exemplar_db: Any = None, judge: Judge | None = None, model_name: str = "",
                 extract: Callable[[str], str | None] | None = None, completion_log: Any = None):
        self.tasks = {t.id: t for t in tasks}
        # completion text -> the candidate handed to the evaluator (None: unparseable); default: the
        # `ModelNew` code of the answer. Other candidate formats (a kernel recipe, a patch) plug in here.
        self.extract = extract or (lambda text: extract_completion(text).code)
        self.evaluator = evaluator
        self.config = config or RewardConfig()
        self.exemplar_db = exemplar_db
        self.judge = judge
        self.model_name = model_name
        self.completion_log = completion_log  # a `CompletionLog`: each completion, its verdict and reward
        self.history: list[dict[str, Any]] = []
        self._best: dict[str, float] = {}
        self._lock = threading.Lock()

    def __call__(self, completions: Sequence[Any], task_id: Sequence[str], **kwargs: Any) -> list[float]:
        """Evaluate each completion for its task and return the smoothed rewards (one per completion)."""
        missing = sorted({t for t in task_id if t not in self.tasks})
        if missing:
            raise KeyError(f"reward asked for unknown task ids {missing[:3]}")
        tasks = [self.tasks[t] for t in task_id]
        texts = [completion_text(c) for c in completions]
        codes = [self.extract(text) for text in texts]
        results = evaluate_batch(self.evaluator, list(zip(tasks, codes, strict=True)), self.config.eval_threads)
        raws = [float(reward_of(r, self.config.failure_rewards, self.config.speedup_estimate) or 0.0)
                for r in results]
        copied = self._copies(codes, results, kwargs.get("shown_exemplars"))
        vetoed, judge_errors, touched = self._judge_and_record(tasks, codes, results, raws)
        copies = self._pay_copies(copied, touched, raws)
        cfg = self.config
        rewards = [transform_reward(v, cfg.transform, bound=cfg.bound, floor=cfg.log_floor) for v in raws]
        group = cfg.group_size if cfg.scope == "group" else None
        smoothed = smooth_rewards(rewards, normalize=cfg.normalize, clip_k=cfg.clip_k if cfg.normalize else None,
                                  group_size=group, noise_floor=cfg.noise_floor,
                                  floor_scale="one" if cfg.transform == "log" else "mean")
        self._log(results, raws, smoothed, vetoed, kwargs, judge_errors, len(copies))
        if self.completion_log is not None:
            state = kwargs.get("trainer_state")
            self.completion_log.write(stage="grpo", tasks=tasks, texts=texts, codes=codes, results=results,
                                      prompts=kwargs.get("prompts"), reward=raws, reward_smoothed=smoothed,
                                      exemplar_copy=[i in copies for i in range(len(results))],
                                      step=int(getattr(state, "global_step", 0)))
        return smoothed

    def _copies(self, codes: list[str | None], results: list[EvalResult],
                shown: Sequence[Any] | None) -> dict[int, float]:
        """Index -> the shown exemplar's score, for each correct candidate whose normalised source is one of the
        exemplars its prompt showed (`shown[i]`: [{"norm_hash", "score"}, ...], as the trainer passes them)."""
        if not shown:
            return {}
        out = {}
        for i, (code, result) in enumerate(zip(codes, results, strict=True)):
            if code is None or result.status is not Status.CORRECT or not shown[i]:
                continue
            digest = normalized_hash(code)
            match = next((e for e in shown[i] if e.get("norm_hash") == digest), None)
            if match is not None:
                out[i] = float(match["score"])
        return out

    def _pay_copies(self, copied: dict[int, float], touched: set[int], raws: list[float]) -> set[int]:
        """Apply `copy_reward` to the copies the judge left alone; returns their indices."""
        paid = {i: score for i, score in copied.items() if i not in touched}
        for i, score in paid.items():
            if self.config.copy_reward == "margin":
                raws[i] = max(0.0, score * (1.0 - self.config.copy_margin))
            elif self.config.copy_reward == "zero":
                raws[i] = 0.0
        return set(paid)

    def _judge_and_record(self, tasks: list[Task], codes: list[str | None], results: list[EvalResult],
                          raws: list[float]) -> tuple[int, int, set[int]]:
        """Ask the judge about suspicious jumps, add successes to the exemplar DB; returns the counts of vetoes
        and of judge errors, and the indices whose reward the judge changed. A judge error fails closed unless
        `judge_on_error="open"` (module docstring): `results[i]` is then flagged (or turned into INFRA_ERROR)
        and `raws[i]` capped."""
        vetoed = errors = 0
        touched: set[int] = set()
        hack_value = float(failure_reward(Status.HACK_DETECTED, self.config.failure_rewards) or 0.0)
        for i, (task, code, result) in enumerate(zip(tasks, codes, results, strict=True)):
            speedup = result.speedup
            if result.status is not Status.CORRECT or code is None or speedup is None or not math.isfinite(speedup):
                continue  # an infinite speedup is a broken timing: neither an exemplar nor a best so far
            with self._lock:
                best = self._best_so_far(task.id)
            if self.judge is not None and self._suspicious(result, best):
                legit, why = self._ask_judge(task, code, result)
                if legit is False:
                    vetoed += 1
                    touched.add(i)
                    raws[i] = hack_value
                    logger.warning("judge vetoed a %.2fx candidate for %s (best so far %.2fx)",
                                   result.speedup, task.id, best)
                    continue
                if legit is None and self.config.judge_on_error == "closed":
                    errors += 1
                    touched.add(i)
                    results[i], raws[i] = self._fail_closed(result, raws[i], best, why)
                    continue
            with self._lock:
                self._best[task.id] = max(self._best.get(task.id, 0.0), float(result.speedup))
            if self.exemplar_db is not None:
                meta = {"model": self.model_name, "kernel_class": result.kernel_class.value if result.kernel_class
                        else None, "candidate_hash": result.candidate_hash, "source": "grpo"}
                self.exemplar_db.add(task.id, code, float(result.speedup), meta, context=score_context(result))
        return vetoed, errors, touched

    def _suspicious(self, result: EvalResult, best: float) -> bool:
        """Whether to ask the judge: its own rule when it has one (`LLMJudge.should_check`, which also sees a
        task's first success above an absolute threshold), else a jump above `judge_jump_factor` x the best."""
        should_check = getattr(self.judge, "should_check", None)
        if callable(should_check):
            return bool(should_check(result, best or None))
        return best > 0 and float(result.speedup or 0.0) > self.config.judge_jump_factor * best

    def _best_so_far(self, task_id: str) -> float:
        if task_id not in self._best and self.exemplar_db is not None:
            best = self.exemplar_db.best(task_id)
            self._best[task_id] = best.score if best is not None else 0.0
        return self._best.get(task_id, 0.0)

    def _ask_judge(self, task: Task, code: str, result: EvalResult) -> tuple[bool | None, str]:
        """(True legitimate / False cheat / None no verdict, why there is none)."""
        try:
            verdict = self.judge.check(task, code, result)  # type: ignore[union-attr]
        except Exception as exc:  # noqa: BLE001 - a broken judge must not stop training: the caller decides
            logger.warning("judge failed on a %.2fx candidate for %s (judge_on_error=%s)", result.speedup or 0.0,
                           task.id, self.config.judge_on_error, exc_info=True)
            return None, f"the judge raised {type(exc).__name__}: {exc}"[:300]
        if verdict is None:
            logger.warning("judge gave no verdict on a %.2fx candidate for %s (judge_on_error=%s)",
                           result.speedup or 0.0, task.id, self.config.judge_on_error)
            return None, "the judge gave no verdict"
        return bool(verdict), ""

    def _fail_closed(self, result: EvalResult, raw: float, best: float, why: str) -> tuple[EvalResult, float]:
        """A candidate the judge could not clear: flagged, paid at most `best` (the task's best verified
        speedup), or an INFRA_ERROR when nothing is verified yet."""
        flag = Flag("judge.error", Severity.WARNING, f"{why}; reward capped at the best verified speedup",
                    source="judge")
        if best > 0:
            return result.replace(flags=[*result.flags, flag]), min(raw, best)
        message = f"{why}; no verified speedup for this task yet, so nothing vouches for this one"
        failed = result.replace(status=Status.INFRA_ERROR, speedup=None, message=message,
                                flags=[*result.flags, flag])
        return failed, float(failure_reward(Status.INFRA_ERROR, self.config.failure_rewards) or 0.0)

    def _log(self, results: list[EvalResult], raws: list[float], smoothed: list[float], vetoed: int,
             kwargs: dict[str, Any], judge_errors: int = 0, copies: int = 0) -> None:
        n = len(results)
        speedups = [r.speedup for r in results if r.status is Status.CORRECT and r.speedup is not None]
        statuses: dict[str, int] = {}
        for r in results:
            statuses[r.status.value] = statuses.get(r.status.value, 0) + 1
        entry = {"n": n, "success_rate": len(speedups) / n if n else 0.0,
                 "mean_speedup": sum(speedups) / len(speedups) if speedups else None,
                 "max_speedup": max(speedups) if speedups else None,
                 "raw_reward_mean": sum(raws) / n if n else 0.0,
                 "smoothed_reward_mean": sum(smoothed) / n if n else 0.0,
                 "judge_vetoes": vetoed, "judge_errors": judge_errors, "exemplar_copies": copies,
                 "statuses": statuses}
        state = kwargs.get("trainer_state")
        if state is not None:
            entry["step"] = int(getattr(state, "global_step", 0))
        self.history.append(entry)
        log_metric = kwargs.get("log_metric")
        if callable(log_metric):
            log_metric("kernel/success_rate", entry["success_rate"])
            log_metric("kernel/raw_reward_mean", entry["raw_reward_mean"])
            log_metric("kernel/mean_speedup", entry["mean_speedup"] or 0.0)
            log_metric("kernel/judge_vetoes", float(vetoed))
            log_metric("kernel/judge_errors", float(judge_errors))
            log_metric("kernel/exemplar_copies", float(copies))
        logger.info("reward batch: %d candidates, %.0f%% correct, raw mean %.3f, statuses %s%s%s",
                    n, 100 * entry["success_rate"], entry["raw_reward_mean"], statuses,
                    f"; {copies} exemplar copies paid by copy_reward={self.config.copy_reward}" if copies else "",
                    f"; first failure {why}" if (why := first_failure(results)) else "")
