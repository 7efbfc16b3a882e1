"""The Ray evaluator pool: one actor per GPU across the nodes of a Ray cluster, same interface as `LocalPool`.

    pool = make_pool("ray:auto", EvalConfig())          # join the local cluster (or start one)
    pool = make_pool("ray://head:10001", EvalConfig())  # Ray client

Each actor reserves `num_gpus_per_actor` (1) GPU; Ray sets `CUDA_VISIBLE_DEVICES`, so the actor evaluates on
`cuda` (its one GPU) through `evaluate_candidate`, which still runs every candidate in an isolated child.
`load_inline` candidates are first built by a CPU-only Ray task on the actor's node (node affinity, soft)
into that node's build cache, overlapping with the GPU work; the actor then finds the build cached.

A dispatcher thread in the driver keeps at most `max_in_flight_per_actor` items on each actor (the rest
wait in a bounded queue: back-pressure), collects results with `ray.wait`, and is the single writer of
the results store. When an actor dies (`RayActorError`: a crash that took the actor process down, a lost
node, `ray.kill`), the dispatcher replaces the actor and re-queues its in-flight items. Which of several
items killed it is unknown, so an item that shared the actor is retried *alone* on an actor (without
counting an attempt); an item that was alone when its actor died counts one attempt, and after
`max_retries` such deaths its result is a RUNTIME_ERROR that names the failure. So one crashing
candidate cannot take innocent neighbours down with it.

Limits: all nodes are assumed to share the software stack; the environment (GPU name, versions) is taken
per actor, so a mixed cluster stores its results under each GPU's own key. Build caches are per node. A CPU
build starts when its item is handed to an actor, so at most `max_in_flight_per_actor` builds per actor run
at once: a stream of cache-miss `load_inline` candidates (~40 s each on an H200 host) keeps the GPUs waiting;
build such batches ahead (`pipeline.prebuild` on each node) or use the raw-CUDA form.
"""

from __future__ import annotations

import contextlib
import dataclasses
import faulthandler
import io
import logging
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from cudal1.core.errors import ConfigError, MissingDependencyError
from cudal1.core.types import EvalResult
from cudal1.eval.config import EvalConfig
from cudal1.service.pool import (
    EvaluateFn,
    Job,
    JobQueue,
    PoolFuture,
    complete_result,
    default_evaluate,
    failure_result,
    refused_at_submit,
    store_lookup,
)
from cudal1.tasks.task import Task

logger = logging.getLogger(__name__)

POLL_S = 0.05

#: Consecutive start failures of one slot's actor before the slot gives up (and says why).
MAX_START_FAILURES = 3

#: An actor call or CPU build still running after this many seconds dumps every thread's stack to its
#: stderr (forwarded to the driver with `log_to_driver`), and again each period: a stuck one says where.
WATCHDOG_S = 120.0


@contextlib.contextmanager
def stack_watchdog(what: str, trace: bool = False, after_s: float = WATCHDOG_S) -> Iterator[None]:
    """Dump all stacks to stderr if `what` runs past `after_s`; with `trace`, also log its start and
    duration there."""
    started = time.monotonic()
    if trace:
        print(f"cudal1 ray: {what} started", file=sys.stderr, flush=True)
    try:
        faulthandler.dump_traceback_later(after_s, repeat=True, file=sys.stderr)
    except (AttributeError, ValueError, io.UnsupportedOperation):  # a stderr without a file descriptor
        faulthandler.dump_traceback_later(after_s, repeat=True, file=sys.__stderr__)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()
        if trace:
            print(f"cudal1 ray: {what} done in {time.monotonic() - started:.1f} s", file=sys.stderr, flush=True)


def import_ray() -> Any:
    """`ray`, or `MissingDependencyError` naming the extra."""
    try:
        import ray
    except ImportError:
        raise MissingDependencyError("ray", "dist", "the Ray evaluator pool") from None
    return ray


def _h(help: str) -> dict[str, str]:
    return {"help": help}


