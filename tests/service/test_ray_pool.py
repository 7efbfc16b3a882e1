"""The Ray pool on a local cluster with two declared (fake) GPUs; actors evaluate on cpu (cudal1.service.ray_pool).

One cluster and one pool serve every test of this module (Ray startup costs 10-20 s on 2 cores).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from _service_fakes import FAST_CONFIG, TINY_CANDIDATE, fake_evaluate, fake_source, tiny_task

from cudal1.core.types import Status
from cudal1.store import ResultsStore

ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'cudal1[dist]')")

from cudal1.service.pool import EvaluatorPool, PoolBusyError  # noqa: E402
from cudal1.service.ray_pool import RayPool, RayPoolConfig  # noqa: E402

SRC = str(Path(__file__).resolve().parents[2] / "src")


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, num_gpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join([SRC, str(Path(__file__).parent)])}})
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def pool(cluster):
    cfg = RayPoolConfig(n_actors=2, device="cpu", num_gpus_per_actor=1, num_cpus_per_actor=0.5,
                        max_in_flight_per_actor=2, max_queue=16, max_retries=1)
    p = RayPool(FAST_CONFIG, cfg, evaluate_fn=fake_evaluate)
    yield p
    p.close()


def _wait_ready(pool, timeout_s=120):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if all(pool.slot_info(i) for i in range(pool.n_devices)):
            return
        time.sleep(0.1)
    raise AssertionError("actors did not start")


def test_one_actor_per_fake_gpu(pool):
    assert isinstance(pool, EvaluatorPool) and pool.n_devices == 2
    _wait_ready(pool)
    task = tiny_task()
    futures = [pool.submit(task, fake_source(sleep=0.2, speedup=2 + i)) for i in range(6)]
    results = [f.result(120) for f in futures]
    assert [r.speedup for r in results] == [2.0, 3.0, 4.0, 5.0, 6.0, 7.0]
    assert {f.slot for f in futures} == {0, 1}
    visible = {pool.slot_info(i)["visible_devices"] for i in range(2)}
    assert visible == {"0", "1"}  # Ray gave each actor its own (declared) GPU
    assert all(r.environment["device_type"] == "cpu" for r in results)


def test_killed_actor_is_replaced_and_its_items_retried(pool):
    _wait_ready(pool)
    task = tiny_task()
    before = dict(pool.stats)
    futures = [pool.submit(task, fake_source(sleep=1.0, speedup=3)) for _ in range(4)]
    deadline = time.monotonic() + 30
    while pool.stats["dispatched"] - before["dispatched"] < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)  # the first items are running now
    ray.kill(pool.actor(0))
    results = [f.result(120) for f in futures]
    assert all(r.status is Status.CORRECT for r in results), [r.message for r in results]
    assert pool.stats["retries"] > before["retries"]
    assert pool.stats["actor_restarts"] > before["actor_restarts"]


def test_item_that_keeps_killing_its_actor_fails_after_retries(pool):
    """The crasher fails after max_retries deaths; neighbours that shared its actor are retried alone."""
    _wait_ready(pool)
    task = tiny_task()
    doomed = pool.submit(task, fake_source(die=1))
    neighbours = [pool.submit(task, fake_source(sleep=0.3)) for _ in range(5)]
    bad = doomed.result(120)
    assert bad.status is Status.RUNTIME_ERROR and "died 2 time(s)" in bad.message
    assert all(f.result(120).status is Status.CORRECT for f in neighbours)
    assert pool.submit(task, fake_source()).result(120).status is Status.CORRECT  # the pool still works


def test_back_pressure_refuses_beyond_the_bound(pool):
    _wait_ready(pool)
    task = tiny_task()
    futures, refused = [], 0
    for _ in range(40):  # 4 in flight + 16 queued fit; the rest are refused without blocking
        try:
            futures.append(pool.submit(task, fake_source(sleep=0.2), block=False))
        except PoolBusyError:
            refused += 1
    assert refused > 0 and len(futures) >= 16
    assert all(f.result(120).status is Status.CORRECT for f in futures)


def test_driver_writes_the_store_and_reuses_it(pool, tmp_path):
    _wait_ready(pool)
    task, source = tiny_task(), fake_source(speedup=4)
    with ResultsStore(tmp_path / "r.sqlite") as store:
        pool.store = store
        try:
            first = pool.submit(task, source, label="ray").result(120)
            again = pool.submit(task, source).result(120)
        finally:
            pool.store = None
        rows = store.query_evaluations(task_id="test/add")
    assert not first.cached and again.cached and again.speedup == 4.0
    assert len(rows) == 1 and rows[0]["label"] == "ray"


def test_real_evaluation_in_an_actor(pool):
    """No fake directive: the actor runs `evaluate_candidate` (isolated child) on the tiny task."""
    result = pool.submit(tiny_task(), TINY_CANDIDATE).result(180)
    assert result.status is Status.CORRECT, result.message
    assert result.environment["gpu_name"] == "cpu"



def test_actors_that_cannot_start_fail_the_items_with_the_reason(cluster):
    # Actors for `cuda` on a machine without CUDA die in their first call; the pool must not replace
    # them forever (every caller would hang) but resolve the items with the actor's error.
    cfg = RayPoolConfig(n_actors=1, device="cuda", num_gpus_per_actor=0, num_cpus_per_actor=0)
    with RayPool(FAST_CONFIG, cfg, evaluate_fn=fake_evaluate) as broken:
        result = broken.submit(tiny_task(), fake_source()).result(120)
        assert result.status is Status.RUNTIME_ERROR
        assert "failed to start 3 times" in result.message and "CUDA" in result.message, result.message
        assert broken.stats["actor_restarts"] == 2


def test_an_actor_no_node_can_host(cluster, caplog):
    # 2 (fake) GPUs on the one node: an actor asking for 3 would wait forever. On a cluster the pool joined
    # (an autoscaler might add a node) that is a warning; on one it started, a ConfigError.
    from cudal1.core.errors import ConfigError

    cfg = RayPoolConfig(n_actors=1, device="cpu", num_gpus_per_actor=3, num_cpus_per_actor=0)
    with caplog.at_level("WARNING", logger="cudal1.service.ray_pool"):
        joined = RayPool(FAST_CONFIG, cfg, evaluate_fn=fake_evaluate)
        joined.close()
    assert "no node can host an actor needing 3 GPU" in caplog.text
    assert ray.is_initialized()  # the cluster it joined is left running
    probe = RayPool.__new__(RayPool)
    probe.ray, probe.pool_config, probe._owns_ray = ray, cfg, True
    with pytest.raises(ConfigError, match="largest node: 2 GPU"):
        probe._check_actor_fits()


def test_stack_watchdog_traces_and_dumps_a_stuck_call(capfd):
    from cudal1.service.ray_pool import stack_watchdog

    with stack_watchdog("quick call"):
        pass
    assert capfd.readouterr().err == ""  # quiet unless asked, or stuck
    with stack_watchdog("slow call", trace=True, after_s=0.2):
        time.sleep(0.5)
    err = capfd.readouterr().err
    assert "cudal1 ray: slow call started" in err and "cudal1 ray: slow call done in" in err
    assert "test_stack_watchdog_traces_and_dumps_a_stuck_call" in err  # the stack of the stuck frame
