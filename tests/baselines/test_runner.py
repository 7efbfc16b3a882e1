"""Measuring, caching and attaching baselines (one real CPU evaluation; the rest on a synthetic store)."""

from __future__ import annotations

import pytest

from cudal1.baselines import runner
from cudal1.baselines.runner import (
    BaselineRecord,
    attach_baselines,
    baseline_protocol_version,
    measure_baseline,
    record_from_result,
)
from cudal1.core.errors import ConfigError
from cudal1.core.machine import describe_machine
from cudal1.core.types import EvalResult, Status, TimingStats
from cudal1.eval.config import EvalConfig
from cudal1.store import ResultsStore, environment_key
from cudal1.tasks import Task

TINY = (__import__("pathlib").Path(__file__).parents[1] / "fixtures" / "tasks" / "tiny_scale_add.py").read_text()
FAST = EvalConfig(device="cpu", correctness_trials=2, buckets=3, target_bucket_ms=5.0, warm_buckets=0)


@pytest.fixture
def store(tmp_path):
    with ResultsStore(tmp_path / "s.sqlite") as s:
        yield s


def _timing(speedup: float, ref_ms: float = 1.0) -> TimingStats:
    return TimingStats(ref_ms=ref_ms, candidate_ms=ref_ms / speedup, speedup=speedup, stability=0.0,
                       bucket_speedups=[speedup])


def _put(store, task, name, speedup_vs_eager, protocol, status="ok"):
    version = baseline_protocol_version(protocol)
    extra = {"status": status, "speedup_vs_eager": speedup_vs_eager, "reason": "" if status == "ok" else "x"}
    store.put_baseline(task.hash, name, environment_key(describe_machine("cpu")), version, 1.0, extra=extra)


def test_protocol_version_ignores_precision_but_not_meaning():
    base = EvalConfig(device="cpu").resolved("cpu").protocol()
    more_buckets = EvalConfig(device="cpu", buckets=11, correctness_trials=1).resolved("cpu").protocol()
    assert baseline_protocol_version(base) == baseline_protocol_version(more_buckets)
    full = EvalConfig(device="cpu", sizes="full").resolved("cpu").protocol()
    warm = EvalConfig(device="cpu", flush_l2=False).resolved("cpu").protocol()
    assert len({baseline_protocol_version(p) for p in (base, full, warm)}) == 3
    torch_numerics = EvalConfig(device="cpu", profile="cuda-l1").resolved("cpu").protocol()
    assert baseline_protocol_version(torch_numerics) != baseline_protocol_version(base)


@pytest.mark.parametrize("kind", ["tf32", "torch_compile", "cudnn"])
def test_a_baseline_keeps_the_callers_fp32_numerics_under_its_own_profile(kind):
    """tf32 is checked at 1e-2 and torch.compile under `trusted`, but eager must compute as the caller's does."""
    for caller, exact in (("strict", True), ("cuda-l1", False)):
        cfg = runner.baseline_config(EvalConfig(device="cpu", profile=caller), kind)
        assert cfg.uses_exact_fp32 is exact
        assert baseline_protocol_version(cfg.protocol()) == baseline_protocol_version(
            EvalConfig(device="cpu", profile=caller).resolved("cpu").protocol())


def test_a_compiling_baseline_may_take_a_builds_time_in_its_first_call():
    # A cold torch.compile compiles inside the first call; the 30 s step floor is meant for hung candidates.
    caller = EvalConfig(device="cpu", phase_floor_s=30.0, build_timeout_s=700.0)
    assert runner.baseline_config(caller, "torch_compile").phase_floor_s == 700.0
    assert runner.baseline_config(caller, "torch_compile_reduce_overhead").phase_floor_s == 700.0
    assert runner.baseline_config(caller, "eager").phase_floor_s == 30.0
    assert runner.baseline_config(caller, "cuda_graph").phase_floor_s == 30.0


