"""The one evaluator interface: `make_evaluator(spec)` over this process, a pool (local or Ray) and the reward
server, for every caller (the CLI, the optimize and augment loops, the trainer, the TRL adapter).

    evaluator = make_evaluator("local", EvalConfig(), store=store)   # '', local, ray:auto, ray://, http(s)://
    result = evaluator(task, source)                                  # one candidate
    results = evaluator.evaluate(pairs, on_result=print_progress)     # a batch, results in input order
    evaluator.close()

A batch is scheduled by whoever evaluates it: in this process the `load_inline` builds run in parallel
first and the candidates are timed one at a time with warm runners kept across batches
(`eval.scheduler.evaluate_many`); a pool gives each GPU one timed candidate at a time; a server queues
them. An evaluator that fails (a pool gone, a server unreachable) gives `infra_error` verdicts for the
candidates it could not evaluate, never a candidate's status, and never loses the rest of the batch.

`as_evaluator` wraps what callers already hold: an `Evaluator`, a pool, a `RewardClient` or a plain
function `(task, source) -> EvalResult`.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import queue
import threading
from collections.abc import Callable, Sequence
from typing import Any

from cudal1.core.errors import ConfigError
from cudal1.core.types import EvalResult, Status
from cudal1.eval.config import EvalConfig, resolve_device
from cudal1.eval.pipeline import evaluate_candidate
from cudal1.eval.scheduler import evaluate_many, runner_supply
from cudal1.service.client import ENV_TOKEN, RewardClient
from cudal1.service.factory import make_pool
from cudal1.tasks.task import Task

logger = logging.getLogger(__name__)

#: What `make_evaluator` accepts, for help texts and errors.
EVALUATOR_SPECS = "'' (this process), local, ray:auto, ray://HOST:PORT or http(s)://HOST:PORT (a reward server)"

Item = tuple[Task, str]
OnResult = Callable[[int, EvalResult], None]


def is_evaluator_spec(spec: str) -> bool:
    """Whether `make_evaluator` takes `spec` (`EVALUATOR_SPECS`); configs check with it before anything starts."""
    spec = (spec or "").strip()
    return spec in ("", "inprocess", "local", "ray:auto") or spec.startswith(("ray://", "http://", "https://"))


def infra_result(task: Task, exc: BaseException) -> EvalResult:
    """The verdict of a candidate its evaluator failed to evaluate: the evaluator's failure, not the candidate's."""
    return EvalResult(status=Status.INFRA_ERROR, message=f"evaluator raised {exc!r}"[:300], task_id=task.id)


class _CallerRaised(Exception):
    """An exception of the caller's `on_result`, carried through the evaluator untouched."""

    def __init__(self, original: BaseException):
        super().__init__(repr(original))
        self.original = original


class Evaluator:
    """`evaluator(task, source)` and `evaluator.evaluate(items)` wherever the evaluation runs (module docstring).
    `config`, `store`, `label` and `run_id` are the settings its verdicts are made and recorded under;
    `evaluated` counts the candidates it has judged."""

    spec = "inprocess"

    def __init__(self, config: EvalConfig, *, store: Any = None, label: str = "", run_id: str | None = None):
        self.config, self.store, self.label, self.run_id = config, store, label, run_id
        self.evaluated = 0
        self._count_lock = threading.Lock()

    def __call__(self, task: Task, source: str) -> EvalResult:
        return self.evaluate([(task, source)])[0] or infra_result(task, RuntimeError("not evaluated"))

    def evaluate(self, items: Sequence[Item], *, on_result: OnResult | None = None,
                 should_stop: Callable[[], bool] | None = None, on_build: Callable[[int, int], None] | None = None,
                 force: bool = False) -> list[EvalResult | None]:
        """Results in input order; `on_result(index, result)` as each arrives (from any thread). None for items
        skipped because `should_stop` said so. `on_build(done, total)` follows the builds where this process
        runs them; `force` evaluates again what a store already holds."""
        items = list(items)
        results: list[EvalResult | None] = [None] * len(items)

        def record(i: int, result: EvalResult) -> None:
            results[i] = self._counted(result)
            if on_result is not None:
                try:
                    on_result(i, result)
                except BaseException as exc:  # the caller's own exception (an interruption): theirs to see
                    raise _CallerRaised(exc) from exc

        if not items:
            return results
        try:
            self._evaluate(items, record, should_stop, on_build, force)
        except _CallerRaised as raised:
            raise raised.original from None
        except Exception as exc:  # noqa: BLE001 - the evaluator's failure costs the candidates it left only
            logger.warning("the evaluator %s failed on a batch of %d", self.spec, len(items), exc_info=True)
            for i, result in enumerate(results):
                if result is None:
                    record(i, infra_result(items[i][0], exc))
        return results

    def _counted(self, result: EvalResult) -> EvalResult:
        with self._count_lock:
            self.evaluated += 1
        return result

    def _evaluate(self, items: list[Item], record: OnResult, should_stop: Callable[[], bool] | None,
                  on_build: Callable[[int, int], None] | None, force: bool) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """End what this evaluator started (workers, a pool, a connection)."""

    def __enter__(self) -> Evaluator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class InProcessEvaluator(Evaluator):
    """Evaluations on this machine; one warm-runner supply kept for the evaluator's life, so that the next
    batch's first runner is already started."""

    def __init__(self, config: EvalConfig, **kwargs: Any):
        super().__init__(config, **kwargs)
        self._supply: Any = None

    def __call__(self, task: Task, source: str) -> EvalResult:
        return self._counted(evaluate_candidate(task, source, self.config, store=self.store, label=self.label,
                                                run_id=self.run_id))

    def _evaluate(self, items, record, should_stop, on_build, force) -> None:  # type: ignore[no-untyped-def]
        if self._supply is None:
            self._supply = runner_supply(resolve_device(self.config.device))
        evaluate_many(items, self.config, store=self.store, force=force, label=self.label, run_id=self.run_id,
                      on_result=record, should_stop=should_stop, on_build=on_build, runners=self._supply)

    def close(self) -> None:
        if self._supply is not None:
            self._supply.close()
            self._supply = None


