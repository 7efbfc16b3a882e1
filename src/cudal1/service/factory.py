"""`make_pool`: an evaluator pool from its spec; `make_evaluator`: one `(task, source) -> EvalResult` interface
over this process, a pool and the reward server. Apart from `pool.py` (the interface and the local pool,
which the Ray pool builds on), so that the base module never imports the Ray pool."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from cudal1.core.errors import ConfigError
from cudal1.core.types import EvalResult
from cudal1.eval.config import EvalConfig
from cudal1.eval.pipeline import evaluate_candidate
from cudal1.service.client import ENV_TOKEN, RewardClient
from cudal1.service.pool import EvaluateFn, EvaluatorPool, LocalPool, LocalPoolConfig
from cudal1.tasks.task import Task

#: What `make_evaluator` accepts, for help texts and errors.
EVALUATOR_SPECS = "'' (this process), local, ray:auto, ray://HOST:PORT or http(s)://HOST:PORT (a reward server)"


def is_evaluator_spec(spec: str) -> bool:
    """Whether `make_evaluator` takes `spec` (`EVALUATOR_SPECS`); configs check with it before anything starts."""
    spec = (spec or "").strip()
    return spec in ("", "inprocess", "local", "ray:auto") or spec.startswith(("ray://", "http://", "https://"))


def make_pool(spec: str, config: EvalConfig | None = None, *, store: Any = None,
              evaluate_fn: EvaluateFn | None = None, **options: Any) -> EvaluatorPool:
    """A pool from its spec: `local`, `ray:auto` (join or start a cluster) or `ray://HOST:PORT` (client).

    `options` go to `LocalPoolConfig` or `RayPoolConfig`.
    """
    if spec == "local":
        return LocalPool(config, LocalPoolConfig(**options), store=store, evaluate_fn=evaluate_fn)
    if spec == "ray:auto" or spec.startswith("ray://"):
        from cudal1.service.ray_pool import RayPool, RayPoolConfig  # lazy: `ray` is an optional dependency

        address = "auto" if spec == "ray:auto" else spec
        return RayPool(config, RayPoolConfig(address=address, **options), store=store, evaluate_fn=evaluate_fn)
    raise ConfigError(f"unknown workers spec {spec!r}: use local, ray:auto or ray://HOST:PORT")


class Evaluator:
    """`evaluator(task, source) -> EvalResult` wherever the evaluation runs; `close()` ends what it started.

    Safe to call from several threads: in this process evaluations hold the device one at a time
    (`device_timing_lock`), a pool gives each GPU one timed candidate at a time, a server queues them."""

    def __init__(self, spec: str, call: Callable[[Task, str], EvalResult], close: Callable[[], None] = lambda: None):
        self.spec, self._call, self._close = spec, call, close

    def __call__(self, task: Task, source: str) -> EvalResult:
        return self._call(task, source)

    def close(self) -> None:
        self._close()


def make_evaluator(spec: str, config: EvalConfig, *, store: Any = None, label: str = "",
                   run_id: str | None = None) -> Evaluator:
    """The evaluator of `spec` (`EVALUATOR_SPECS`). A reward server evaluates task ids it knows (built-in and
    release tasks; its own store and settings) and takes no reference code from here."""
    spec = (spec or "").strip()
    if not is_evaluator_spec(spec):
        raise ConfigError(f"unknown evaluator {spec!r}: use {EVALUATOR_SPECS}")
    if spec in ("", "inprocess"):
        return Evaluator("inprocess", lambda task, source: evaluate_candidate(
            task, source, config, store=store, label=label, run_id=run_id))
    if spec.startswith(("http://", "https://")):
        client = RewardClient(spec, token=os.environ.get(ENV_TOKEN) or None)
        return Evaluator(spec, lambda task, source: client.evaluate(task.id, source, label=label), client.close)
    pool = make_pool(spec, config, store=store)  # local, ray:auto or ray://
    return Evaluator(spec, lambda task, source: pool.submit(task, source, label=label, run_id=run_id).result(),
                     pool.close)