@dataclass(frozen=True)
class RayPoolConfig:
    """Settings of the Ray pool."""

    address: str | None = field(default="auto", metadata=_h(
        "auto (join the running cluster, else start a local one), ray://HOST:PORT, or None (start local)."))
    n_actors: int | None = field(default=None, metadata=_h(
        "Evaluation actors; default: the cluster's GPUs / num_gpus_per_actor."))
    device: str = field(default="cuda", metadata=_h("Device each actor evaluates on (cuda: its own GPU)."))
    num_gpus_per_actor: float = field(default=1.0, metadata=_h("GPUs reserved per actor."))
    num_cpus_per_actor: float = field(default=1.0, metadata=_h("CPUs reserved per actor."))
    max_in_flight_per_actor: int = field(default=2, metadata=_h(
        "Items handed to one actor at once (2: the next one's build overlaps the current run)."))
    max_queue: int = field(default=256, metadata=_h("Items waiting in the driver (back-pressure bound)."))
    max_retries: int = field(default=2, metadata=_h("Re-tries of an item whose actor died."))
    prebuild_on_cpu: bool = field(default=True, metadata=_h("Build load_inline candidates in CPU tasks first."))
    init_kwargs: dict[str, Any] = field(default_factory=dict, metadata=_h("Extra ray.init arguments."))
    trace_calls: bool = field(default=False, metadata=_h(
        "Actors and CPU builds print each call's start and duration to their stderr (the driver shows it "
        "with log_to_driver). Stacks of a call still running after 120 s are printed regardless."))

    def __post_init__(self) -> None:
        if self.n_actors is not None and self.n_actors < 1:
            raise ConfigError("n_actors must be >= 1")
        if self.max_in_flight_per_actor < 1 or self.max_queue < 1 or self.max_retries < 0:
            raise ConfigError("need max_in_flight_per_actor >= 1, max_queue >= 1 and max_retries >= 0")


