"""Report rows from the store: best candidate per task, published scores, baselines and speed of light."""

from __future__ import annotations

import pytest

from cudal1.audit.rows import rows_from_store, stored_labels
from cudal1.baselines.runner import baseline_protocol_version
from cudal1.core.types import Status
from cudal1.store import environment_key
from cudal1.tasks import Task

from .conftest import REF, synthetic

ENV = {"gpu_name": "FakeGPU", "torch_version": "2.x", "cuda_version": "13.0", "device_type": "cuda"}
PROTOCOL = {"sizes": "full", "flush_l2": True, "input_sets": 3, "refresh_inputs": True, "version": "1"}


def _put(store, task, source, status, speedup, label, published=None):
    store.put_task(task.id, task.source, level=task.level)
    digest = store.put_candidate(source, task_id=task.id, meta={"published": published} if published else {})
    result = synthetic(status, speedup, ENV, PROTOCOL).replace(task_id=task.id, candidate_hash=digest)
    store.put_evaluation(result, task_hash=task.hash, key=f"k-{digest}", label=label)


def test_rows_pick_the_best_candidate_and_attach_baselines_and_sol(store):
    task = Task(id="r/level1/1", source=REF.format(k=2), level=1)
    _put(store, task, "c1", Status.CORRECT, 1.5, "run")
    _put(store, task, "c2", Status.CORRECT, 3.0, "run", published={"score_default": 2.5})
    _put(store, task, "c3", Status.INCORRECT, None, "run")
    _put(store, task, "b", Status.CORRECT, 1.0, "baseline:eager")
    version = baseline_protocol_version(PROTOCOL)
    store.put_baseline(task.hash, "cuda_graph", environment_key(ENV), version, 0.5,
                       extra={"status": "ok", "speedup_vs_eager": 2.0})
    store.put_meta("peaks/FakeGPU", {"copy_bytes_per_s": 2048 * 1e3, "matmul_flops_per_s": {"float32": 1e12}})
    assert stored_labels(store) == ["run"]
    (row,) = rows_from_store(store)
    assert row.speedup == 3.0 and row.level == 1 and row.published == {"score_default": 2.5}
    assert row.baselines == {"cuda_graph": 1.5}
    # 16x16 fp32 in + out = 2048 bytes at 2048e3 B/s = 1 ms: reference 1 ms -> 1.0, candidate 1/3 ms -> 1.0
    # (clamped), cuda_graph 0.5 ms -> 1.0 (clamped); a slower peak check below.
    assert row.sol["reference"] == pytest.approx(1.0)
    store.put_meta("peaks/FakeGPU", {"copy_bytes_per_s": 2048 * 1e4, "matmul_flops_per_s": {}})
    (row,) = rows_from_store(store)
    assert row.sol["reference"] == pytest.approx(0.1) and row.sol["candidate"] == pytest.approx(0.3)
    assert row.sol["cuda_graph"] == pytest.approx(0.2)
    assert rows_from_store(store, with_sol=False)[0].sol == {}
