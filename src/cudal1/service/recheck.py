"""Re-check of outliers: suspiciously fast results are measured again on a different GPU.

CUDA-L1 re-measures speedups above 3x and rejects those that do not reproduce. Here an outlier is a
CORRECT result whose speedup exceeds `threshold` (3x), or `factor` (2x) times the best speedup accepted
so far for its task. When the pool has at least two devices, the candidate is evaluated again with
`force=True` on a slot other than the one that measured it, and:

- both CORRECT and within `tolerance` (10%, relative to the smaller speedup): the result stays CORRECT,
  its speedup becomes the smaller of the two (conservative) and an INFO flag `recheck.agree` records both;
- both CORRECT but further apart: status HACK_DETECTED, speedup None, an ERROR flag `recheck.disagree`
  with both numbers in its message. A result that does not reproduce on a second GPU is treated like a
  guard firing: the most common cause is a measurement the candidate manipulated (work hidden from the
  timer, caches, input-dependent shortcuts), and CUDA-L1 rejects these too;
- the re-check not CORRECT (incorrect, crashed, timed out on the second GPU): the re-check's verdict is
  returned, with an ERROR flag `recheck.failed`.

On a pool with one device nothing is re-measured and the result is returned unchanged.
`RecheckingPool` wraps any pool and applies this to every result; it tracks the best accepted speedup
per task (seeded from the store when given one) and writes the final verdict to the store, where it
supersedes the first measurement (newest row per key wins).

Limits: two slots on the same physical GPU are not "a different GPU"; the local pool counts distinct
devices. A candidate whose speed legitimately varies more than 10% between two GPUs of the same model is
rejected; raise `tolerance` for noisy hardware.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from cudal1.core import flags as F
from cudal1.core.errors import ConfigError
from cudal1.core.types import EvalResult, Status
from cudal1.eval.config import EvalConfig
from cudal1.service.pool import EvaluatorPool, PoolFuture, key_protocol
from cudal1.store.keys import eval_key
from cudal1.tasks.task import Task, source_hash

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RecheckConfig:
    """When to re-measure a result on a second GPU and how close the two must be."""

    threshold: float = field(default=3.0, metadata={"help": "Re-check speedups above this (CUDA-L1: 3x)."})
    factor: float = field(default=2.0, metadata={
        "help": "Also re-check speedups above factor x the task's best accepted speedup so far."})
    tolerance: float = field(default=0.10, metadata={
        "help": "Largest relative difference of the two speedups that still agrees (CUDA-L1: 10%)."})
    enabled: bool = field(default=True, metadata={"help": "Re-check at all."})

    def __post_init__(self) -> None:
        if self.threshold <= 0 or self.factor <= 0 or self.tolerance < 0:
            raise ConfigError("recheck needs threshold > 0, factor > 0 and tolerance >= 0")


def needs_recheck(result: EvalResult, best_so_far: float | None, threshold: float = 3.0,
                  factor: float = 2.0) -> bool:
    """True for a CORRECT result faster than `threshold`, or than `factor` x `best_so_far` (when known)."""
    if result.status is not Status.CORRECT or result.speedup is None or result.cached:
        return False
    if result.speedup > threshold:
        return True
    return best_so_far is not None and best_so_far > 0 and result.speedup > factor * best_so_far


def relative_difference(a: float, b: float) -> float:
    """|a - b| relative to the smaller of the two (inf when the smaller is not positive)."""
    low = min(a, b)
    return abs(a - b) / low if low > 0 else float("inf")


def combine(first: EvalResult, second: EvalResult, tolerance: float = 0.10) -> EvalResult:
    """The verdict from a measurement and its re-check on another device (see the module docstring)."""
    if second.status is not Status.CORRECT or second.speedup is None:
        flag = F.runtime_flag(F.RECHECK_FAILED,
                              f"{first.speedup:.2f}x did not reproduce on a second GPU: {second.status.value}")
        return second.replace(flags=list(second.flags) + [flag], cached=False,
                              message=f"re-check on a second GPU: {second.message or second.status.value}")
    a, b = float(first.speedup), float(second.speedup)
    diff = relative_difference(a, b)
    both = f"{a:.3f}x and {b:.3f}x on two GPUs ({diff:.0%} apart"
    if diff <= tolerance:
        flag = F.runtime_flag(F.RECHECK_AGREE, f"re-checked: {both}, within {tolerance:.0%})")
        return first.replace(speedup=min(a, b), flags=list(first.flags) + [flag])
    flag = F.runtime_flag(F.RECHECK_DISAGREE, f"speedup not reproducible: {both}, limit {tolerance:.0%})")
    return first.replace(status=Status.HACK_DETECTED, speedup=None, flags=list(first.flags) + [flag],
                         message=f"speedup not reproducible: {both}, limit {tolerance:.0%})")


def recheck_result(pool: EvaluatorPool, task: Task, source: str, result: EvalResult, slot: int | None,
                   config: EvalConfig | None = None, *, tolerance: float = 0.10) -> EvalResult:
    """Re-evaluate `source` on a slot other than `slot` (force) and combine; unchanged on a 1-device pool."""
    if pool.n_devices < 2:
        logger.debug("no second device to re-check %s (%.2fx)", task.id, result.speedup or 0.0)
        return result
    second = pool.submit(task, source, config, force=True, avoid_slot=slot, label="recheck").result()
    return combine(result, second, tolerance)


class RecheckingPool:
    """A pool wrapper that re-checks outliers of every result (see the module docstring)."""

    def __init__(self, pool: EvaluatorPool, recheck: RecheckConfig | None = None, *, store: Any = None,
                 max_concurrent_rechecks: int = 4):
        self.pool = pool
        self.recheck = recheck or RecheckConfig()
        self.store = store
        self._best: dict[str, float | None] = {}
        self._lock = threading.Lock()
        self._executor = ThreadPoolExecutor(max_workers=max_concurrent_rechecks, thread_name_prefix="recheck")

    @property
    def n_devices(self) -> int:
        return self.pool.n_devices

    @property
    def queue_depth(self) -> int:
        return self.pool.queue_depth

    def health(self) -> dict[str, Any]:
        """The inner pool's slot state (see `LocalPool.health`), if it reports one."""
        return self.pool.health() if hasattr(self.pool, "health") else {}

    def best_so_far(self, task_id: str) -> float | None:
        """Best accepted speedup of the task (this session, else the store's CORRECT rows)."""
        with self._lock:
            if task_id not in self._best:
                best = None
                if self.store is not None:
                    rows = self.store.query_evaluations(task_id=task_id, status="correct",
                                                        latest_per_task_candidate=True)
                    best = max((r["speedup"] for r in rows if r.get("speedup")), default=None)
                self._best[task_id] = best
            return self._best[task_id]

    def _note(self, result: EvalResult) -> None:
        if result.status is Status.CORRECT and result.speedup is not None:
            with self._lock:
                old = self._best.get(result.task_id)
                self._best[result.task_id] = max(result.speedup, old) if old is not None else result.speedup

    def submit(self, task: Task, source: str, config: EvalConfig | None = None, *, force: bool = False,
               label: str = "", run_id: str | None = None, block: bool = True,
               avoid_slot: int | None = None) -> PoolFuture:
        """Submit to the inner pool; the returned future resolves after any re-check."""
        inner = self.pool.submit(task, source, config, force=force, label=label, run_id=run_id, block=block,
                                 avoid_slot=avoid_slot)
        outer = PoolFuture()
        # A caller that gives up (cancels) before the evaluation starts cancels the inner job too.
        outer.add_done_callback(lambda f: inner.cancel() if f.cancelled() else None)

        def finish(done: PoolFuture) -> None:
            if done.cancelled():
                outer.cancel()
                return
            self._executor.submit(self._finish, done, outer, task, source, config, label, run_id)

        inner.add_done_callback(finish)
        return outer

    def _finish(self, inner: PoolFuture, outer: PoolFuture, task: Task, source: str,
                config: EvalConfig | None, label: str, run_id: str | None) -> None:
        if not outer.set_running_or_notify_cancel():
            return
        try:
            result = inner.result()
            outer.slot = inner.slot
            rc = self.recheck
            best = self.best_so_far(task.id) if rc.enabled else None
            if rc.enabled and needs_recheck(result, best, rc.threshold, rc.factor) and self.pool.n_devices >= 2:
                result = recheck_result(self.pool, task, source, result, inner.slot, config,
                                        tolerance=rc.tolerance)
                self._record(task, source, result, config, label, run_id)
            self._note(result)
            outer.set_result(result)
        except Exception as exc:  # noqa: BLE001 - never leave the caller's future hanging
            outer.set_exception(exc)

    def _record(self, task: Task, source: str, result: EvalResult, config: EvalConfig | None, label: str,
                run_id: str | None) -> None:
        if self.store is None:
            return
        cfg = config or getattr(self.pool, "config", None) or EvalConfig()
        device = str(result.protocol.get("device") or cfg.device)

        key = eval_key(task.hash, source_hash(source), key_protocol(cfg, device), result.environment)
        self.store.put_evaluation(result, task_hash=task.hash, key=key, label=label, run_id=run_id)

    def map(self, items: Any, config: EvalConfig | None = None) -> list[EvalResult]:
        """Evaluate every (task, source) pair with re-checks; results in input order."""
        futures = [self.submit(task, source, config) for task, source in items]
        return [f.result() for f in futures]

    def close(self) -> None:
        """Finish pending re-checks, then close the inner pool."""
        self._executor.shutdown(wait=True)
        self.pool.close()

    def __enter__(self) -> RecheckingPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