def test_attach_baselines_is_a_ratio_of_paired_ratios(store):
    task = Task(id="t/tiny", source=TINY)
    protocol = FAST.resolved("cpu").protocol()
    _put(store, task, "eager", 1.0, protocol)
    _put(store, task, "torch_compile", 2.0, protocol)
    _put(store, task, "cuda_graph", 0.5, protocol)
    _put(store, task, "cudnn", None, protocol, status="failed")
    result = EvalResult(status=Status.CORRECT, speedup=3.0, timing=_timing(3.0), protocol=protocol,
                        environment=describe_machine("cpu"))
    attached = attach_baselines(result, task, store)
    assert attached.baselines == {"torch_compile": 1.5, "cuda_graph": 6.0}
    other = Task(id="t/other", source=TINY + "\n# changed\n")
    assert attach_baselines(result, other, store).baselines == {}
    failed = EvalResult(status=Status.INCORRECT, protocol=protocol, environment=describe_machine("cpu"))
    assert attach_baselines(failed, task, store) is failed


def test_failed_evaluation_becomes_a_failed_record_with_its_reason():
    task = Task(id="t/tiny", source=TINY)
    result = EvalResult(status=Status.RUNTIME_ERROR, message="forward raised CudaGraphCaptureError: CUDA graph "
                        "capture is illegal for this task: operation not permitted when stream is capturing\nmore")
    record = record_from_result(task, "cuda_graph", result, "strict")
    assert not record.ok and record.ms is None
    assert record.reason.startswith("runtime_error: forward raised CudaGraphCaptureError")
    assert "more" not in record.reason


def test_cuda_only_kind_on_cpu_is_cached_as_failed_without_evaluating(store, monkeypatch):
    def boom(*args, **kwargs):
        raise AssertionError("must not evaluate")
    monkeypatch.setattr(runner, "evaluate_baseline_source", boom)
    task = Task(id="t/tiny", source=TINY)
    record = measure_baseline(task, "cuda_graph", FAST, store=store)
    assert record.reason == "cuda_graph needs a CUDA device" and not record.ok
    again = measure_baseline(task, "cuda_graph", FAST, store=store)
    assert again.cached and again.reason == record.reason


def test_eager_baseline_through_the_real_pipeline_is_cached(store, monkeypatch):
    task = Task(id="t/tiny", source=TINY)
    record = measure_baseline(task, "eager", FAST, store=store)
    assert record.ok, record.reason
    assert record.ms > 0 and record.ref_ms > 0
    assert record.speedup_vs_eager == 1.0 and record.measured_speedup > 0
    assert store.query_evaluations(label="baseline:eager")[0]["status"] == "correct"
    monkeypatch.setattr(runner, "evaluate_baseline_source", lambda *a, **k: pytest.fail("re-evaluated"))
    cached = measure_baseline(task, "eager", FAST, store=store)
    assert cached.cached and cached.ms == pytest.approx(record.ms)
    assert isinstance(BaselineRecord.from_store(task.hash, "eager", {"ms": 1.0, "extra": {}}), BaselineRecord)


@pytest.mark.slow
def test_torch_compile_baseline_on_cpu_is_correct_and_raises_no_guard(store):
    task = Task(id="t/tiny", source=TINY)
    record = measure_baseline(task, "torch_compile", FAST, store=store)
    assert record.ok, record.reason
    flags = store.query_evaluations(label="baseline:torch_compile")[0]["result"]["flags"]
    assert record.profile == "trusted"  # strict tolerances; inductor's cold-cache helper thread only warns
    assert all(f["rule"].startswith("guard.") for f in flags), flags


def test_pending_compile_kinds_are_warmed_together_after_the_quick_kinds(store, monkeypatch):
    # Kinds without compilation are measured for every task first; torch.compile kinds not yet cached then
    # compile once in parallel workers before their serial timed runs.

    tasks = [Task(id=f"t/tiny{i}", source=TINY + f"\n# {i}\n") for i in range(3)]
    cfg = runner.baseline_config(FAST, "torch_compile")
    env_key, version = runner._cache_coordinates(cfg)
    store.put_baseline(tasks[0].hash, "torch_compile", env_key, version, 1.0, extra={})  # cached: not warmed
    events = []
    monkeypatch.setattr(runner, "warm_compile_caches", lambda pairs, c, **kw: events.append(
        ("warm", [(t.id, k) for t, k in pairs], c.device, c.skip_static)))
    monkeypatch.setattr(runner, "measure_baseline", lambda task, kind, *a, **k: events.append((task.id, kind))
                        or f"{task.id}:{kind}")
    records = runner.ensure_baselines(tasks, ["torch_compile", "eager"], FAST, store=store)
    assert events == [("t/tiny0", "eager"), ("t/tiny1", "eager"), ("t/tiny2", "eager"),
                      ("warm", [("t/tiny1", "torch_compile"), ("t/tiny2", "torch_compile")], "cpu", True),
                      ("t/tiny0", "torch_compile"), ("t/tiny1", "torch_compile"), ("t/tiny2", "torch_compile")]
    assert records == [f"t/tiny{i}:{k}" for i in range(3) for k in ("torch_compile", "eager")]  # (task, kind)
    events.clear()
    runner.ensure_baselines(tasks[:2], ["eager", "torch_compile"], FAST, store=store)
    assert not [e for e in events if e[0] == "warm"]  # a single pending compile gains nothing from a warm-up


