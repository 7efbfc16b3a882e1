"""Tests of `cudal1.store.sqlite_store.ResultsStore`: round trips, cache semantics, queries, runs, meta."""

from __future__ import annotations

import math
import sqlite3
import threading

import pytest
from _store_workers import ENVIRONMENT, PROTOCOL, make_result

from cudal1.core.types import EvalResult, Status
from cudal1.store import ResultsStore, StoreError, environment_key, source_hash


def test_eval_result_round_trip(store, sample_result):
    task_hash = store.put_task(sample_result.task_id, "class Model: pass")
    key = store.eval_key(task_hash, sample_result.candidate_hash, PROTOCOL, ENVIRONMENT)
    row_id = store.put_evaluation(sample_result, task_hash=task_hash, key=key, label="smoke")
    assert row_id >= 1

    got = store.get_evaluation(key)
    assert isinstance(got, EvalResult)
    assert got.cached is True
    assert got == sample_result.replace(cached=True)
    assert got.mismatch.first_bad_index == [1, 2]
    assert got.flags[0].line == 12 and got.flags[1].source == "runtime"


def test_indexed_columns_match_result(store, sample_result):
    task_hash = store.put_task(sample_result.task_id, "class Model: pass")
    store.put_evaluation(sample_result, task_hash=task_hash, key="k", label="lab", run_id="r1")
    (row,) = store.query_evaluations()
    assert row["task_id"] == "level1/1_matmul"
    assert row["task_hash"] == task_hash
    assert row["candidate_hash"] == "cand0000"
    assert row["status"] == "correct"
    assert row["speedup"] == pytest.approx(sample_result.speedup)
    assert row["speedup_warm"] == pytest.approx(1.8)
    assert row["ref_ms"] == pytest.approx(2.0) and row["candidate_ms"] == pytest.approx(1.0)
    assert row["stability"] == pytest.approx(0.03)
    assert row["kernel_class"] == "custom_cuda"
    assert row["gpu_name"] == "NVIDIA H200"
    assert row["protocol_version"] == "3"
    assert (row["label"], row["run_id"], row["key"]) == ("lab", "r1", "k")
    assert row["created_at"].endswith("+00:00")
    assert row["result"] == sample_result.to_dict()


def test_cached_flag_is_not_stored(store, sample_result):
    store.put_evaluation(sample_result.replace(cached=True), task_hash="t", key="k")
    assert store.query_evaluations()[0]["result"]["cached"] is False


def test_cache_hit_and_misses(store, sample_result):
    task_hash = store.put_task("level1/1_matmul", "class Model: pass")
    cand_hash = store.put_candidate("class ModelNew: pass", task_id="level1/1_matmul")
    key, hit = store.lookup(task_hash, cand_hash, PROTOCOL, ENVIRONMENT)
    assert hit is None
    store.put_evaluation(sample_result, task_hash=task_hash, key=key)

    key2, hit = store.lookup(task_hash, cand_hash, dict(reversed(PROTOCOL.items())), dict(ENVIRONMENT))
    assert key2 == key and hit is not None and hit.cached
    assert store.lookup(task_hash, cand_hash, PROTOCOL, ENVIRONMENT, force=True)[1] is None
    assert store.lookup(task_hash, cand_hash, {**PROTOCOL, "buckets": 9}, ENVIRONMENT)[1] is None
    assert store.lookup(task_hash, cand_hash, PROTOCOL, {**ENVIRONMENT, "gpu_name": "NVIDIA A100"})[1] is None
    other_cand = store.put_candidate("class ModelNew: x = 1")
    assert store.lookup(task_hash, other_cand, PROTOCOL, ENVIRONMENT)[1] is None


