"""The batch scheduler: many (task, candidate) pairs on this machine's device, builds ahead of their turn.

On a GPU the `load_inline` builds of a batch run first, in parallel on every core (`prebuild`, in the
compile service's sandboxed children), while the first runners start; then the pairs are evaluated one after
another (`pipeline.evaluate_candidate`), each on two pre-started runners. With `overlap_builds` the GPU
does not wait: candidates without a pending build go first, the others as their builds finish.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any

from cudal1.core.machine import describe_machine
from cudal1.core.types import EvalResult
from cudal1.eval.compile import CompileConfig, CompileService, json_init_inputs, local_arch
from cudal1.eval.config import EvalConfig, resolve_device
from cudal1.eval.evaluation import runner_supply
from cudal1.eval.pipeline import evaluate_candidate, uses_load_inline
from cudal1.eval.supply import RunnerSupply, core_split, usable_cpu_count
from cudal1.tasks.task import Task, source_hash

logger = logging.getLogger(__name__)


def evaluate_many(items: Iterable[tuple[Task, str]], config: EvalConfig | None = None, *, store: Any = None,
                  force: bool = False, label: str = "", run_id: str | None = None,
                  on_result: Callable[[int, EvalResult], None] | None = None,
                  should_stop: Callable[[], bool] | None = None,
                  on_build: Callable[[int, int], None] | None = None,
                  runners: RunnerSupply | None = None, overlap_builds: bool = False) -> list[EvalResult | None]:
    """Evaluate (task, source) pairs one after another on this machine's device.

    On a GPU, the `load_inline` builds of all pairs run first, in parallel in the compile pool
    (`on_build(done, total)` follows them; a candidate that may build lazily in `forward` also runs one
    forward there, the GPU being idle), while the first runners start (interpreter, imports, CUDA
    context); then the pairs are evaluated in input order. With `overlap_builds` the GPU does not wait for
    the builds: each candidate is evaluated as soon as it can be, those without a pending build first, the
    others as their builds finish (on a CUDA-L1 release sample builds were half of a batch's wall time).
    The builds then run niced on the cores the device's timed processes do not keep (`supply.core_split`;
    runners still starting share the build cores) until the builds are done; the host's
    memory and caches are still shared, so keep it off where every speedup must be as precise as possible.
    `on_result(index, result)` is called in evaluation order; the returned list is in input order.
    `should_stop` is asked before each candidate (a time budget, a signal): once it says stop, the pairs not
    evaluated yet are None in the returned list (the only way a None appears). `runners` is a supply the
    caller keeps across calls (`runner_supply`, closed by the caller); without it one is started for this
    call.
    """
    items = list(items)
    cfg = config or EvalConfig()
    device = resolve_device(cfg.device)
    results: list[EvalResult | None] = [None] * len(items)
    with contextlib.nullcontext(runners) if runners is not None else runner_supply(device, len(items), hidden_files=[str(store.path)] if store is not None else None) as supply:
        builds = _BackgroundBuilds()
        remaining = list(range(len(items)))
        try:
            pinned = device.startswith("cuda") and _start_builds(builds, items, cfg.resolved(device), store, force,
                                                                 supply, on_build, overlap_builds)
            while remaining:
                if pinned and builds.idle():
                    supply.pin(None)  # builds done: the supply's own split of the cores again
                    pinned = False
                i = builds.next_ready(remaining, should_stop)
                if i is None:
                    break
                remaining.remove(i)
                task, source = items[i]
                results[i] = evaluate_candidate(task, source, cfg, store=store, force=force, label=label,
                                                run_id=run_id, runners=supply)
                if on_result is not None:
                    on_result(i, results[i])
        finally:
            supply.pin(None)  # a caller's supply serves its next batch on its own split of the cores
        if remaining:
            builds.cancel()  # stopped early: builds not started yet are skipped
        builds.join()  # no build keeps running behind the batch (an exception does not wait)
    return results


def _start_builds(builds: _BackgroundBuilds, items: list[tuple[Task, str]], cfg: EvalConfig, store: Any,
                  force: bool, supply: RunnerSupply, on_build: Callable[[int, int], None] | None,
                  overlap: bool) -> bool:
    """Start the `load_inline` builds of a batch on a GPU; wait for them unless `overlap`. True when the
    supply was pinned to cores of its own for the time the builds run."""
    to_build = list(range(len(items)))
    if store is not None and not force:  # a resumed batch builds only what it will evaluate
        env = describe_machine(cfg.device)
        to_build = [i for i in to_build if store.lookup(items[i][0].hash, source_hash(items[i][1]),
                                                        cfg.protocol(), env, limits=cfg.limits())[1] is None]
    to_build = [i for i in to_build if uses_load_inline(items[i][1])]
    if not to_build:
        return False
    supply.fill()  # the first runners start while the builds run
    # Beside the evaluations: the timed processes keep their cores; compilers and the runners still starting
    # share the rest (the compilers niced).
    split = core_split(cfg.device) if overlap else None
    if split is not None:
        supply.pin(split.runners, others=split.others)
    threads = len(split.others) if split is not None else usable_cpu_count()
    # Builds first: the GPU is idle meanwhile, so lazy builds may run a forward there (`warm_lazy`).
    builds.start(items, to_build, cfg, on_build, threads, cpus=split.others if split is not None else None,
                 warm_lazy=not overlap)
    if not overlap:
        builds.join()
    return split is not None


class _BackgroundBuilds:
    """`load_inline` builds of a batch in a thread; `next_ready` hands out the items whose build is done."""

    def __init__(self) -> None:
        self._pending: set[int] = set()  # item indices whose build has not finished
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None
        self._cancelled = threading.Event()

    def start(self, items: list[tuple[Task, str]], indices: list[int], cfg: EvalConfig,
              on_build: Callable[[int, int], None] | None, threads: int,
              cpus: frozenset[int] | None = None, warm_lazy: bool = False) -> None:
        todo = [items[i] for i in indices]
        self._pending = set(indices)

        def done(index_in_todo: int) -> None:
            with self._changed:
                self._pending.discard(indices[index_in_todo])
                self._changed.notify_all()

        def run() -> None:
            try:
                prebuild(todo, cfg, on_build=on_build, on_item=done, threads=threads,
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


def prebuild(items: list[tuple[Task, str]], cfg: EvalConfig,
             on_build: Callable[[int, int], None] | None = None,
             on_item: Callable[[int], None] | None = None, threads: int | None = None,
             should_cancel: Callable[[], bool] | None = None, cpus: frozenset[int] | None = None,
             warm_lazy: bool = False) -> None:
    """Build every `load_inline` candidate of `items` in parallel (cached), ahead of their evaluation.

    `on_build(done, total)` follows the distinct builds; `on_item(i)` is called once for each item `i`
    when its build is done (at once for items that need none); builds not started when `should_cancel`
    says so are skipped; `threads` builds run at once (None: every usable core); `cpus` confines the builds to
    those cores. `warm_lazy` also runs one forward of each candidate that may build lazily, on `cfg.device`
    (`CompileConfig.warm_lazy_builds`): only while no evaluation is timed on that device.
    """
    notify = on_item or (lambda i: None)
    todo = [i for i, (_, s) in enumerate(items) if uses_load_inline(s)]
    for i in sorted(set(range(len(items))) - set(todo)):
        notify(i)
    if not todo:
        return
    service = CompileService(CompileConfig(arch=local_arch(), threads=threads, timeout_s=cfg.build_timeout_s,
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


__all__ = ["evaluate_many", "prebuild", "runner_supply"]
