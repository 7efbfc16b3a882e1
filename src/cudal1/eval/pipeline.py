"""The evaluation pipeline: static checks -> store lookup -> build -> isolated run -> verdict -> store.

`evaluate_candidate` is the one function every caller uses (CLI, optimize loop, rewards, pools). The
parent process never imports candidate code: it analyses the source as text, hands building and running
to isolated children (`isolation.run_isolated`), and turns what comes back into an `EvalResult`.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from cudal1.core.types import EvalResult, Flag, KernelClass, Mismatch, Status, TimingStats
from cudal1.eval.config import EvalConfig, resolve_device
from cudal1.eval.isolation import IsolatedOutcome, Limits, WorkerSupply, run_isolated, usable_cpu_count
from cudal1.tasks.task import Task, source_hash

logger = logging.getLogger(__name__)

WORKER_ENTRY = "cudal1.eval.worker:evaluate_in_worker"


@functools.lru_cache(maxsize=8)
def local_environment(device: str) -> dict[str, Any]:
    """GPU name and software versions of this machine for `device` (part of the cache key)."""
    import platform

    import torch

    env: dict[str, Any] = {"device_type": device.split(":")[0], "torch_version": torch.__version__,
                           "cuda_version": torch.version.cuda, "python": platform.python_version()}
    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(torch.device(device))
        env.update(gpu_name=props.name, capability=f"{props.major}.{props.minor}")
    else:
        env["gpu_name"] = "cpu"
    return env


def static_report(source: str, reference: str | None, preset: str) -> Any | None:
    """The static analysis report, or None when the analysis module is unavailable."""
    try:
        from cudal1.analysis import analyze_source
    except ImportError:
        logger.warning("static analysis unavailable; evaluating without it")
        return None
    return analyze_source(source, reference_source=reference, preset=preset)


def uses_load_inline(source: str) -> bool:
    return "cpp_extension" in source or "load_inline" in source


@dataclass
class PreparedBuild:
    env: dict[str, str]
    result: EvalResult | None  # a COMPILE_ERROR/TIMEOUT verdict when the build failed


def prepare_build(task: Task, source: str, cfg: EvalConfig) -> PreparedBuild:
    """Build a `load_inline` candidate in the compile service (cached) and return the env to import it."""
    if not (cfg.device.startswith("cuda") and uses_load_inline(source)):
        return PreparedBuild({}, None)
    try:
        from cudal1.eval.compile import CompileConfig, CompileService, build_failure_message, local_arch
    except ImportError:
        return PreparedBuild({}, None)
    service = CompileService(CompileConfig(arch=local_arch(), timeout_s=cfg.build_timeout_s, device=cfg.device))
    init = json_init_inputs(task)
    key = service.key_for(source, init)
    if init is not None and service.cached_result(key) is None:
        # An import-only build made elsewhere (a Ray pool's CPU task) is reused; whatever the candidate
        # builds lazily in ModelNew.__init__ is then built by the worker while it constructs the model.
        bare = service.cached_result(service.key_for(source, None))
        if bare is not None and bare.builds:
            return PreparedBuild(service.environment(bare.key), None)
    built = service.build([source], init_inputs=[init])[0]
    env = service.environment(key)
    if built.ok:
        return PreparedBuild(env, None)
    status = Status.TIMEOUT if "timed out" in built.log else Status.COMPILE_ERROR
    return PreparedBuild(env, EvalResult(status=status, message=build_failure_message(built.log),
                                         compile_log=built.log, task_id=task.id))


def outcome_to_result(outcome: IsolatedOutcome, task: Task, cand_hash: str) -> EvalResult:
    """Turn what the worker returned (or how it died) into an EvalResult."""
    if outcome.timed_out:
        return EvalResult(status=Status.TIMEOUT, message=f"evaluation {outcome.describe_failure()}",
                          task_id=task.id, candidate_hash=cand_hash)
    if not outcome.ok:
        tail = [ln for ln in outcome.stderr_tail.splitlines() if "error" in ln.lower()][-1:]
        detail = f" ({tail[0].strip()[:200]})" if tail else ""
        return EvalResult(status=Status.RUNTIME_ERROR, message=f"worker {outcome.describe_failure()}{detail}",
                          task_id=task.id, candidate_hash=cand_hash)
    try:
        return _parse_worker_value(outcome.value, task, cand_hash)
    except (KeyError, TypeError, ValueError) as exc:  # a worker whose reply was tampered with
        return EvalResult(status=Status.RUNTIME_ERROR, message=f"malformed worker result ({type(exc).__name__})",
                          task_id=task.id, candidate_hash=cand_hash)


def _parse_worker_value(v: dict[str, Any], task: Task, cand_hash: str) -> EvalResult:
    t = v.get("timing")
    timing = TimingStats(**t) if t else None
    status = Status(v["status"])
    return EvalResult(
        status=status, message=v.get("message", ""), task_id=task.id, candidate_hash=cand_hash,
        speedup=timing.speedup if (timing and status is Status.CORRECT) else None, timing=timing,
        flags=[Flag.from_dict(f) for f in v.get("flags", [])],
        mismatch=Mismatch.from_dict(v["mismatch"]) if v.get("mismatch") else None,
        compile_log=v.get("compile_log", ""), environment=v.get("environment", {}),
        protocol={"phase_s": v.get("phase_s", {})})


def evaluate_candidate(task: Task, source: str, config: EvalConfig | None = None, *, store: Any = None,
                       force: bool = False, label: str = "", run_id: str | None = None,
                       workers: WorkerSupply | None = None) -> EvalResult:
    """Evaluate one candidate source against a task; never raises for anything the candidate does.

    `workers` supplies pre-started worker processes (see `evaluate_many`); without it a worker is
    started for this candidate.
    """
    started = time.monotonic()
    cfg = (config or EvalConfig()).resolved(resolve_device((config or EvalConfig()).device))
    cand_hash = source_hash(source)
    env = local_environment(cfg.device)
    protocol = cfg.protocol()
    key = None
    if store is not None:
        key, hit = store.lookup(task.hash, cand_hash, protocol, env, force=force, limits=cfg.limits())
        if hit is not None:
            return hit
    result = _evaluate_uncached(task, source, cfg, cand_hash, workers)
    result = result.replace(protocol={**protocol, **cfg.limits(), **result.protocol},
                            environment={**env, **result.environment},
                            duration_s=time.monotonic() - started, task_id=task.id, candidate_hash=cand_hash)
    if store is not None:
        from cudal1.baselines import attach_baselines

        result = attach_baselines(result, task, store)
        store.put_task(task.id, task.source, level=task.level, origin=task.origin)
        store.put_candidate(source, task_id=task.id)
        store.put_evaluation(result, task_hash=task.hash, key=key, label=label, run_id=run_id)
        if result.status is Status.HACK_DETECTED:
            from cudal1.judge.cases import HackCaseDB

            HackCaseDB(store.path).record_confirmed(result, source, reference_source=task.source)
    return result


def _evaluate_uncached(task: Task, source: str, cfg: EvalConfig, cand_hash: str,
                       workers: WorkerSupply | None) -> EvalResult:
    # Where an evaluation's wall time goes, beside the worker's own phases (reported in protocol.phase_s).
    phases: dict[str, float] = {}
    clock = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        phases[name] = now - clock
        clock = now

    def with_phases(result: EvalResult) -> EvalResult:
        merged = {**phases, **result.protocol.get("phase_s", {})}
        return result.replace(protocol={**result.protocol, "phase_s": merged})

    preset = cfg.profile_obj.static_preset
    report = None if cfg.skip_static else static_report(source, task.source, preset)
    static_flags = list(report.flags) if report is not None else []
    kernel_class = KernelClass(report.kernel_class) if report is not None else None
    lap("static")
    if report is not None:
        from cudal1.analysis import rejection_message

        message = rejection_message(report, preset)
        if message:
            return with_phases(EvalResult(status=Status.HACK_DETECTED, message=message, flags=static_flags,
                                          kernel_class=kernel_class))
    build = prepare_build(task, source, cfg)
    lap("build")
    if build.result is not None:
        return with_phases(build.result.replace(flags=static_flags, kernel_class=kernel_class))
    payload = {"task_id": task.id, "ref_source": task.source, "cand_source": source,
               "config": cfg.to_dict(), "device": cfg.device,
               "static_report": report.to_dict() if report is not None else None}
    # A build that did not happen in the compile service happens at import inside the worker.
    build_in_worker = uses_load_inline(source) and not build.env
    limits = Limits(timeout_s=cfg.timeout_s + (cfg.build_timeout_s if build_in_worker else 0.0),
                    memory_bytes=cfg.memory_bytes)
    worker = workers.take() if workers is not None else None
    lap("worker_take")
    outcome = run_isolated(WORKER_ENTRY, payload, limits=limits, env=build.env, worker=worker)
    lap("worker_run")
    result = outcome_to_result(outcome, task, cand_hash)
    if kernel_class is not None:
        from cudal1.eval.profiling import reclassify

        kernel_class = reclassify(kernel_class, result.flags)  # a decoy counts as what actually ran
    return with_phases(result.replace(flags=static_flags + list(result.flags), kernel_class=kernel_class))


#: Warm workers kept ready on a GPU. A worker's start (interpreter, imports, CUDA context) takes ~9 s on the
#: H200 host and an evaluation 2-5 s, so a replacement started at each take is ready about three takes
#: later: with two spares, on a release sample, 4 of 13 correct candidates waited 2.7-4.3 s for their
#: worker beyond the first one's 10.6 s (the other 8: 0.1-0.2 s). Each spare is a process with torch
#: imported and a CUDA context (GPU memory of its own).
#: On cpu one: a starting worker competes with the host timers of the evaluation in progress.
CUDA_SPARES = 4


def worker_supply(device: str, at_most: int | None = None) -> WorkerSupply:
    """Pre-started evaluation workers for a series of evaluations on `device` (close it when done); a series
    of at most `at_most` evaluations starts no more workers than that."""
    cuda = device.startswith("cuda")
    spares = CUDA_SPARES if cuda else 1
    return WorkerSupply(WORKER_ENTRY, warm_device=device if cuda else None,
                        spares=max(1, min(spares, at_most)) if at_most is not None else spares,
                        total=max(1, at_most) if at_most is not None else None)


def evaluate_many(items: Iterable[tuple[Task, str]], config: EvalConfig | None = None, *, store: Any = None,
                  force: bool = False, label: str = "", run_id: str | None = None,
                  on_result: Callable[[int, EvalResult], None] | None = None,
                  should_stop: Callable[[], bool] | None = None,
                  on_build: Callable[[int, int], None] | None = None,
                  workers: WorkerSupply | None = None, overlap_builds: bool = False) -> list[EvalResult | None]:
    """Evaluate (task, source) pairs one after another on this machine's device.

    On a GPU, the `load_inline` builds of all pairs run first, in parallel in the compile pool
    (`on_build(done, total)` follows them; a candidate that may build lazily in `forward` also runs one
    forward there, the GPU being idle), while the first workers start (interpreter, imports, CUDA
    context); then the pairs are evaluated in input order. With `overlap_builds` the GPU does not wait for
    the builds: each candidate is evaluated as soon as it can be, those without a pending build first, the
    others as their builds finish (on a CUDA-L1 release sample builds were half of a batch's wall time).
    The builds then run niced on all cores but two, which the worker being timed gets to itself
    (`split_cores`; workers still starting share the build cores) until the builds are done; the host's
    memory and caches are still shared, so keep it off where every speedup must be as precise as possible.
    `on_result(index, result)` is called in evaluation order; the returned list is in input order.
    `should_stop` is asked before each candidate (a time budget, a signal): once it says stop, the pairs not
    evaluated yet are None in the returned list (the only way a None appears). `workers` is a supply the
    caller keeps across calls (closed by the caller); without it one is started for this call.
    """
    items = list(items)
    cfg = config or EvalConfig()
    device = resolve_device(cfg.device)
    results: list[EvalResult | None] = [None] * len(items)
    with contextlib.nullcontext(workers) if workers is not None else worker_supply(device, len(items)) as supply:
        builds = _BackgroundBuilds()
        remaining = list(range(len(items)))
        try:
            pinned = device.startswith("cuda") and _start_builds(builds, items, cfg.resolved(device), store, force,
                                                                 supply, on_build, overlap_builds)
            while remaining:
                if pinned and builds.idle():
                    supply.pin(None)  # builds done: every core for the evaluations again
                    pinned = False
                i = builds.next_ready(remaining, should_stop)
                if i is None:
                    break
                remaining.remove(i)
                task, source = items[i]
                results[i] = evaluate_candidate(task, source, cfg, store=store, force=force, label=label,
                                                run_id=run_id, workers=supply)
                if on_result is not None:
                    on_result(i, results[i])
        finally:
            supply.pin(None)  # a caller's supply serves its next batch on every core
        if remaining:
            builds.cancel()  # stopped early: builds not started yet are skipped
        builds.join()  # no build keeps running behind the batch (an exception does not wait)
    return results


def _start_builds(builds: _BackgroundBuilds, items: list[tuple[Task, str]], cfg: EvalConfig, store: Any,
                  force: bool, supply: WorkerSupply, on_build: Callable[[int, int], None] | None,
                  overlap: bool) -> bool:
    """Start the `load_inline` builds of a batch on a GPU; wait for them unless `overlap`. True when the
    supply was pinned to cores of its own for the time the builds run."""
    to_build = list(range(len(items)))
    if store is not None and not force:  # a resumed batch builds only what it will evaluate
        env = local_environment(cfg.device)
        to_build = [i for i in to_build if store.lookup(items[i][0].hash, source_hash(items[i][1]),
                                                        cfg.protocol(), env, limits=cfg.limits())[1] is None]
    to_build = [i for i in to_build if uses_load_inline(items[i][1])]
    if not to_build:
        return False
    supply.fill()  # the first workers start while the builds run
    # Beside the evaluations: the worker being timed gets two cores of its own; compilers and the workers
    # still starting share the rest (the compilers niced).
    cores = split_cores() if overlap else None
    if cores is not None:
        supply.pin(cores[0], others=cores[1])
    n_cores = usable_cpu_count()
    max_workers = (len(cores[1]) if cores is not None
                   else max(1, n_cores - CORES_KEPT_FOR_EVALUATION) if overlap else n_cores)
    # Builds first: the GPU is idle meanwhile, so lazy builds may run a forward there (`warm_lazy`).
    builds.start(items, to_build, cfg, on_build, max_workers, cpus=cores[1] if cores is not None else None,
                 warm_lazy=not overlap)
    if not overlap:
        builds.join()
    return cores is not None


#: Cores kept for the evaluation while builds run beside it (`overlap_builds`): its worker launches the
#: kernels from there, and no compiler runs on them.
CORES_KEPT_FOR_EVALUATION = 2


def split_cores(keep: int = CORES_KEPT_FOR_EVALUATION) -> tuple[frozenset[int], frozenset[int]] | None:
    """(evaluation cores, build cores) out of the cores this process may use; None with fewer than keep + 2."""
    if hasattr(os, "sched_getaffinity"):
        cores = sorted(os.sched_getaffinity(0))
    else:  # no affinity on this platform: nothing to split
        return None
    if len(cores) < keep + 2:
        return None
    return frozenset(cores[:keep]), frozenset(cores[keep:])


class _BackgroundBuilds:
    """`load_inline` builds of a batch in a thread; `next_ready` hands out the items whose build is done."""

    def __init__(self) -> None:
        self._pending: set[int] = set()  # item indices whose build has not finished
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None
        self._cancelled = threading.Event()

    def start(self, items: list[tuple[Task, str]], indices: list[int], cfg: EvalConfig,
              on_build: Callable[[int, int], None] | None, max_workers: int,
              cpus: frozenset[int] | None = None, warm_lazy: bool = False) -> None:
        todo = [items[i] for i in indices]
        self._pending = set(indices)

        def done(index_in_todo: int) -> None:
            with self._changed:
                self._pending.discard(indices[index_in_todo])
                self._changed.notify_all()

        def run() -> None:
            try:
                prebuild(todo, cfg, on_build=on_build, on_item=done, max_workers=max_workers,
                         should_cancel=self._cancelled.is_set, cpus=cpus, warm_lazy=warm_lazy)
            except Exception:  # noqa: BLE001 - each candidate is then built by its own evaluation
                logger.warning("background builds failed; each candidate builds when evaluated", exc_info=True)
            finally:
                with self._changed:
                    self._pending.clear()
                    self._changed.notify_all()

        self._thread = threading.Thread(target=run, name="cudal1-builds", daemon=True)
        self._thread.start()

    def next_ready(self, remaining: list[int], should_stop: Callable[[], bool] | None) -> int | None:
        """The first of `remaining` (input order) whose build is not pending, waiting for one if need be;
        None once `should_stop` says stop."""
        with self._changed:
            while True:
                if should_stop is not None and should_stop():
                    return None
                ready = next((i for i in remaining if i not in self._pending), None)
                if ready is not None:
                    return ready
                self._changed.wait(timeout=1.0)  # also re-asks should_stop while builds run

    def idle(self) -> bool:
        """No build is running or waiting (all done, or none started)."""
        return self._thread is None or not self._thread.is_alive()

    def cancel(self) -> None:
        """Skip the builds not started yet."""
        self._cancelled.set()

    def join(self) -> None:
        """Wait for the builds."""
        if self._thread is not None:
            self._thread.join()


def json_init_inputs(task: Task) -> list[Any] | None:
    """The reference's init inputs when they are plain JSON values (so lazy builds in `ModelNew.__init__`
    can happen in the compile pool); None otherwise. Runs reference code only, never candidate code."""
    return _json_init_inputs(task.id, task.source)


@functools.lru_cache(maxsize=1024)
def _json_init_inputs(task_id: str, source: str) -> list[Any] | None:
    # Cached: a batch asks once per candidate in `prebuild` and again in `prepare_build`.
    import json

    from cudal1.tasks.task import load_reference

    try:
        values = list(load_reference(source, task_id).get_init_inputs())
        json.dumps(values)
    except Exception:  # noqa: BLE001 - not JSON-able or not loadable: the build then happens in the worker
        return None
    return values


def prebuild(items: list[tuple[Task, str]], cfg: EvalConfig,
             on_build: Callable[[int, int], None] | None = None,
             on_item: Callable[[int], None] | None = None, max_workers: int | None = None,
             should_cancel: Callable[[], bool] | None = None, cpus: frozenset[int] | None = None,
             warm_lazy: bool = False) -> None:
    """Build every `load_inline` candidate of `items` in parallel (cached), ahead of their evaluation.

    `on_build(done, total)` follows the distinct builds; `on_item(i)` is called once for each item `i`
    when its build is done (at once for items that need none); builds not started when `should_cancel`
    says so are skipped; `cpus` confines the builds to those cores. `warm_lazy` also runs one forward of
    each candidate that may build lazily, on `cfg.device` (`CompileConfig.warm_lazy_builds`): only while
    no evaluation is timed on that device.
    """
    notify = on_item or (lambda i: None)
    todo = [i for i, (_, s) in enumerate(items) if uses_load_inline(s)]
    for i in sorted(set(range(len(items))) - set(todo)):
        notify(i)
    if not todo:
        return
    try:
        from cudal1.eval.compile import CompileConfig, CompileService, local_arch
    except ImportError:  # no build service here: each candidate builds in its own evaluation
        for i in todo:
            notify(i)
        return
    service = CompileService(CompileConfig(arch=local_arch(), max_workers=max_workers, timeout_s=cfg.build_timeout_s,
                                           device=cfg.device, cpus=tuple(sorted(cpus)) if cpus else None,
                                           warm_lazy_builds=warm_lazy,
                                           warm_sizes=cfg.resolved(cfg.device).sizes))
    inits = [json_init_inputs(items[i][0]) for i in todo]
    waiting: dict[str, list[int]] = {}
    for i, init in zip(todo, inits, strict=True):
        waiting.setdefault(service.key_for(items[i][1], init), []).append(i)

    def progress(done: int, total: int, result: Any) -> None:
        for i in waiting.pop(result.key, []):
            notify(i)
        if on_build is not None:
            on_build(done, total)

    service.build([items[i][1] for i in todo], init_inputs=inits, ref_sources=[items[i][0].source for i in todo],
                  progress=progress, should_cancel=should_cancel)


__all__ = ["evaluate_candidate", "evaluate_many", "local_environment", "prebuild"]
