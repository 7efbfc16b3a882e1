"""The local evaluator pool: slots, back-pressure, routing, store as single writer (cudal1.service.pool)."""

from __future__ import annotations

import threading
import time

import _service_fakes as fakes
import pytest
from _service_fakes import FAST_CONFIG, TINY_CANDIDATE, fake_evaluate, fake_source, tiny_task

from cudal1.core.errors import ConfigError
from cudal1.core.types import Status
from cudal1.service.factory import make_pool
from cudal1.service.pool import (
    EvaluatorPool,
    LocalPool,
    LocalPoolConfig,
    PoolBusyError,
    key_protocol,
    local_devices,
)
from cudal1.store import ResultsStore

pytestmark = pytest.mark.usefixtures("fresh_fakes")


def test_map_keeps_order_and_fills_results():
    task = tiny_task()
    sources = [fake_source(speedup=1 + i) for i in range(5)]
    with LocalPool(FAST_CONFIG, LocalPoolConfig(cpu_slots=2), evaluate_fn=fake_evaluate) as pool:
        assert isinstance(pool, EvaluatorPool)
        results = pool.map([(task, s) for s in sources])
    assert [r.speedup for r in results] == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert all(r.status is Status.CORRECT and r.task_id == "test/add" for r in results)
    assert results[0].protocol["device"] == "cpu" and results[0].environment["device_type"] == "cpu"
    assert len({r.candidate_hash for r in results}) == 5


def test_slots_follow_the_evaluations_device_on_any_host():
    # A pool for `device="cpu"` once took every visible GPU as its slots: on a GPU host it evaluated on cuda.
    assert local_devices(LocalPoolConfig(cpu_slots=3), "cpu") == ["cpu"] * 3
    assert local_devices(LocalPoolConfig(devices=("cuda:1",), cpu_slots=3), "cpu") == ["cuda:1"]
    import torch

    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="no CUDA GPU"):
            local_devices(LocalPoolConfig(), "cuda:0")
        with pytest.raises(ConfigError, match="no CUDA GPU"):
            local_devices(LocalPoolConfig(), "cuda")
        assert local_devices(LocalPoolConfig(cpu_slots=2), "auto") == ["cpu", "cpu"]
    else:
        assert local_devices(LocalPoolConfig(), "cuda:0") == ["cuda:0"]


def test_slots_run_concurrently():
    task = tiny_task()
    with LocalPool(FAST_CONFIG, LocalPoolConfig(cpu_slots=3), evaluate_fn=fake_evaluate) as pool:
        pool.map([(task, fake_source(sleep=0.3)) for _ in range(6)])
    assert fakes.max_concurrency() == 3


def test_submit_blocks_or_refuses_when_the_queue_is_full():
    task = tiny_task()
    with LocalPool(FAST_CONFIG, LocalPoolConfig(cpu_slots=1, max_queue=1), evaluate_fn=fake_evaluate) as pool:
        running = pool.submit(task, fake_source(gate=1))
        deadline = time.monotonic() + 10
        while pool.queue_depth and time.monotonic() < deadline:  # wait until the slot took it
            time.sleep(0.01)
        queued = pool.submit(task, fake_source())
        assert pool.queue_depth == 1
        with pytest.raises(PoolBusyError):
            pool.submit(task, fake_source(), block=False)
        blocked = []
        t = threading.Thread(target=lambda: blocked.append(pool.submit(task, fake_source())))
        t.start()
        time.sleep(0.2)
        assert not blocked  # still waiting for room
        fakes.GATE.set()
        t.join(10)
        assert blocked and blocked[0].result(10).status is Status.CORRECT
        assert running.result(10).status is Status.CORRECT and queued.result(10).status is Status.CORRECT


def test_avoid_slot_routes_to_another_slot():
    task = tiny_task()
    cfg = LocalPoolConfig(devices=("cpu", "cpu", "cpu"))
    with LocalPool(FAST_CONFIG, cfg, evaluate_fn=fake_evaluate) as pool:
        futures = [pool.submit(task, fake_source(sleep=0.02), avoid_slot=1) for _ in range(6)]
        slots = {f.result(10) and f.slot for f in futures}
    assert 1 not in slots and slots <= {0, 2}


def test_evaluator_exception_becomes_runtime_error_and_slot_survives():
    def broken(task, source, config):
        if "boom" in source:
            raise RuntimeError("boom")
        return fake_evaluate(task, source, config)

    with LocalPool(FAST_CONFIG, LocalPoolConfig(cpu_slots=1), evaluate_fn=broken) as pool:
        bad = pool.submit(tiny_task(), "boom").result(10)
        good = pool.submit(tiny_task(), fake_source()).result(10)
    assert bad.status is Status.RUNTIME_ERROR and "boom" in bad.message
    assert good.status is Status.CORRECT