def test_a_stop_during_the_quick_kinds_skips_the_compile_warm_up(store, monkeypatch):

    tasks = [Task(id=f"t/tiny{i}", source=TINY + f"\n# {i}\n") for i in range(3)]
    events = []
    monkeypatch.setattr(runner, "warm_compile_caches", lambda pairs, c, **kw: events.append("warm"))
    monkeypatch.setattr(runner, "measure_baseline", lambda task, kind, *a, **k: events.append((task.id, kind)))
    runner.ensure_baselines(tasks, ["eager", "torch_compile"], FAST, store=store,
                            should_stop=lambda: len(events) >= 2)
    assert events == [("t/tiny0", "eager"), ("t/tiny1", "eager")]


def test_repeated_kinds_are_measured_once_and_a_stop_in_the_compile_half_keeps_order(store, monkeypatch):

    tasks = [Task(id=f"t/tiny{i}", source=TINY + f"\n# {i}\n") for i in range(2)]
    events = []
    monkeypatch.setattr(runner, "warm_compile_caches", lambda pairs, c, **kw: events.append("warm"))
    monkeypatch.setattr(runner, "measure_baseline", lambda task, kind, *a, **k: events.append((task.id, kind))
                        or f"{task.id}:{kind}")
    records = runner.ensure_baselines(tasks, ["torch_compile", "eager", "eager", "cuda_graph"], FAST, store=store,
                                      should_stop=lambda: len(events) >= 6)
    # eager and cuda_graph for both tasks, the warm-up, then one compile before the stop.
    assert events == [("t/tiny0", "eager"), ("t/tiny0", "cuda_graph"), ("t/tiny1", "eager"),
                      ("t/tiny1", "cuda_graph"), "warm", ("t/tiny0", "torch_compile")]
    assert records == ["t/tiny0:torch_compile", "t/tiny0:eager", "t/tiny0:cuda_graph", "t/tiny1:eager",
                       "t/tiny1:cuda_graph"]
    with pytest.raises(ConfigError, match="unknown baseline kind"):
        runner.ensure_baselines(tasks, ["eager", "torch_compiled"], FAST, store=store)


def test_warm_up_stops_when_asked(caplog):
    from cudal1.baselines.warm import SKIPPED, warm_compile_caches

    pairs = [(Task(id="t/tiny", source=TINY), "torch_compile"), (Task(id="t/tiny", source=TINY), "eager")]
    with caplog.at_level("INFO", logger="cudal1.baselines.warm"):
        done = warm_compile_caches(pairs, runner.baseline_config(FAST, "torch_compile"), should_stop=lambda: True)
    assert done == {("t/tiny", "torch_compile"): SKIPPED}  # eager has nothing to compile
    assert "0 of 1 baseline(s)" in caplog.text and "(0 failed, 1 skipped: stopped)" in caplog.text


@pytest.mark.slow
def test_warm_up_compiles_each_pending_baseline_in_a_worker():
    from cudal1.baselines.warm import warm_compile_caches

    tasks = [Task(id=f"t/tiny{i}", source=TINY + f"\n# {i}\n") for i in range(2)]
    done = warm_compile_caches([(t, "torch_compile_reduce_overhead") for t in tasks],
                               runner.baseline_config(FAST, "torch_compile"), parallel=2)
    assert set(done) == {("t/tiny0", "torch_compile_reduce_overhead"), ("t/tiny1", "torch_compile_reduce_overhead")}
    assert all(isinstance(v, float) and v > 0 for v in done.values()), done