class EvalActor:
    """The body of one evaluation actor (wrapped with `ray.remote` by the pool)."""

    def __init__(self, evaluate_fn: EvaluateFn, device: str, trace: bool = False):
        self.evaluate_fn = evaluate_fn
        self.device = device
        self.trace = trace

    def describe(self) -> dict[str, Any]:
        """Where this actor runs: environment (the store key half), node, pid, CUDA arch."""
        import os

        import ray

        from cudal1.eval.config import resolve_device
        from cudal1.service.pool import pool_environment

        with stack_watchdog("describe", self.trace):
            device = resolve_device(self.device)
            arch = None
            if device.startswith("cuda"):
                from cudal1.eval.compile import local_arch

                arch = local_arch()
        return {"environment": pool_environment(device), "device": device, "pid": os.getpid(),
                "node_id": ray.get_runtime_context().get_node_id(), "arch": arch,
                "visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}

    def close(self) -> None:
        """Stop this actor's pre-started evaluation workers (before the pool kills it)."""
        from cudal1.service.pool import close_thread_supplies

        close_thread_supplies()

    def evaluate(self, task: Task, source: str, config: EvalConfig, _prebuilt: Any = None) -> EvalResult:
        """Evaluate one item; `_prebuilt` is only a dependency (the CPU build task's result)."""
        with stack_watchdog(f"evaluate {task.id}", self.trace):
            return self.evaluate_fn(task, source, config)


def prebuild_on_node(source: str, arch: str, timeout_s: float, trace: bool = False,
                     init_inputs: list[Any] | None = None) -> bool:
    """Body of the CPU build task: build one `load_inline` candidate's import-time extensions into this
    node's cache. Import only, so no candidate code touches a GPU here (`ModelNew` is not instantiated);
    the actor's evaluation reuses these builds (`pipeline.prepare_build`), and builds what a candidate
    compiles lazily in `ModelNew.__init__` itself. Nothing is built when the node already holds the
    evaluation's own build (with `init_inputs`, e.g. from an earlier batch on this node).
    """
    try:
        from cudal1.eval.compile import CompileConfig, CompileService

        with stack_watchdog("CPU prebuild", trace):
            service = CompileService(CompileConfig(arch=arch, timeout_s=timeout_s, device="cuda"))
            if init_inputs is not None and service.cached_result(service.key_for(source, init_inputs)):
                return True
            return bool(service.build([source])[0].ok)
    except Exception:  # noqa: BLE001 - the actor rebuilds and reports the error itself
        logging.getLogger(__name__).debug("CPU prebuild failed", exc_info=True)
        return False


@dataclass
class _Slot:
    index: int
    actor: Any = None
    generation: int = 0
    info_ref: Any = None
    info: dict[str, Any] | None = None
    in_flight: int = 0
    solo_busy: bool = False  # running a solo item: nothing else goes to this actor meanwhile
    start_failures: int = 0  # consecutive actors of this slot that died while starting
    failed: str = ""  # why this slot gave up (after MAX_START_FAILURES); its work goes elsewhere


@dataclass
class _InFlight:
    slot: int
    generation: int
    job: Job
    key: str | None
    shared: bool = False  # another item ran on the same actor at some point during this one


class RayPool:
    """Evaluation actors on a Ray cluster (see the module docstring)."""

    def __init__(self, config: EvalConfig | None = None, pool_config: RayPoolConfig | None = None, *,
                 store: Any = None, evaluate_fn: EvaluateFn | None = None):
        self.ray = import_ray()
        self.config = config or EvalConfig()
        self.pool_config = pool_config or RayPoolConfig()
        self.store = store
        self._evaluate = evaluate_fn or default_evaluate
        self._owns_ray = self._connect()
        pc = self.pool_config
        self._actor_cls = self.ray.remote(EvalActor)
        self._build_task = self.ray.remote(num_cpus=1, num_gpus=0)(prebuild_on_node)
        try:
            self._check_actor_fits()
        except ConfigError:
            if self._owns_ray:
                self.ray.shutdown()
            raise
        n = pc.n_actors or self._default_actors()
        self._slots = [_Slot(i) for i in range(n)]
        for slot in self._slots:
            self._start_actor(slot)
        self._queue = JobQueue(n, pc.max_queue)
        self._in_flight: dict[Any, _InFlight] = {}
        self._lock = threading.Lock()
        self.stats = {"dispatched": 0, "retries": 0, "actor_restarts": 0, "failed": 0, "cached": 0}
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._dispatch_loop, name="cudal1-ray-dispatch", daemon=True)
        self._thread.start()
        logger.info("ray pool: %d actor(s) on %s; cluster resources %s", n, pc.device,
                    {k: v for k, v in self.ray.cluster_resources().items() if k in ("CPU", "GPU", "memory")})

    # ---------------------------------------------------------------------------------- cluster, actors
    def _connect(self) -> bool:
        ray, pc = self.ray, self.pool_config
        if ray.is_initialized():
            return False
        kwargs = {"include_dashboard": False, "log_to_driver": False, **pc.init_kwargs}
        if pc.address == "auto":
            try:
                ray.init(address="auto", **kwargs)
            except ConnectionError:
                logger.info("no running Ray cluster; starting a local one")
                ray.init(**kwargs)
        else:
            ray.init(address=pc.address, **kwargs) if pc.address else ray.init(**kwargs)
        return True

    def _check_actor_fits(self) -> None:
        """An actor no node can host waits forever (Ray only logs it). On a cluster this pool started, that is
        a ConfigError at once; on a joined cluster a warning (an autoscaler may still add such a node)."""
        pc = self.pool_config
        nodes = [n.get("Resources", {}) for n in self.ray.nodes() if n.get("Alive")]
        need = {"GPU": pc.num_gpus_per_actor, "CPU": pc.num_cpus_per_actor}
        if any(all(res.get(k, 0) >= v for k, v in need.items()) for res in nodes):
            return
        most = {k: max((res.get(k, 0) for res in nodes), default=0) for k in need}
        message = (f"no node can host an actor needing {need['GPU']:g} GPU and {need['CPU']:g} CPU (largest "
                   f"node: {most['GPU']:g} GPU, {most['CPU']:g} CPU)")
        if self._owns_ray:
            hint = "; evaluating on cpu? set num_gpus_per_actor=0" if most["GPU"] < need["GPU"] else ""
            raise ConfigError(message + hint)
        logger.warning("%s; actors wait until such a node joins", message)

    def _default_actors(self) -> int:
        pc = self.pool_config
        if not pc.device.startswith("cuda"):
            raise ConfigError("set n_actors for a Ray pool on cpu")
        gpus = self.ray.cluster_resources().get("GPU", 0)
        n = int(gpus // pc.num_gpus_per_actor) if pc.num_gpus_per_actor else 0
        if n < 1:
            raise ConfigError("the Ray cluster has no GPU: evaluate on its CPUs (set device='cpu' and n_actors), or on "
                              "this machine's GPUs: workers=local", fix=("workers", "local"))
        return n

    def _start_actor(self, slot: _Slot) -> None:
        pc = self.pool_config
        slot.actor = self._actor_cls.options(num_gpus=pc.num_gpus_per_actor, num_cpus=pc.num_cpus_per_actor,
                                             max_concurrency=1).remote(self._evaluate, pc.device, pc.trace_calls)
        slot.info_ref = slot.actor.describe.remote()
        slot.info = None
        slot.solo_busy = False

    def _replace_actor(self, slot: _Slot, generation: int, reason: str) -> None:
        if slot.generation != generation:
            return  # already replaced after an earlier failure of the same actor
        logger.warning("actor %d died (%s); starting a new one", slot.index, reason)
        try:
            self.ray.kill(slot.actor, no_restart=True)
        except Exception:  # noqa: BLE001 - it is dead already
            pass
        slot.generation += 1
        self.stats["actor_restarts"] += 1
        self._start_actor(slot)

    def _slot_ready(self, slot: _Slot) -> bool:
        if slot.info is not None:
            return True
        if slot.failed:
            return False
        ready, _ = self.ray.wait([slot.info_ref], timeout=0)
        if not ready:
            return False
        try:
            slot.info = self.ray.get(ready[0])
        except Exception as exc:  # noqa: BLE001 - the new actor died while starting
            slot.start_failures += 1
            if slot.start_failures >= MAX_START_FAILURES:
                # A systematic failure (import error, no device...): replacing it forever would hang
                # every caller; give up on this slot and say why.
                lines = [ln for ln in str(exc).strip().splitlines() if ln.strip()]
                slot.failed = (f"Ray actor {slot.index} failed to start {slot.start_failures} times: "
                               f"{type(exc).__name__}: {lines[-1][:300] if lines else ''}")
                logger.error("%s", slot.failed)
                self._queue.retire(slot.index)  # its waiting items go to the other actors
                try:
                    self.ray.kill(slot.actor, no_restart=True)  # a live but broken actor holds its GPU
                except Exception:  # noqa: BLE001 - already gone
                    pass
                return False
            self._replace_actor(slot, slot.generation, f"{type(exc).__name__} while starting")
            return False
        slot.start_failures = 0
        return True

    def _fail_queue_if_no_actor_can_start(self) -> None:
        """When every slot gave up, resolve the waiting items with the reason instead of waiting forever."""
        if not all(slot.failed for slot in self._slots):
            return
        for slot in self._slots:
            while (job := self._queue.get(slot.index, timeout_s=0)) is not None:
                if job.future.running() or job.future.set_running_or_notify_cancel():
                    self.stats["failed"] += 1
                    job.future.set_result(failure_result(job.task, job.source, slot.failed))

    def actor(self, slot: int) -> Any:
        """The actor handle of `slot` (tests kill it)."""
        return self._slots[slot].actor

    def slot_info(self, slot: int) -> dict[str, Any] | None:
        """What the actor of `slot` reported (environment, node, pid), once it started."""
        return self._slots[slot].info

    @property
    def n_devices(self) -> int:
        return len(self._slots)

    @property
    def queue_depth(self) -> int:
        return len(self._queue)

    # ------------------------------------------------------------------------------------- submission
    def submit(self, task: Task, source: str, config: EvalConfig | None = None, *, force: bool = False,
               label: str = "", run_id: str | None = None, block: bool = True,
               avoid_slot: int | None = None) -> PoolFuture:
        """Queue one evaluation; the future resolves to its `EvalResult` (never to an exception)."""
        refused = refused_at_submit(task, source)
        if refused is not None:
            return refused
        job = Job(task, source, config or self.config, force, label, run_id, avoid_slot, PoolFuture())
        self._queue.put(job, block=block)
        return job.future

    def map(self, items: Any, config: EvalConfig | None = None) -> list[EvalResult]:
        """Evaluate every (task, source) pair; results in input order."""
        futures = [self.submit(task, source, config) for task, source in items]
        return [f.result() for f in futures]

    # -------------------------------------------------------------------------------------- dispatcher
    def _dispatch_loop(self) -> None:
        while not self._closing.is_set():
            try:
                self._fill()
                if not self._in_flight:
                    self._queue.wait_for_work(POLL_S)
                    continue
                ready, _ = self.ray.wait(list(self._in_flight), num_returns=1, timeout=POLL_S)
                for ref in ready:
                    self._collect(ref)
            except Exception:  # noqa: BLE001 - the dispatcher must keep going
                logger.exception("ray pool dispatcher error")

    def _fill(self) -> None:
        self._fail_queue_if_no_actor_can_start()
        limit = self.pool_config.max_in_flight_per_actor
        for slot in self._slots:
            while slot.in_flight < limit and not slot.solo_busy and self._slot_ready(slot):
                job = self._queue.get(slot.index, timeout_s=0)
                if job is None:
                    break
                if job.solo and slot.in_flight > 0:
                    self._queue.put(job, front=True)  # waits for an idle actor
                    break
                if job.attempts == 0 and not job.solo and not job.future.set_running_or_notify_cancel():
                    continue
                self._dispatch(slot, job)

    def _dispatch(self, slot: _Slot, job: Job) -> None:
        info = slot.info or {}
        device, env = info.get("device", self.pool_config.device), info.get("environment", {})
        key = None
        if self.store is not None:
            key, hit = store_lookup(self.store, job.task, job.source, job.config, device, env, job.force)
            if hit is not None:
                self.stats["cached"] += 1
                job.future.set_result(hit)
                return
        cfg = dataclasses.replace(job.config, device=self.pool_config.device)
        dep = None
        if self.pool_config.prebuild_on_cpu and info.get("arch"):
            from cudal1.eval.pipeline import uses_load_inline

            if uses_load_inline(job.source):
                dep = self._prebuild_ref(job, info, cfg)
        ref = slot.actor.evaluate.remote(job.task, job.source, cfg, dep)
        job.future.slot = slot.index
        entry = _InFlight(slot.index, slot.generation, job, key, shared=slot.in_flight > 0)
        if entry.shared:
            for other in self._in_flight.values():
                if other.slot == slot.index and other.generation == slot.generation:
                    other.shared = True
        slot.in_flight += 1
        slot.solo_busy = job.solo
        self._in_flight[ref] = entry
        self.stats["dispatched"] += 1

    def _prebuild_ref(self, job: Job, info: dict[str, Any], cfg: EvalConfig) -> Any:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from cudal1.eval.compile import json_init_inputs

        strategy = NodeAffinitySchedulingStrategy(node_id=info["node_id"], soft=True)
        return self._build_task.options(scheduling_strategy=strategy).remote(
            job.source, info["arch"], cfg.build_timeout_s, self.pool_config.trace_calls, json_init_inputs(job.task))

    def _collect(self, ref: Any) -> None:
        entry = self._in_flight.pop(ref)
        slot, job = self._slots[entry.slot], entry.job
        if slot.generation == entry.generation:
            slot.in_flight -= 1
            if job.solo:
                slot.solo_busy = False
        exceptions = self.ray.exceptions
        try:
            result = self.ray.get(ref)
        except (exceptions.RayActorError, exceptions.WorkerCrashedError) as exc:
            self._on_actor_death(slot, entry, exc)
            return
        except Exception as exc:  # noqa: BLE001 - the evaluate function raised (it should not)
            self.stats["failed"] += 1
            result = failure_result(job.task, job.source, f"evaluator raised {type(exc).__name__}: "
                                    f"{str(exc).strip().splitlines()[-1][:300] if str(exc).strip() else ''}")
            job.future.set_result(result)
            return
        info = slot.info or {}
        device = info.get("device", self.pool_config.device)
        result = complete_result(result, job.task, job.source, job.config, device, info.get("environment", {}))
        if self.store is not None and entry.key is not None:
            self.store.record_evaluation(job.task, job.source, result, key=entry.key, label=job.label,
                                              run_id=job.run_id)
        job.future.set_result(result)

    def _on_actor_death(self, slot: _Slot, entry: _InFlight, exc: BaseException) -> None:
        reason = type(exc).__name__
        if slot.generation == entry.generation:
            # Every other item on the dead actor fails too; they no longer count against the new one.
            slot.in_flight = 0
        self._replace_actor(slot, entry.generation, reason)
        job = entry.job
        if entry.shared and not job.solo:
            job.solo = True  # maybe a neighbour killed the actor: retry alone, without counting
            self.stats["retries"] += 1
            self._queue.put(job, front=True)
            return
        job.attempts += 1
        if job.attempts > self.pool_config.max_retries:
            self.stats["failed"] += 1
            job.future.set_result(failure_result(
                job.task, job.source, f"evaluation worker died {job.attempts} time(s) ({reason}); "
                "the candidate may crash its process beyond the isolated child"))
            return
        self.stats["retries"] += 1
        logger.info("retrying %s (attempt %d) after %s", job.task.id, job.attempts + 1, reason)
        self._queue.put(job, front=True)

    # ------------------------------------------------------------------------------------------- close
    def close(self) -> None:
        """Stop dispatching; unfinished items resolve to RUNTIME_ERROR results; actors are killed."""
        self._closing.set()
        self._thread.join(timeout=10)
        for job in self._queue.close():
            if not job.future.done() and (job.future.running() or job.future.set_running_or_notify_cancel()):
                job.future.set_result(failure_result(job.task, job.source, "the pool was closed"))
        for entry in self._in_flight.values():
            if not entry.job.future.done():
                entry.job.future.set_result(failure_result(entry.job.task, entry.job.source, "the pool was closed"))
        self._in_flight.clear()
        try:  # idle actors stop their warm workers; a busy or dead one is killed regardless
            refs = [slot.actor.close.remote() for slot in self._slots if not slot.failed]
            if refs:
                self.ray.wait(refs, num_returns=len(refs), timeout=5)
        except Exception:  # noqa: BLE001 - best effort before the kill
            pass
        for slot in self._slots:
            try:
                self.ray.kill(slot.actor, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone
                pass
        if self._owns_ray:
            self.ray.shutdown()

    def __enter__(self) -> RayPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