def test_the_one_slot_survives_what_used_to_kill_it():
    """A lone surrogate (valid JSON, not UTF-8) made hashing raise on the failure path too, and the only slot
    thread died: no later job was ever answered. So did an exception whose own message fails."""
    class Unprintable(RuntimeError):
        def __str__(self):
            raise ValueError("no message")

    def broken(task, source, config):
        if "unprintable" in source:
            raise Unprintable()
        return fake_evaluate(task, source, config)

    with LocalPool(FAST_CONFIG, LocalPoolConfig(cpu_slots=1), evaluate_fn=broken) as pool:
        lone = pool.submit(tiny_task(), "x = '\ud800'\n").result(10)
        unprintable = pool.submit(tiny_task(), "unprintable").result(10)
        good = pool.submit(tiny_task(), fake_source()).result(10)
    assert lone.status is Status.UNPARSEABLE and "UTF-8" in lone.message
    assert unprintable.status is Status.RUNTIME_ERROR and "Unprintable" in unprintable.message
    assert good.status is Status.CORRECT and len(fakes.CALLS) == 1  # the unencodable text never ran


def test_a_stuck_slot_is_replaced_and_its_job_answered():
    stuck = threading.Event()

    def hangs(task, source, config):
        if "hang" in source:
            stuck.wait(600)  # only a replacement answers it within the test's limits
        return fake_evaluate(task, source, config)

    pool = LocalPool(FAST_CONFIG, LocalPoolConfig(cpu_slots=1, stuck_after_s=1.0), evaluate_fn=hangs)
    try:
        started = time.monotonic()
        hung = pool.submit(tiny_task(), "hang").result(120)
        assert hung.status is Status.INFRA_ERROR and "replaced" in hung.message  # not the stuck call's answer
        assert time.monotonic() - started < 120
        after = pool.submit(tiny_task(), fake_source()).result(10)  # the replacement slot serves
        assert after.status is Status.CORRECT
        assert pool.health()["replaced_slots"] == 1
    finally:
        stuck.set()
        pool.close()


def test_store_is_written_by_the_pool_and_reused(tmp_path):
    task, source = tiny_task(), fake_source(speedup=2.5)
    with ResultsStore(tmp_path / "r.sqlite") as store:
        with LocalPool(FAST_CONFIG, LocalPoolConfig(cpu_slots=2), store=store, evaluate_fn=fake_evaluate) as pool:
            first = pool.submit(task, source, label="run1").result(10)
            second = pool.submit(task, source).result(10)
            forced = pool.submit(task, source, force=True).result(10)
        rows = store.query_evaluations(task_id="test/add")
    assert not first.cached and second.cached and not forced.cached
    assert second.speedup == 2.5
    assert len(fakes.CALLS) == 2  # the cached one did not run
    assert len(rows) == 2 and rows[0]["label"] == "run1"


def test_key_protocol_ignores_the_gpu_index():
    assert key_protocol(FAST_CONFIG, "cuda:1") == key_protocol(FAST_CONFIG, "cuda:0")
    assert key_protocol(FAST_CONFIG, "cuda:1")["device"] == "cuda"


def test_close_resolves_queued_items():
    pool = LocalPool(FAST_CONFIG, LocalPoolConfig(cpu_slots=1, max_queue=8), evaluate_fn=fake_evaluate)
    running = pool.submit(tiny_task(), fake_source(gate=1))
    queued = [pool.submit(tiny_task(), fake_source()) for _ in range(3)]
    time.sleep(0.1)
    threading.Timer(0.3, fakes.GATE.set).start()
    pool.close()
    assert running.result(10).status is Status.CORRECT
    assert all(f.result(1).status is Status.RUNTIME_ERROR and "closed" in f.result().message for f in queued)


def test_make_pool_specs():
    pool = make_pool("local", FAST_CONFIG, evaluate_fn=fake_evaluate, cpu_slots=2)
    try:
        assert isinstance(pool, LocalPool) and pool.devices == ["cpu", "cpu"] and pool.n_devices == 1
    finally:
        pool.close()
    with pytest.raises(ConfigError, match="workers spec"):
        make_pool("threads", FAST_CONFIG)
    with pytest.raises(ConfigError):
        LocalPoolConfig(max_queue=0)


