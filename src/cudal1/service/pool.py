"""Evaluator pools: one interface over "evaluate many candidates on every device I have".

    from cudal1.service import make_pool

    with make_pool("local", EvalConfig()) as pool:          # or "ray:auto", "ray://head:10001"
        futures = [pool.submit(task, source) for task, source in items]
        results = [f.result() for f in futures]              # or pool.map(items)

`LocalPool` (the embedded default) runs one thread per device slot in this process; each thread calls
`evaluate_candidate` with `device="cuda:N"` (or `cpu`), which runs every candidate in its own isolated
child process, so nothing here forks after CUDA is initialised. On a GPU machine, `load_inline`
candidates are built ahead of their turn by CPU compile workers (`cudal1.eval.scheduler.prebuild`), so the
GPU slots only run. Submissions wait in a bounded queue: `submit` blocks when it is full, or raises
`PoolBusyError` with `block=False` (back-pressure). `RayPool` (`cudal1.service.ray_pool`) has the same
interface across nodes.

Results store: a pool given a `store` is its single writer. Lookups and writes happen on the driver side
(never in a worker or actor), and the cache key uses the device *type* (`cuda`, not `cuda:1`), so a result
measured on any GPU of a homogeneous machine is reused by every slot and by `cudal1 eval --device cuda`.

Limits: the local pool uses the GPUs of this machine only; slots on one GPU share it (one slot per GPU
is the default, because concurrent timing on one GPU disturbs both measurements).
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from cudal1.core.errors import ConfigError, Cudal1Error
from cudal1.core.machine import describe_machine
from cudal1.core.types import EvalResult, Status
from cudal1.eval.config import EvalConfig, resolve_device
from cudal1.eval.evaluation import ATTEMPTS
from cudal1.eval.pipeline import evaluate_candidate, not_a_source_file, uses_load_inline
from cudal1.eval.scheduler import prebuild, runner_supply
from cudal1.eval.supply import usable_cpu_count
from cudal1.tasks.task import Task, source_hash

logger = logging.getLogger(__name__)

#: A slot is replaced when one evaluation runs this long past its own time and build limits (`stuck_after_s`).
STUCK_MARGIN_S = 120.0


def stuck_after_s(cfg: EvalConfig) -> float:
    """How long one evaluation may run before its slot counts as hung: its build, then each of its sessions
    (a pair of runners, another attempt after the candidate's runner died), each at most its overall limit
    plus the build allowance of builds the candidate starts itself, and a margin."""
    return cfg.build_timeout_s + (cfg.timeout_s + cfg.build_timeout_s) * cfg.runner_pairs * ATTEMPTS + STUCK_MARGIN_S


WATCH_INTERVAL_S = 1.0

# `evaluate_candidate`'s shape without the store: (task, source, config) -> EvalResult. Pools call it with
# the slot's device in `config`; tests and custom deployments may pass their own.
EvaluateFn = Callable[[Task, str, EvalConfig], EvalResult]


class PoolBusyError(Cudal1Error):
    """The pool's queue is full and the caller asked not to wait (`block=False`)."""


class PoolFuture(Future):
    """A `Future[EvalResult]` that also says which device slot evaluated it (`slot`, None if cached)."""

    slot: int | None = None


@runtime_checkable
class EvaluatorPool(Protocol):
    """What every pool offers: submit one, map many, the number of device slots, close."""

    n_devices: int

    def submit(self, task: Task, source: str, config: EvalConfig | None = None, *, force: bool = False,
               label: str = "", run_id: str | None = None, block: bool = True,
               avoid_slot: int | None = None) -> PoolFuture: ...

    def map(self, items: Iterable[tuple[Task, str]], config: EvalConfig | None = None) -> list[EvalResult]: ...

    @property
    def queue_depth(self) -> int: ...

    def close(self) -> None: ...


_thread_state = threading.local()


def default_evaluate(task: Task, source: str, config: EvalConfig) -> EvalResult:
    """The real evaluator without the store (the pool's driver side owns the store).

    Each calling thread (a local slot, a Ray actor) keeps pre-started runners per device, so a runner's
    start (interpreter, imports, CUDA context: seconds) overlaps the evaluation before it."""

    supplies = _thread_state.__dict__.setdefault("supplies", {})
    device = resolve_device(config.device)
    if device not in supplies:
        supplies[device] = runner_supply(device)
    return evaluate_candidate(task, source, config, runners=supplies[device])


def close_thread_supplies() -> None:
    """Stop the calling thread's pre-started runners (a slot thread ends; tests)."""
    for supply in _thread_state.__dict__.pop("supplies", {}).values():
        supply.close()


def key_protocol(config: EvalConfig, device: str) -> dict[str, Any]:
    """The protocol part of the store key for `config` run on `device`, with `cuda:N` normalised to `cuda`."""
    protocol = config.resolved(device).protocol()
    protocol["device"] = device.split(":")[0]
    return protocol


def pool_environment(device: str) -> dict[str, Any]:
    """This machine's environment for `device` (GPU name, versions): the environment half of the key."""

    return dict(describe_machine(device))


def store_lookup(store: Any, task: Task, source: str, config: EvalConfig, device: str,
                 environment: dict[str, Any], force: bool) -> tuple[str, EvalResult | None]:
    """(key, cached result or None) for one evaluation on `device` of a machine with `environment`."""
    return store.lookup(task.hash, source_hash(source), key_protocol(config, device), environment, force=force,
                        limits=config.limits())


def complete_result(result: EvalResult, task: Task, source: str, config: EvalConfig, device: str,
                    environment: dict[str, Any]) -> EvalResult:
    """Fill task id, candidate hash, protocol and environment the way `evaluate_candidate` does."""
    protocol = config.resolved(device).protocol()
    return result.replace(task_id=task.id, candidate_hash=source_hash(source),
                          protocol={**protocol, **config.limits(), **result.protocol},
                          environment={**environment, **result.environment})


def failure_result(task: Task, source: str, message: str, status: Status = Status.RUNTIME_ERROR) -> EvalResult:
    """A verdict for an item the pool could not evaluate (e.g. its worker kept dying)."""
    return EvalResult(status=status, message=message, task_id=task.id, candidate_hash=source_hash(source))


def describe_error(exc: BaseException) -> str:
    """`Type: message` of an exception, even one whose own str() fails."""
    try:
        return f"{type(exc).__name__}: {exc}"
    except Exception:  # noqa: BLE001 - the report of a failure must not fail
        return type(exc).__name__


def refused_at_submit(task: Task, source: str) -> PoolFuture | None:
    """A resolved future for what no pool queues: a candidate that is not a source file (it could be neither
    run nor stored). None for everything else."""
    refused = not_a_source_file(task, source)
    if refused is None:
        return None
    future = PoolFuture()
    future.set_result(refused)
    return future


@dataclass
class Job:
    """One queued evaluation."""

    task: Task
    source: str
    config: EvalConfig
    force: bool
    label: str
    run_id: str | None
    avoid_slot: int | None
    future: PoolFuture
    attempts: int = 0
    prebuilt: Future | None = None
    solo: bool = False  # run alone on its worker (after a worker died under it and others)


class JobQueue:
    """A bounded queue with per-slot lanes: jobs that must avoid a slot go to another slot's lane.

    `put` blocks while `capacity` jobs are waiting (or raises `PoolBusyError` when `block=False`);
    directed jobs (re-checks) are never refused, so a re-check cannot deadlock behind the work it checks.
    """

    def __init__(self, n_slots: int, capacity: int):
        self.capacity = capacity
        self._cv = threading.Condition()
        self._shared: collections.deque[Job] = collections.deque()
        self._lanes: list[collections.deque[Job]] = [collections.deque() for _ in range(n_slots)]
        self._retired: set[int] = set()  # slots that will never take work again
        self.closed = False

    def __len__(self) -> int:
        with self._cv:
            return len(self._shared) + sum(len(lane) for lane in self._lanes)

    def put(self, job: Job, *, block: bool = True, front: bool = False) -> None:
        """Queue `job` (see the class docstring)."""
        with self._cv:
            if self.closed:
                raise Cudal1Error("the pool is closed")
            if job.avoid_slot is not None and len(self._lanes) > 1:
                lanes = [i for i in range(len(self._lanes)) if i != job.avoid_slot and i not in self._retired]
                if lanes:
                    target = min(lanes, key=lambda i: len(self._lanes[i]))
                    self._lanes[target].append(job)
                    self._cv.notify_all()
                    return
                # No other live slot: run it wherever possible rather than never.
                self._shared.appendleft(job)
                self._cv.notify_all()
                return
            while len(self._shared) >= self.capacity and not front:
                if not block:
                    raise PoolBusyError(f"the evaluation queue is full ({self.capacity} waiting)")
                self._cv.wait()
                if self.closed:
                    raise Cudal1Error("the pool is closed")
            (self._shared.appendleft if front else self._shared.append)(job)
            self._cv.notify_all()

    def retire(self, slot: int) -> None:
        """`slot` takes no more work: jobs waiting in its lane go to other slots (or the shared queue)."""
        with self._cv:
            self._retired.add(slot)
            moved = list(self._lanes[slot])
            self._lanes[slot].clear()
        for job in moved:
            self.put(job, front=True)

    def get(self, slot: int, timeout_s: float | None = None) -> Job | None:
        """The next job for `slot` (its lane first), or None when closed (or after `timeout_s`)."""
        with self._cv:
            while True:
                if self._lanes[slot]:
                    job = self._lanes[slot].popleft()
                elif self._shared:
                    job = self._shared.popleft()
                elif self.closed:
                    return None
                else:
                    if not self._cv.wait(timeout_s) and timeout_s is not None:
                        return None
                    continue
                self._cv.notify_all()
                return job

    def wait_for_work(self, timeout_s: float) -> None:
        """Sleep until something is queued or `timeout_s` passes."""
        with self._cv:
            if not self._shared and not any(self._lanes) and not self.closed:
                self._cv.wait(timeout_s)

    def close(self) -> list[Job]:
        """Close the queue; return the jobs that never started."""
        with self._cv:
            self.closed = True
            left = list(self._shared) + [j for lane in self._lanes for j in lane]
            self._shared.clear()
            for lane in self._lanes:
                lane.clear()
            self._cv.notify_all()
            return left


def _h(help: str) -> dict[str, str]:
    return {"help": help}


@dataclass(frozen=True)
class LocalPoolConfig:
    """Settings of the embedded pool."""

    devices: tuple[str, ...] | None = field(default=None, metadata=_h(
        "Device of each slot (e.g. ('cuda:0', 'cuda:1')); default: the evaluation's device (cpu: cpu_slots x "
        "cpu; cuda:N: that GPU), else every local GPU, else cpu_slots x cpu."))
    cpu_slots: int = field(default=1, metadata=_h("CPU slots (evaluation device cpu, or a machine without GPUs)."))
    max_queue: int = field(default=64, metadata=_h("Submissions waiting beyond the running ones (back-pressure)."))
    compile_threads: int = field(default=0, metadata=_h(
        "CPU threads building load_inline candidates ahead of the GPU slots (0: one per 2 cores, GPU only)."))
    stuck_after_s: float | None = field(default=None, metadata=_h(
        "A slot busy this long on one evaluation is replaced and the evaluation answered as an infra_error "
        "(None: the evaluation's own time and build limits plus 120 s; a backstop, they end it first)."))

    def __post_init__(self) -> None:
        if self.cpu_slots < 1 or self.max_queue < 1 or self.compile_threads < 0:
            raise ConfigError("need cpu_slots >= 1, max_queue >= 1 and compile_threads >= 0")
        if self.stuck_after_s is not None and self.stuck_after_s <= 0:
            raise ConfigError("stuck_after_s must be positive")


def local_devices(cfg: LocalPoolConfig, eval_device: str = "auto") -> list[str]:
    """The slot devices of a local pool: configured; else the evaluation's own device (`cpu` gives `cpu_slots`
    CPU slots even on a GPU host, `cuda:N` one slot on that GPU); else one per visible GPU, else CPU slots."""
    if cfg.devices:
        return list(cfg.devices)
    if eval_device == "cpu":
        return ["cpu"] * cfg.cpu_slots
    if eval_device.startswith("cuda:"):
        return [resolve_device(eval_device)]
    import torch

    if torch.cuda.is_available():
        return [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    resolve_device(eval_device)  # `cuda` asked on a machine without one: a clear error
    return ["cpu"] * cfg.cpu_slots


class LocalPool:
    """The embedded pool: a thread per device slot on this machine (see the module docstring)."""

    def __init__(self, config: EvalConfig | None = None, pool_config: LocalPoolConfig | None = None, *,
                 store: Any = None, evaluate_fn: EvaluateFn | None = None):
        self.config = config or EvalConfig()
        self.pool_config = pool_config or LocalPoolConfig()
        self.devices = local_devices(self.pool_config, self.config.device)
        self.store = store
        self._evaluate = evaluate_fn or default_evaluate
        self._queue = JobQueue(len(self.devices), self.pool_config.max_queue)
        self._env: dict[str, dict[str, Any]] = {}
        self._prebuilder = self._make_prebuilder()
        # Supervision: each slot's thread has a generation; a replaced thread finds its generation stale and
        # leaves without touching the slot again.
        self._lock = threading.Lock()
        self._generation = [0] * len(self.devices)
        self._running: list[tuple[Job, float] | None] = [None] * len(self.devices)
        self.replaced_slots = 0
        self._threads = [self._start_slot(i) for i in range(len(self.devices))]
        self._closed = threading.Event()
        self._watchdog = threading.Thread(target=self._watch, name="cudal1-slot-watchdog", daemon=True)
        self._watchdog.start()
        logger.info("local pool: %d slot(s) on %s", len(self.devices), ", ".join(self.devices))

    @property
    def n_devices(self) -> int:
        """Number of distinct devices (slots on one device count once)."""
        return len(set(self.devices))

    @property
    def queue_depth(self) -> int:
        return len(self._queue)

    def _make_prebuilder(self) -> ThreadPoolExecutor | None:
        if not any(d.startswith("cuda") for d in self.devices):
            return None
        n = self.pool_config.compile_threads or max(1, usable_cpu_count() // 2)
        return ThreadPoolExecutor(max_workers=n, thread_name_prefix="cudal1-prebuild")

    def environment(self, device: str) -> dict[str, Any]:
        if device not in self._env:
            self._env[device] = pool_environment(device)
        return self._env[device]

    def submit(self, task: Task, source: str, config: EvalConfig | None = None, *, force: bool = False,
               label: str = "", run_id: str | None = None, block: bool = True,
               avoid_slot: int | None = None) -> PoolFuture:
        """Queue one evaluation; the future resolves to its `EvalResult` (never to an exception)."""
        refused = refused_at_submit(task, source)
        if refused is not None:
            return refused
        cfg = config or self.config
        job = Job(task, source, cfg, force, label, run_id, avoid_slot, PoolFuture())
        if self._prebuilder is not None:
            if uses_load_inline(source):
                device = next(d for d in self.devices if d.startswith("cuda"))
                job.prebuilt = self._prebuilder.submit(prebuild, [(task, source)], cfg.resolved(device))
        self._queue.put(job, block=block)
        return job.future

    def map(self, items: Iterable[tuple[Task, str]], config: EvalConfig | None = None) -> list[EvalResult]:
        """Evaluate every (task, source) pair; results in input order."""
        futures = [self.submit(task, source, config) for task, source in items]
        return [f.result() for f in futures]

    def health(self) -> dict[str, Any]:
        """The slots' state for /healthz: how many are busy, the longest running evaluation, replacements."""
        now = time.monotonic()
        with self._lock:
            busy = [now - entry[1] for entry in self._running if entry is not None]
        return {"slots": len(self.devices), "busy_slots": len(busy), "longest_running_s": round(max(busy, default=0.0), 1),
                "replaced_slots": self.replaced_slots}

    def _start_slot(self, slot: int) -> threading.Thread:
        generation = self._generation[slot]
        thread = threading.Thread(target=self._work, args=(slot, generation), daemon=True,
                                  name=f"cudal1-slot-{slot}" + (f"-{generation}" if generation else ""))
        thread.start()
        return thread

    def _current(self, slot: int, generation: int) -> bool:
        with self._lock:
            return self._generation[slot] == generation

    def _work(self, slot: int, generation: int) -> None:
        try:
            while self._current(slot, generation):
                try:
                    job = self._queue.get(slot, timeout_s=1.0)
                except Exception:  # noqa: BLE001 - the slot outlives a fault of its own loop
                    logger.exception("slot %d: taking the next job failed", slot)
                    time.sleep(1.0)
                    continue
                if job is None:
                    if self._queue.closed:
                        return
                    continue
                if job.future.set_running_or_notify_cancel():
                    self._serve(slot, generation, job)
        finally:
            close_thread_supplies()

    def _serve(self, slot: int, generation: int, job: Job) -> None:
        with self._lock:
            self._running[slot] = (job, time.monotonic())
        job.future.slot = slot
        try:
            result = self._run(job, self.devices[slot])
        except BaseException as exc:  # noqa: BLE001 - a pool thread must survive anything and answer
            logger.exception("slot %d failed on %s", slot, job.task.id)
            result = failure_result(job.task, job.source, f"evaluator failed: {describe_error(exc)}")
        with self._lock:
            if self._generation[slot] != generation:
                return  # replaced while it ran: its future was answered by the watchdog
            self._running[slot] = None
        if not job.future.done():
            job.future.set_result(result)

    def _stuck_after_s(self, job: Job) -> float:
        if self.pool_config.stuck_after_s is not None:
            return self.pool_config.stuck_after_s
        return stuck_after_s(job.config)

    def _watch(self) -> None:
        """Replace a slot whose evaluation overran every limit (a hang below the evaluator's own deadlines)."""
        while not self._closed.wait(WATCH_INTERVAL_S):
            now = time.monotonic()
            for slot in range(len(self.devices)):
                with self._lock:
                    entry = self._running[slot]
                    if entry is None or now - entry[1] <= self._stuck_after_s(entry[0]):
                        continue
                    job = entry[0]
                    self._running[slot] = None
                    self._generation[slot] += 1
                    self.replaced_slots += 1
                logger.error("slot %d stuck for %.0f s on %s: replaced", slot, now - entry[1], job.task.id)
                if not job.future.done():
                    job.future.set_result(failure_result(
                        job.task, job.source, f"the evaluation overran every limit ({now - entry[1]:.0f} s); its "
                        "slot was replaced", Status.INFRA_ERROR))
                self._threads[slot] = self._start_slot(slot)

    def _run(self, job: Job, device: str) -> EvalResult:
        env = self.environment(device)
        key = None
        if self.store is not None:
            key, hit = store_lookup(self.store, job.task, job.source, job.config, device, env, job.force)
            if hit is not None:
                job.future.slot = None
                return hit
        if job.prebuilt is not None:
            try:
                job.prebuilt.result()
            except Exception:  # noqa: BLE001 - the evaluation rebuilds and reports the error itself
                logger.debug("prebuild failed for %s", job.task.id, exc_info=True)
        cfg = job.config.resolved(device)
        result = complete_result(self._evaluate(job.task, job.source, cfg), job.task, job.source, cfg, device, env)
        if self.store is not None and key is not None:
            self.store.record_evaluation(job.task, job.source, result, key=key, label=job.label, run_id=job.run_id)
        return result

    def close(self) -> None:
        """Stop the slots after their current job; queued jobs resolve to a RUNTIME_ERROR result."""
        self._closed.set()
        for job in self._queue.close():
            if job.future.set_running_or_notify_cancel():
                job.future.set_result(failure_result(job.task, job.source, "the pool was closed"))
        for thread in self._threads:
            thread.join(timeout=5)
        if self._prebuilder is not None:
            self._prebuilder.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> LocalPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
