"""Audit runs: resumable through the store, chunked, time-budgeted, relabelled, reported (CPU only)."""

from __future__ import annotations

import dataclasses

from cudal1.audit.run import AuditConfig, audit_label, report_audit, run_audit, stored_result
from cudal1.eval.config import EvalConfig
from cudal1.eval.pipeline import local_environment
from cudal1.eval.types import Status
from cudal1.tasks import load_release

from .conftest import synthetic

FAST = EvalConfig(device="cpu", correctness_trials=2, buckets=3, target_bucket_ms=5.0, warm_buckets=0)


class FakeEvaluate:
    """Stores a synthetic verdict per item exactly where the real pipeline would; records what it saw."""

    def __init__(self, store):
        self.store, self.calls = store, []

    def __call__(self, items, cfg, *, store, force, label, run_id, on_result=None):
        self.calls.append([t.id for t, _ in items])
        out = []
        for task, source in items:
            from cudal1.tasks.task import source_hash
            env = local_environment(cfg.device)
            key, _ = store.lookup(task.hash, source_hash(source), cfg.protocol(), env)
            result = synthetic(Status.CORRECT, 2.0, env=env, protocol=cfg.protocol()).replace(task_id=task.id)
            store.put_evaluation(result, task_hash=task.hash, key=key, label=label, run_id=run_id)
            out.append(result)
        return out


def _config(release, **kw):
    return AuditConfig(release=str(release), eval_config=FAST, **kw)


def test_chunks_resume_and_cover_everything_once(release, store):
    fake = FakeEvaluate(store)
    first = run_audit(_config(release, chunk="1/2", batch_size=1), store, evaluate=fake)
    assert first.evaluated == 2 and first.pending == 1 and len(first.rows) == 2
    second = run_audit(_config(release, chunk="2/2"), store, evaluate=fake)
    assert second.evaluated == 1 and second.pending == 0
    again = run_audit(_config(release), store, evaluate=fake)
    assert again.evaluated == 0 and again.reused == 3
    assert [len(c) for c in fake.calls] == [1, 1, 1]
    assert {r.task_id for r in again.rows} == {"tiny/level1/1", "tiny/level1/2", "tiny/level2/1"}
    assert all(r.published["score_default"] > 0 for r in again.rows)


def test_time_budget_leaves_work_for_later(release, store):
    fake = FakeEvaluate(store)
    outcome = run_audit(_config(release, time_budget_s=-1.0), store, evaluate=fake)
    assert fake.calls == [] and outcome.skipped_for_time == 3 and outcome.pending == 3


def test_results_from_another_label_are_reused_and_relabelled(release, store):
    cfg = _config(release, profile="strict")
    task, cand = load_release(release)[0]
    resolved = cfg.resolved_eval()
    key, _ = stored_result(store, task, cand.hash, resolved)
    env = local_environment("cpu")
    store.put_task(task.id, task.source, level=1)
    store.put_evaluation(synthetic(Status.CORRECT, 3.0, env, resolved.protocol()).replace(task_id=task.id),
                         task_hash=task.hash, key=key, label="someone-else")
    fake = FakeEvaluate(store)
    outcome = run_audit(dataclasses.replace(cfg, limit=1), store, evaluate=fake)
    assert outcome.reused == 1 and fake.calls == []
    assert len(store.query_evaluations(label=audit_label("tiny", "strict"))) == 1


def test_prefilled_store_then_real_cpu_evaluation_and_report(release, store, tmp_path):
    """Two items pre-filled (one correct, one wrong); the third goes through the real pipeline on CPU."""
    cfg = _config(release)
    resolved = cfg.resolved_eval()
    pairs = load_release(release)
    env = local_environment("cpu")
    for (task, cand), (status, speedup) in zip(pairs[1:], [(Status.CORRECT, 1.6), (Status.INCORRECT, None)], strict=True):
        key, _ = stored_result(store, task, cand.hash, resolved)
        store.put_task(task.id, task.source, level=task.level)
        store.put_evaluation(synthetic(status, speedup, env, resolved.protocol()).replace(task_id=task.id),
                             task_hash=task.hash, key=key, label=cfg.label)
    outcome = run_audit(cfg, store)
    assert outcome.evaluated == 1 and outcome.reused == 2 and outcome.pending == 0
    by_id = {r.task_id: r for r in outcome.rows}
    assert by_id["tiny/level1/1"].status == "correct", by_id["tiny/level1/1"]
    assert by_id["tiny/level2/1"].status == "incorrect"
    written = report_audit(outcome, cfg, store, tmp_path / "out", plots=False)
    tasks_md = written["audit_tasks.md"].read_text()
    assert "tiny/level2/1 | 2 | incorrect" in tasks_md and "1.60 / 1.50" in tasks_md
    assert "Audit of published speedups" in written["report.md"].read_text()
