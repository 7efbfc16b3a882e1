"""`make_pool`: an evaluator pool from its spec. Apart from `pool.py` (the interface and the local pool, which
the Ray pool builds on), so that the base module never imports the Ray pool; `evaluator.make_evaluator` is
the interface every caller uses over pools, this process and the reward server."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cudal1.core.errors import ConfigError
from cudal1.eval.config import EvalConfig
from cudal1.service.pool import EvaluateFn, EvaluatorPool, LocalPool, LocalPoolConfig
from cudal1.service.ray_pool import RayPool, RayPoolConfig


def _local_pool(spec: str, config: EvalConfig | None, options: dict[str, Any], **kwargs: Any) -> EvaluatorPool:
    return LocalPool(config, LocalPoolConfig(**options), **kwargs)


def _ray_pool(spec: str, config: EvalConfig | None, options: dict[str, Any], **kwargs: Any) -> EvaluatorPool:
    address = "auto" if spec == "ray:auto" else spec
    return RayPool(config, RayPoolConfig(address=address, **options), **kwargs)


#: Pool makers by spec (`local`) or spec prefix (`ray:auto`, `ray://HOST:PORT`): a new pool is one entry here.
POOLS: dict[str, Callable[..., EvaluatorPool]] = {"local": _local_pool, "ray:": _ray_pool}


def make_pool(spec: str, config: EvalConfig | None = None, *, store: Any = None,
              evaluate_fn: EvaluateFn | None = None, **options: Any) -> EvaluatorPool:
    """A pool from its spec: `local`, `ray:auto` (join or start a cluster) or `ray://HOST:PORT` (client).

    `options` go to `LocalPoolConfig` or `RayPoolConfig`.
    """
    maker = POOLS.get(spec) or next((m for prefix, m in POOLS.items() if prefix.endswith(":")
                                     and spec.startswith(prefix)), None)
    if maker is None:
        raise ConfigError(f"unknown workers spec {spec!r}: use local, ray:auto or ray://HOST:PORT")
    return maker(spec, config, options, store=store, evaluate_fn=evaluate_fn)