def test_a_stored_timeout_is_not_reused_for_a_longer_limit(store):
    task_hash = store.put_task("level1/1_matmul", "class Model: pass")
    cand_hash = store.put_candidate("class ModelNew: pass", task_id="level1/1_matmul")
    key, _ = store.lookup(task_hash, cand_hash, PROTOCOL, ENVIRONMENT)
    timed_out = EvalResult(status=Status.TIMEOUT, message="evaluation timed out after 5.1 s",
                           protocol={**PROTOCOL, "time_limit_s": 5.0, "build_time_limit_s": 900.0})
    store.put_evaluation(timed_out, task_hash=task_hash, key=key)
    limits = {"time_limit_s": 5.0, "build_time_limit_s": 900.0}
    assert store.lookup(task_hash, cand_hash, PROTOCOL, ENVIRONMENT, limits=limits)[1].status is Status.TIMEOUT
    assert store.lookup(task_hash, cand_hash, PROTOCOL, ENVIRONMENT, limits={**limits, "time_limit_s": 3.0})[1]
    assert store.lookup(task_hash, cand_hash, PROTOCOL, ENVIRONMENT, limits={**limits, "time_limit_s": 8.0})[1] is None
    assert store.lookup(task_hash, cand_hash, PROTOCOL, ENVIRONMENT,
                        limits={**limits, "build_time_limit_s": 1800.0})[1] is None
    # A timeout stored without its limits (an older version) is evaluated again when limits are given.
    store.put_evaluation(timed_out.replace(protocol=dict(PROTOCOL)), task_hash=task_hash, key=key)
    assert store.lookup(task_hash, cand_hash, PROTOCOL, ENVIRONMENT, limits=limits)[1] is None
    assert store.lookup(task_hash, cand_hash, PROTOCOL, ENVIRONMENT)[1].status is Status.TIMEOUT  # reporting
    # A verdict other than timeout does not depend on the limit.
    store.put_evaluation(timed_out.replace(status=Status.CORRECT), task_hash=task_hash, key=key)
    assert store.lookup(task_hash, cand_hash, PROTOCOL, ENVIRONMENT, limits={**limits, "time_limit_s": 8.0})[1]


def test_latest_evaluation_wins(store):
    first = make_result(1)
    forced = make_result(1, status=Status.INCORRECT)
    store.put_evaluation(first, task_hash="t", key="k")
    store.put_evaluation(forced, task_hash="t", key="k")
    assert store.get_evaluation("k").status is Status.INCORRECT
    assert len(store.query_evaluations(key="k")) == 2


def test_query_filters_and_latest_per_task_candidate(store):
    store.put_evaluation(make_result(1), task_hash="ta", key="a1", label="base", run_id="r1")
    store.put_evaluation(make_result(1, status=Status.INCORRECT), task_hash="ta", key="a1", label="base",
                         run_id="r2")
    store.put_evaluation(make_result(2), task_hash="ta", key="a2", label="base", run_id="r2")
    store.put_evaluation(make_result(3, task_id="other", gpu_name="NVIDIA A100"), task_hash="tb", key="b3",
                         label="other")

    assert len(store.query_evaluations()) == 4
    assert len(store.query_evaluations(task_id="level1/1_matmul")) == 3
    assert len(store.query_evaluations(status="correct")) == 3
    assert len(store.query_evaluations(status=Status.INCORRECT)) == 1
    assert [r["key"] for r in store.query_evaluations(label="other")] == ["b3"]
    assert len(store.query_evaluations(run_id="r2")) == 2
    assert [r["key"] for r in store.query_evaluations(gpu_name="NVIDIA A100")] == ["b3"]

    latest = store.query_evaluations(latest_per_task_candidate=True)
    assert [(r["candidate_hash"], r["status"]) for r in latest] == [
        ("cand0001", "incorrect"), ("cand0002", "correct"), ("cand0003", "correct")]
    # status applies after "latest": the forced failing re-run hides the older success of cand0001
    correct_latest = store.query_evaluations(status="correct", latest_per_task_candidate=True)
    assert [r["candidate_hash"] for r in correct_latest] == ["cand0002", "cand0003"]
    # other filters apply before "latest": within run r1, the older success is the latest
    in_r1 = store.query_evaluations(run_id="r1", latest_per_task_candidate=True)
    assert [r["status"] for r in in_r1] == ["correct"]


