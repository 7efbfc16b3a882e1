"""Re-check of outlier speedups on a second device, with a scripted pool (cudal1.service.recheck)."""

from __future__ import annotations

from concurrent.futures import Future

import pytest
from _service_fakes import FAST_CONFIG, tiny_task

from cudal1.core.types import EvalResult, Severity, Status
from cudal1.service.pool import PoolFuture
from cudal1.service.recheck import RecheckConfig, RecheckingPool, combine, needs_recheck, recheck_result
from cudal1.store import ResultsStore


def _correct(speedup: float, **kw) -> EvalResult:
    return EvalResult(status=Status.CORRECT, speedup=speedup, task_id="test/add", **kw)


class ScriptedPool:
    """Answers from a per-slot table of speedups (or statuses); records every submission."""

    def __init__(self, per_slot: list, n_devices: int | None = None):
        self.per_slot = per_slot
        self.n_devices = n_devices if n_devices is not None else len(per_slot)
        self.calls: list[dict] = []
        self.config = FAST_CONFIG
        self.queue_depth = 0

    def submit(self, task, source, config=None, *, force=False, label="", run_id=None, block=True,
               avoid_slot=None) -> PoolFuture:
        slot = next(i for i in range(len(self.per_slot)) if i != avoid_slot)
        self.calls.append({"slot": slot, "force": force, "avoid_slot": avoid_slot, "label": label})
        value = self.per_slot[slot]
        fut = PoolFuture()
        fut.slot = slot
        result = value if isinstance(value, EvalResult) else _correct(value)
        fut.set_result(result.replace(environment={"gpu_name": "fake", "device_type": "cuda"},
                                      protocol={"device": f"cuda:{slot}"}))
        return fut

    def close(self):
        pass


@pytest.mark.parametrize(("speedup", "best", "expected"), [
    (3.5, None, True),    # above 3x
    (2.9, None, False),   # below 3x, nothing known
    (2.5, 1.2, True),     # above 2x the best so far
    (2.3, 1.2, False),
    (10.0, 8.0, True),    # above 3x even if close to the best
])
def test_needs_recheck_thresholds(speedup, best, expected):
    assert needs_recheck(_correct(speedup), best) is expected


def test_failures_and_cached_results_are_not_rechecked():
    assert not needs_recheck(EvalResult(status=Status.INCORRECT), None)
    assert not needs_recheck(_correct(9.0, cached=True), None)
    assert needs_recheck(_correct(2.5), None, threshold=2.0)


def test_combine_agreement_keeps_the_smaller_speedup():
    out = combine(_correct(4.0), _correct(3.8))
    assert out.status is Status.CORRECT and out.speedup == 3.8
    assert [f.rule for f in out.flags] == ["recheck.agree"] and out.flags[0].severity is Severity.INFO


def test_combine_disagreement_is_rejected_with_both_numbers():
    out = combine(_correct(4.0), _correct(3.5))  # 14% apart
    assert out.status is Status.HACK_DETECTED and out.speedup is None
    flag = out.flags[-1]
    assert flag.rule == "recheck.disagree" and flag.severity is Severity.ERROR
    assert "4.000x" in out.message and "3.500x" in out.message


def test_combine_failed_recheck_returns_its_verdict():
    second = EvalResult(status=Status.INCORRECT, message="output 0 differs")
    out = combine(_correct(5.0), second)
    assert out.status is Status.INCORRECT and out.flags[-1].rule == "recheck.failed"
    assert "output 0 differs" in out.message


def test_recheck_runs_forced_on_another_slot():
    pool = ScriptedPool([5.0, 5.2])
    out = recheck_result(pool, tiny_task(), "src", _correct(5.0), slot=0)
    assert out.status is Status.CORRECT and out.speedup == 5.0
    assert pool.calls == [{"slot": 1, "force": True, "avoid_slot": 0, "label": "recheck"}]


def test_one_device_pool_leaves_the_result_alone():
    pool = ScriptedPool([9.0])
    out = recheck_result(pool, tiny_task(), "src", _correct(9.0), slot=0)
    assert out == _correct(9.0) and pool.calls == []


def test_rechecking_pool_rejects_a_non_reproducible_outlier_and_stores_it(tmp_path):
    inner = ScriptedPool([6.0, 2.0])  # slot 0 measures 6x, slot 1 only 2x
    with ResultsStore(tmp_path / "r.sqlite") as store:
        with RecheckingPool(inner, RecheckConfig(), store=store) as pool:
            out = pool.submit(tiny_task(), "cand").result(10)
            assert out.status is Status.HACK_DETECTED and out.flags[-1].rule == "recheck.disagree"
            assert [c["slot"] for c in inner.calls] == [0, 1]
            assert pool.best_so_far("test/add") is None  # a rejected result is not the best
        rows = store.query_evaluations(task_id="test/add")
    assert [r["status"] for r in rows] == ["hack_detected"]


def test_rechecking_pool_uses_the_best_so_far():
    inner = ScriptedPool([1.2, 1.2])
    with RecheckingPool(inner) as pool:
        assert pool.submit(tiny_task(), "a").result(10).speedup == 1.2
        inner.per_slot = [2.6, 2.6]  # > 2 x 1.2: re-checked (agrees)
        out = pool.submit(tiny_task(), "b").result(10)
    assert out.flags[-1].rule == "recheck.agree"
    assert [c["force"] for c in inner.calls] == [False, False, True]


def test_rechecking_pool_never_hangs_on_inner_errors():
    class Broken(ScriptedPool):
        def submit(self, *a, **kw):
            fut = Future()
            fut.set_exception(RuntimeError("inner failed"))
            return fut

    with RecheckingPool(Broken([1.0, 1.0])) as pool:
        with pytest.raises(RuntimeError, match="inner failed"):
            pool.submit(tiny_task(), "a").result(10)


def test_recheck_config_validates():
    with pytest.raises(ValueError):
        RecheckConfig(tolerance=-1)