class PoolEvaluator(Evaluator):
    """Evaluations through a pool (`cudal1.service.pool`), which writes the store. Submissions run in a thread
    of their own (they wait while the pool's queue is full); results are reported as they finish."""

    def __init__(self, pool: Any, config: EvalConfig | None = None, *, spec: str = "pool", owns_pool: bool = True,
                 **kwargs: Any):
        super().__init__(config or getattr(pool, "config", None) or EvalConfig(), **kwargs)
        self.pool, self.spec, self.owns_pool = pool, spec, owns_pool

    def _evaluate(self, items, record, should_stop, on_build, force) -> None:  # type: ignore[no-untyped-def]
        done: queue.Queue = queue.Queue()
        submitted = [0]

        def submit_all() -> None:
            try:
                for i, (task, source) in enumerate(items):
                    if should_stop is not None and should_stop():
                        break
                    future = self.pool.submit(task, source, self.config, force=force, label=self.label,
                                              run_id=self.run_id)
                    submitted[0] += 1
                    future.add_done_callback(lambda f, i=i: done.put((i, f)))
            except BaseException as exc:  # noqa: BLE001 - handed to the reading loop, which raises it
                done.put((None, exc))
            done.put((None, None))  # every submission made

        submitter = threading.Thread(target=submit_all, name="cudal1-submit", daemon=True)
        submitter.start()
        received, finished = 0, False
        while not finished or received < submitted[0]:
            i, item = done.get()
            if i is None:
                if item is not None:
                    raise item
                finished = True
                continue
            received += 1
            try:
                result = item.result()
            except Exception as exc:  # noqa: BLE001 - pool futures resolve to verdicts; a broken one is infra
                result = infra_result(items[i][0], exc)
            record(i, result)
        submitter.join()

    def close(self) -> None:
        if self.owns_pool:
            self.pool.close()


class ServerEvaluator(Evaluator):
    """Evaluations by a reward server (its own store and settings), `concurrency` batch requests in flight.
    Tasks the server cannot know by id (built from a dataset's reference column) travel with their source."""

    def __init__(self, client: RewardClient, config: EvalConfig | None = None, *, spec: str = "server",
                 concurrency: int = 4, owns_client: bool = True, **kwargs: Any):
        super().__init__(config or EvalConfig(), **kwargs)
        self.client, self.spec, self.concurrency, self.owns_client = client, spec, max(1, concurrency), owns_client

    def _item(self, task: Task, source: str) -> dict[str, Any]:
        extra = {"reference_source": task.source} if task.origin == "dataset" else {}
        return {"task_id": task.id, "source": source, "label": self.label, **extra}

    def _evaluate(self, items, record, should_stop, on_build, force) -> None:  # type: ignore[no-untyped-def]
        size = max(1, int(getattr(self.client, "batch_size", 16)))
        chunks = [list(range(start, min(start + size, len(items)))) for start in range(0, len(items), size)]

        def one(chunk: list[int]) -> None:
            if should_stop is not None and should_stop():
                return
            try:
                answers = self.client.evaluate_batch([self._item(*items[i]) for i in chunk])
            except Exception as exc:  # noqa: BLE001 - a failed request costs its own items only
                logger.warning("reward server request failed: %s", exc)
                answers = [infra_result(items[i][0], exc) for i in chunk]
            for i, result in zip(chunk, answers, strict=True):
                record(i, result)

        with concurrent.futures.ThreadPoolExecutor(self.concurrency, thread_name_prefix="cudal1-server") as threads:
            list(threads.map(one, chunks))

    def close(self) -> None:
        if self.owns_client:
            self.client.close()