def test_tasks_and_candidates_idempotent_and_versioned(store):
    h1 = store.put_task("t1", "v1 source", level=1, origin="kernelbench", meta={"n": 1})
    assert h1 == source_hash("v1 source")
    assert store.put_task("t1", "v1 source", level=2) == h1  # idempotent: first write kept
    assert store.get_task("t1")["level"] == 1
    h2 = store.put_task("t1", "v2 source", level=1)
    assert h2 != h1
    assert store.task_versions("t1") == [h1, h2]
    assert store.get_task("t1")["source"] == "v2 source"
    old = store.get_task("t1", h1)
    assert old["source"] == "v1 source" and old["meta"] == {"n": 1} and old["origin"] == "kernelbench"
    assert store.get_task("missing") is None

    c = store.put_candidate("class ModelNew: pass", task_id="t1", origin="llm", meta={"model": "m"})
    assert store.put_candidate("class ModelNew: pass") == c == source_hash("class ModelNew: pass")
    cand = store.get_candidate(c)
    assert cand["task_id"] == "t1" and cand["meta"] == {"model": "m"} and cand["source"].startswith("class")
    assert store.get_candidate("0" * 64) is None


def test_baselines(store):
    env_key = environment_key(ENVIRONMENT)
    store.put_baseline("th", "eager", env_key, 3, 2.5, {"iterations": 100})
    store.put_baseline("th", "cuda_graph", env_key, 3, 1.5, {})
    store.put_baseline("th", "eager", environment_key({**ENVIRONMENT, "gpu_name": "A100"}), 3, 9.0, {})
    store.put_baseline("th", "eager", env_key, 4, 7.0, {})

    assert store.get_baseline("th", "eager", env_key, "3")["ms"] == 2.5  # version 3 == "3"
    assert store.get_baseline("th", "eager", env_key, 3)["extra"] == {"iterations": 100}
    assert store.get_baseline("th", "compile_default", env_key, 3) is None
    assert sorted(store.list_baselines("th", env_key, 3)) == ["cuda_graph", "eager"]
    store.put_baseline("th", "eager", env_key, 3, 2.0, {})  # re-measured: replaces
    assert store.list_baselines("th", env_key, 3)["eager"]["ms"] == 2.0


def test_runs_and_resume(store):
    config = {"model": "tiny", "tasks": ["a", "b"], "lr": 1e-5}
    run_id = store.start_run("eval", config)
    run = store.get_run(run_id)
    assert run["kind"] == "eval" and run["status"] == "running" and run["config"] == config
    assert run["summary"] is None

    items = [f"task{i}" for i in range(6)]
    processed: list[str] = []
    for item in items[:3]:  # first attempt "crashes" after three items
        processed.append(item)
        store.mark_done(run_id, item)
    store.mark_done(run_id, items[0])  # idempotent
    for item in items:  # resumed attempt skips what is done
        if item not in store.done_items(run_id):
            processed.append(item)
            store.mark_done(run_id, item)
    assert processed == items
    assert store.done_items(run_id) == set(items)
    assert store.done_items("other-run") == set()

    store.finish_run(run_id, {"mean_speedup": 1.5})
    run = store.get_run(run_id)
    assert run["status"] == "finished" and run["summary"] == {"mean_speedup": 1.5} and run["finished_at"]
    assert [r["run_id"] for r in store.list_runs(kind="eval")] == [run_id]
    assert store.list_runs(kind="grpo") == []
    with pytest.raises(StoreError):
        store.finish_run("no-such-run", {})
    assert store.get_run("no-such-run") is None


def test_meta(store):
    assert store.get_meta("peaks/H200") is None
    store.put_meta("peaks/H200", {"fp32_tflops": 60.0, "hbm_bytes_per_s": 4.8e12})
    store.put_meta("peaks/H200", {"fp32_tflops": 61.0})
    assert store.get_meta("peaks/H200") == {"fp32_tflops": 61.0}


def test_reopen_keeps_data_and_context_manager_closes(tmp_path, sample_result):
    path = tmp_path / "r.sqlite"
    with ResultsStore(path) as s:
        s.put_evaluation(sample_result, task_hash="t", key="k")
    with pytest.raises(StoreError):
        s.get_evaluation("k")
    with ResultsStore(str(path)) as s2:
        assert s2.path == path
        assert s2.get_evaluation("k") is not None