def test_real_evaluation_through_the_pool(tmp_path):
    """The default evaluator (isolated child) on a tiny task, results stored by the pool."""
    with ResultsStore(tmp_path / "r.sqlite") as store, LocalPool(FAST_CONFIG, store=store) as pool:
        result = pool.submit(tiny_task(), TINY_CANDIDATE).result(120)
        assert result.status is Status.CORRECT, result.message
        assert result.speedup is not None and result.speedup > 0
        assert len(store.query_evaluations(task_id="test/add", status="correct")) == 1


def test_retired_slot_hands_its_lane_to_live_slots():
    from cudal1.service.pool import Job, JobQueue, PoolFuture

    queue = JobQueue(3, capacity=8)

    def job(avoid):
        return Job(tiny_task(), fake_source(), FAST_CONFIG, False, "", None, avoid, PoolFuture())

    queue.put(job(avoid=0))
    queue.put(job(avoid=0))  # lanes 1 and 2, one each (shortest lane first)
    queue.retire(1)
    assert len(queue._lanes[1]) == 0 and len(queue._lanes[2]) == 2  # its job moved to the live slot
    queue.put(job(avoid=0))
    assert len(queue._lanes[2]) == 3  # never to the retired lane
    queue.retire(2)  # no live slot but the avoided one: the jobs still run somewhere rather than never
    assert all(queue.get(0, timeout_s=0) is not None for _ in range(3))
    assert queue.get(0, timeout_s=0) is None


def test_pool_evaluations_reuse_pre_started_runners():
    # The real evaluator as pools call it: the calling thread keeps warm runners ready for its next
    # evaluation, and the slot's end stops it.
    from cudal1.service import pool as pool_mod

    first = pool_mod.default_evaluate(tiny_task(), TINY_CANDIDATE, FAST_CONFIG)
    supply = pool_mod._thread_state.supplies["cpu"]
    assert first.status is Status.CORRECT and supply.n_ready == 2  # the next evaluation's two runners
    spares = list(supply._ready)
    second = pool_mod.default_evaluate(tiny_task(), TINY_CANDIDATE, FAST_CONFIG)
    assert second.status is Status.CORRECT
    assert not set(spares) & set(supply._ready) and supply.n_ready == 2  # the spares ran it; new ones wait
    waiting = list(supply._ready)
    pool_mod.close_thread_supplies()
    assert all(w.proc.wait(timeout=10) is not None for w in waiting)
    assert not hasattr(pool_mod._thread_state, "supplies")


def test_cpu_prebuild_skips_a_build_the_node_already_holds(tmp_path, monkeypatch):
    # A Ray pool's CPU build task ran an import-only build even when the node already held the evaluation's
    # own build (made with the task's init inputs): ~40 s of compile per load_inline item, for nothing.
    from cudal1.eval import compile as compile_mod
    from cudal1.eval.compile import CompileConfig, CompileService, write_marker
    from cudal1.service.ray_pool import prebuild_on_node

    monkeypatch.setenv("CUDAL1_CACHE_DIR", str(tmp_path))
    builds = []
    monkeypatch.setattr(CompileService, "build", lambda self, sources, **kw: builds.append(sources) or
                        [compile_mod.BuildResult(key="k", ok=True, cached=False, seconds=1.0, log="")])
    source = "# load_inline candidate\n"
    service = CompileService(CompileConfig(arch="9.0", device="cuda"))
    write_marker(service.key_for(source, [128]), {"builds": []})
    assert prebuild_on_node(source, "9.0", 60.0, init_inputs=[128]) and builds == []
    assert prebuild_on_node(source, "9.0", 60.0, init_inputs=[64]) and builds == [[source]]


def test_gpu_pool_builds_load_inline_candidates_ahead_of_their_slot(monkeypatch):
    # The build of a queued load_inline candidate starts at submit, so the GPU slot finds it done.
    from cudal1.service import pool as pool_mod

    built = []
    monkeypatch.setattr(pool_mod, "prebuild", lambda items, cfg, **kw: built.extend(items))
    monkeypatch.setattr(pool_mod, "pool_environment", lambda device: {"gpu_name": "test"})
    from cudal1.core.types import EvalResult

    seen = []

    def evaluate(task, source, cfg):
        seen.append(list(built))  # what was built when the slot started this item
        return EvalResult(status=Status.CORRECT, speedup=1.0)

    task, source = tiny_task(), "# load_inline\n" + TINY_CANDIDATE
    with LocalPool(FAST_CONFIG, LocalPoolConfig(devices=("cuda:0",)), evaluate_fn=evaluate) as pool:
        result = pool.submit(task, source).result(timeout=60)
    assert result.status is Status.CORRECT
    assert seen == [[(task, source)]]
