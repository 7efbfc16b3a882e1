"""`make_evaluator`: one `(task, source) -> EvalResult` over this process, a local pool and a reward server,
as the training stages use it (`train rl --set workers=...`)."""

from __future__ import annotations

import concurrent.futures

import _service_fakes as fakes
import pytest
from _server_utils import TOKEN, running_server
from _service_fakes import FAST_CONFIG, TINY_CANDIDATE, fake_evaluate, fake_source, tiny_task

from cudal1.core.errors import ConfigError
from cudal1.core.types import Status
from cudal1.service.evaluator import make_evaluator
from cudal1.service.pool import LocalPool, LocalPoolConfig
from cudal1.store import ResultsStore
from cudal1.tasks import load_tasks
from cudal1.train.common import evaluate_batch

pytestmark = pytest.mark.usefixtures("fresh_fakes")


@pytest.mark.parametrize("spec", ["", "local"])
def test_this_process_and_a_local_pool_give_real_verdicts_and_store_them(spec, tmp_path):
    store = ResultsStore(tmp_path / "s.sqlite")
    evaluator = make_evaluator(spec, FAST_CONFIG, store=store, label="rl")
    try:
        with concurrent.futures.ThreadPoolExecutor(2) as threads:  # the reward's eval_threads
            results = list(threads.map(lambda src: evaluator(tiny_task(), src), [TINY_CANDIDATE, "x = ("]))
    finally:
        evaluator.close()
    assert [r.status for r in results] == [Status.CORRECT, Status.COMPILE_ERROR]
    assert sorted(r["status"] for r in store.query_evaluations(label="rl")) == ["compile_error", "correct"]


def test_a_reward_server_evaluates_the_task_ids_it_knows(monkeypatch):
    monkeypatch.setenv("CUDAL1_SERVER_TOKEN", TOKEN)
    task = load_tasks("builtin")[0]
    pool = LocalPool(FAST_CONFIG, LocalPoolConfig(cpu_slots=2), evaluate_fn=fake_evaluate)
    with running_server(pool) as (url, _):
        evaluator = make_evaluator(url, FAST_CONFIG, label="rl")
        results = evaluate_batch(evaluator, [(task, fake_source(speedup=s)) for s in (2, 3)] + [(task, None)], 2)
        evaluator.close()
    pool.close()
    assert [r.speedup for r in results[:2]] == [2.0, 3.0] and results[2].status is Status.UNPARSEABLE
    assert fakes.CALLS  # evaluated by the server's pool, not here


def test_an_evaluator_failure_is_infrastructure_not_the_candidate_s_error():
    def down(task, source):
        raise ConnectionError("reward server unreachable")

    (result,) = evaluate_batch(down, [(tiny_task(), TINY_CANDIDATE)], 1)
    assert result.status is Status.INFRA_ERROR and "unreachable" in result.message


def test_an_unknown_spec_is_a_clear_error():
    with pytest.raises(ConfigError, match="unknown evaluator 'gpu-farm'"):
        make_evaluator("gpu-farm", FAST_CONFIG)


@pytest.mark.parametrize("spec", ["", "local"])
def test_a_batch_comes_back_in_input_order_with_every_result_reported(spec, tmp_path):
    store = ResultsStore(tmp_path / "s.sqlite")
    seen = []
    with make_evaluator(spec, FAST_CONFIG, store=store, label="batch") as evaluator:
        results = evaluator.evaluate([(tiny_task(), "x = ("), (tiny_task(), TINY_CANDIDATE)],
                                     on_result=lambda i, r: seen.append((i, r.status)))
        assert evaluator.evaluated == 2
    assert [r.status for r in results] == [Status.COMPILE_ERROR, Status.CORRECT]
    assert sorted(seen) == [(0, Status.COMPILE_ERROR), (1, Status.CORRECT)]
    assert len(store.query_evaluations(label="batch")) == 2


def test_an_unreachable_server_costs_infra_errors_not_the_batch():
    with make_evaluator("http://127.0.0.1:9", FAST_CONFIG) as evaluator:
        evaluator.client.max_retries = 0
        results = evaluator.evaluate([(tiny_task(), TINY_CANDIDATE)] * 3)
    assert [r.status for r in results] == [Status.INFRA_ERROR] * 3


def test_as_evaluator_takes_a_pool_or_a_function():
    from cudal1.service.evaluator import PoolEvaluator, as_evaluator

    pool = LocalPool(FAST_CONFIG, LocalPoolConfig(cpu_slots=2), evaluate_fn=fake_evaluate)
    try:
        over_pool = as_evaluator(pool)
        assert isinstance(over_pool, PoolEvaluator)
        results = over_pool.evaluate([(tiny_task(), fake_source(speedup=s)) for s in (2, 4)])
        assert [r.speedup for r in results] == [2.0, 4.0]
    finally:
        pool.close()
    calls = []
    over_fn = as_evaluator(lambda task, source: calls.append(source) or fakes.fake_evaluate(task, source, FAST_CONFIG),
                           concurrency=2)
    assert [r.speedup for r in over_fn.evaluate([(tiny_task(), fake_source(speedup=3))] * 2)] == [3.0, 3.0]
    assert len(calls) == 2


@pytest.mark.parametrize("spec", ["", "local"])
def test_a_source_over_the_size_limit_in_a_batch_costs_its_item_only_with_no_traceback(spec, tmp_path, caplog):
    """A batch whose one task had a 5 MB reference, beside normal ones, logged a 40-line traceback ("the evaluator
    inprocess failed on a batch of 2") and failed every item with the runner channel's ProtocolError. Over the
    size limit of a source, an item is refused before anything runs: its reference's (infra_error, the task's
    doing) or the candidate's (unparseable); the others are evaluated."""
    from cudal1.tasks.task import MAX_SOURCE_BYTES, Task

    over = "#" * (MAX_SOURCE_BYTES + 1)
    big_task = Task(id="test/big", source=tiny_task().source + over)
    evaluator = make_evaluator(spec, FAST_CONFIG, store=ResultsStore(tmp_path / "s.sqlite"))
    try:
        with caplog.at_level("WARNING"):
            results = evaluator.evaluate([(big_task, TINY_CANDIDATE), (tiny_task(), TINY_CANDIDATE + over),
                                          (tiny_task(), TINY_CANDIDATE)])
    finally:
        evaluator.close()
    assert [r.status for r in results] == [Status.INFRA_ERROR, Status.UNPARSEABLE, Status.CORRECT]
    assert "the reference of test/big cannot be evaluated" in results[0].message and "524288" in results[0].message
    assert "the candidate cannot be evaluated: it is" in results[1].message
    assert not [r for r in caplog.records if r.exc_info or "failed on a batch" in r.getMessage()]


def test_evaluator_names_one_thing():
    """`Evaluator` is the evaluator interface (`service.evaluator.Evaluator`) and nothing else: the training
    stages' plain `(task, source) -> EvalResult` type was also called `Evaluator` (now `train.common.EvaluateFn`),
    and `train/common.py` imported the interface as `ServiceEvaluator` to tell the two apart."""
    import ast
    from pathlib import Path

    package = Path(__file__).resolve().parents[2] / "src" / "cudal1"
    defined = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            targets = [node] if isinstance(node, ast.ClassDef) else \
                getattr(node, "targets", [getattr(node, "target", None)])
            names = [getattr(t, "name", None) or getattr(t, "id", None) for t in targets if t is not None]
            if "Evaluator" in names:
                defined.append(str(path.relative_to(package)))
    assert defined == ["service/evaluator.py"], defined