class FunctionEvaluator(Evaluator):
    """A plain function `(task, source) -> EvalResult` (tests, custom evaluators), `concurrency` calls at once;
    a call that raises gives that candidate `infra_error`."""

    def __init__(self, fn: Callable[[Task, str], EvalResult], config: EvalConfig | None = None, *,
                 concurrency: int = 1, **kwargs: Any):
        super().__init__(config or EvalConfig(), **kwargs)
        self.fn, self.spec, self.concurrency = fn, "function", max(1, concurrency)

    def __call__(self, task: Task, source: str) -> EvalResult:
        return self._counted(self.fn(task, source))

    def _evaluate(self, items, record, should_stop, on_build, force) -> None:  # type: ignore[no-untyped-def]
        def one(i: int) -> None:
            if should_stop is not None and should_stop():
                return
            task, source = items[i]
            try:
                result = self.fn(task, source)
            except Exception as exc:  # noqa: BLE001 - the evaluator's failure costs that candidate only
                logger.warning("evaluation of a candidate for %s raised", task.id, exc_info=True)
                result = infra_result(task, exc)
            record(i, result)

        if self.concurrency == 1 or len(items) == 1:
            for i in range(len(items)):
                one(i)
            return
        with concurrent.futures.ThreadPoolExecutor(self.concurrency, thread_name_prefix="cudal1-eval") as threads:
            list(threads.map(one, range(len(items))))


def make_evaluator(spec: str, config: EvalConfig, *, store: Any = None, label: str = "", run_id: str | None = None,
                   pool: Any = None, concurrency: int = 4) -> Evaluator:
    """The evaluator of `spec` (`EVALUATOR_SPECS`), or over `pool` when one is given (which the caller keeps
    and closes). A reward server evaluates task ids it knows (built-in and release tasks; its own store and
    settings) and takes no reference code from here except for dataset tasks; `concurrency` is the number of
    its requests in flight."""
    settings = {"store": store, "label": label, "run_id": run_id}
    if pool is not None:
        return PoolEvaluator(pool, config, owns_pool=False, **settings)
    spec = (spec or "").strip()
    if not is_evaluator_spec(spec):
        raise ConfigError(f"unknown evaluator {spec!r}: use {EVALUATOR_SPECS}")
    if spec in ("", "inprocess"):
        return InProcessEvaluator(config, **settings)
    if spec.startswith(("http://", "https://")):
        client = RewardClient(spec, token=os.environ.get(ENV_TOKEN) or None)
        return ServerEvaluator(client, config, spec=spec, concurrency=concurrency, **settings)
    return PoolEvaluator(make_pool(spec, config, store=store), config, spec=spec, **settings)


def as_evaluator(obj: Any, config: EvalConfig | None = None, *, concurrency: int = 1, label: str = "") -> Evaluator:
    """An `Evaluator` over what a caller holds: an `Evaluator` (itself), a pool (`submit`), a `RewardClient`
    (`evaluate_batch`), or a function `(task, source) -> EvalResult`. The caller keeps and closes `obj`."""
    if isinstance(obj, Evaluator):
        return obj
    if hasattr(obj, "submit") and hasattr(obj, "n_devices"):
        return PoolEvaluator(obj, config, owns_pool=False, label=label)
    if isinstance(obj, RewardClient) or hasattr(obj, "evaluate_batch"):
        return ServerEvaluator(obj, config, concurrency=concurrency, owns_client=False, label=label)
    if callable(obj):
        return FunctionEvaluator(obj, config, concurrency=concurrency, label=label)
    raise TypeError("an evaluator is an Evaluator, a pool (submit), a RewardClient or a function (task, source)")
