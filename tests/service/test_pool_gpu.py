"""Pools on real GPUs (run on the GPU machine; skipped without CUDA)."""

from __future__ import annotations

import pytest

from cudal1.core.types import Status
from cudal1.eval.config import EvalConfig
from cudal1.service.pool import LocalPool
from cudal1.tasks.sources import example_candidates

pytestmark = pytest.mark.gpu


def _pairs(n: int):
    return [(task, source) for task, _, source in example_candidates("cuda", ["torch"])][:n]


def test_local_pool_uses_every_gpu_and_gives_the_same_verdicts():
    import torch

    config = EvalConfig(device="cuda", buckets=3, target_bucket_ms=20, warm_buckets=0)
    pairs = _pairs(4)
    with LocalPool(config) as pool:
        assert pool.devices == [f"cuda:{i}" for i in range(torch.cuda.device_count())]
        futures = [pool.submit(t, s, force=True) for t, s in pairs]
        results = [f.result() for f in futures]
    assert all(r.status is Status.CORRECT for r in results), [r.message for r in results]
    assert {f.slot for f in futures} == set(range(min(len(pairs), torch.cuda.device_count())))


def test_ray_pool_one_actor_per_gpu():
    import torch

    ray = pytest.importorskip("ray")
    from cudal1.service.ray_pool import RayPool, RayPoolConfig

    n = torch.cuda.device_count()
    config = EvalConfig(device="cuda", buckets=3, target_bucket_ms=20, warm_buckets=0)
    with RayPool(config, RayPoolConfig(address=None, n_actors=n, init_kwargs={"num_gpus": n, "log_to_driver": True},
                                       trace_calls=True)) as pool:
        futures = [pool.submit(task, source) for task, source in _pairs(2 * n)]
        results = [f.result(timeout=300) for f in futures]  # a stuck pool fails here, not at the suite's limit
        visible = {pool.slot_info(i)["visible_devices"] for i in range(n)}
    assert not ray.is_initialized()
    assert all(r.status is Status.CORRECT for r in results), [r.message for r in results]
    assert len(visible) == n