def test_connect_for_other_modules(store):
    from cudal1.store import write_transaction

    conn = store.connect()
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA busy_timeout").fetchone()[0] >= 10_000
        with write_transaction(conn):
            conn.execute("CREATE TABLE IF NOT EXISTS exemplars (task_id TEXT, score REAL)")
            conn.execute("INSERT INTO exemplars VALUES ('a', 1.5)")
        with pytest.raises(RuntimeError), write_transaction(conn):
            conn.execute("INSERT INTO exemplars VALUES ('b', 2.0)")
            raise RuntimeError("rolled back")
        assert conn.execute("SELECT task_id FROM exemplars").fetchall() == [("a",)]
        assert not conn.in_transaction
    finally:
        conn.close()


def test_threads_share_one_store(store):
    errors: list[BaseException] = []

    def work(t: int) -> None:
        try:
            for i in range(25):
                store.put_evaluation(make_result(i), task_hash="t", key=f"t{t}-{i}")
                assert store.get_evaluation(f"t{t}-{i}") is not None
        except BaseException as exc:  # collected and re-raised in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []
    assert len(store.query_evaluations()) == 150


def test_store_file_is_plain_sqlite(store, sample_result):
    store.put_evaluation(sample_result, task_hash="t", key="k")
    with sqlite3.connect(store.path) as conn:
        assert conn.execute("SELECT COUNT(*) FROM evaluations").fetchone()[0] == 1
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_record_evaluation_stores_the_task_the_candidate_and_the_verdict_together(tmp_path):
    from types import SimpleNamespace

    store = ResultsStore(tmp_path / "r.sqlite")
    task = SimpleNamespace(id="t/add", source="REF\n", level=2, origin="builtin", hash=source_hash("REF\n"))
    result = EvalResult(status=Status.CORRECT, speedup=1.5, task_id="someone-else", cached=True)
    row_id = store.record_evaluation(task, "CAND\n", result, key="k", label="run")
    (rec,) = store.query_evaluations(label="run")
    assert rec["id"] == row_id and rec["task_id"] == "t/add" and rec["candidate_hash"] == source_hash("CAND\n")
    assert store.get_candidate(rec["candidate_hash"])["source"] == "CAND\n"
    assert store.get_task("t/add", source_hash=rec["task_hash"])["level"] == 2
    assert store.get_evaluation("k").speedup == 1.5
    store.record_evaluation(task, "CAND\n", result, key="k")  # same task and candidate: one row of each
    assert store.task_versions("t/add") == [task.hash] and len(store.query_evaluations(key="k")) == 2
    assert [r["id"] for r in store.query_evaluations(key="k", after_id=row_id)] == [row_id + 1]


@pytest.mark.parametrize("speedup", [float("nan"), float("inf"), 0.0, -2.0])
def test_a_correct_result_with_a_speedup_that_is_not_a_finite_positive_number_is_refused(store, speedup):
    """Every reader of the store (reports, exemplar scores, audits) would take a NaN for a number."""
    bad = make_result(1, status=Status.CORRECT).replace(speedup=speedup)
    with pytest.raises(StoreError, match="speedup is not a finite number"):
        store.put_evaluation(bad, task_hash="t", key="nan-key")
    assert store.get_evaluation("nan-key") is None


def test_evidence_that_overflowed_is_stored_as_null_and_read_back_as_nan(store):
    """A mismatch's largest error where the candidate wrote NaN is evidence, not a paid figure: strict JSON
    carries it as null, and it reads back as NaN."""
    from cudal1.core.types import Mismatch

    mismatch = Mismatch(output_index=0, trial=0, max_abs_error=float("nan"), max_rel_error=float("inf"),
                        bad_elements=4, total_elements=4, first_bad_index=[0], expected=1.0, got=float("nan"))
    wrong = EvalResult(status=Status.INCORRECT, task_id="t", mismatch=mismatch, message=mismatch.describe())
    assert wrong.to_dict()["mismatch"]["max_abs_error"] is None
    store.put_evaluation(wrong, task_hash="t", key="mm")
    back = store.get_evaluation("mm")
    assert math.isnan(back.mismatch.max_abs_error) and "nan" in back.mismatch.describe()
