"""Scale-out: evaluator pools (local threads or Ray actors), the reward server and its client, re-checks.

    from cudal1.service import make_pool
    pool = make_pool("local" | "ray:auto" | "ray://HOST:PORT", EvalConfig(), store=store)

The server (`cudal1.service.server`, needs fastapi/uvicorn), the client (`cudal1.service.client`, needs httpx)
and the Ray pool (`cudal1.service.ray_pool`, needs ray) import their optional dependencies only when used.
"""

from cudal1.service.factory import make_pool
from cudal1.service.pool import (
           EvaluatorPool,
           LocalPool,
           LocalPoolConfig,
           PoolBusyError,
           PoolFuture,
)
from cudal1.service.recheck import RecheckConfig, RecheckingPool, needs_recheck

__all__ = ["EvaluatorPool", "LocalPool", "LocalPoolConfig", "PoolBusyError", "PoolFuture", "make_pool",
           "RecheckConfig", "RecheckingPool", "needs_recheck"]
