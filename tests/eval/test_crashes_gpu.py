"""GPU: crashes cost the crashing candidate only; the next candidate is evaluated normally."""

from __future__ import annotations

from pathlib import Path

import pytest

from cudal1.eval import EvalConfig, Status, evaluate_many
from cudal1.tasks.sources import load_file

FIXTURES = Path(__file__).parent.parent / "fixtures"

pytestmark = pytest.mark.gpu


def test_each_crash_is_its_own_status_and_the_next_candidate_is_fine():
    task = load_file(FIXTURES / "tasks" / "tiny_scale_add.py")
    names = ["illegal_address_raw", "correct", "gpu_oom", "correct", "segfault", "early_exit", "hanging",
             "correct"]
    pairs = [(task, (FIXTURES / "eval" / f"{n}.py").read_text()) for n in names]
    results = evaluate_many(pairs, EvalConfig(device="cuda", timeout_s=20.0, buckets=3, skip_static=True))
    for name, r in zip(names, results, strict=True):
        print(f"{name:22s} {r.status.value:14s} {r.message[:100]}")
    statuses = [r.status for r in results]
    assert statuses == [Status.RUNTIME_ERROR, Status.CORRECT, Status.RUNTIME_ERROR, Status.CORRECT,
                        Status.RUNTIME_ERROR, Status.RUNTIME_ERROR, Status.TIMEOUT, Status.CORRECT]
    assert "illegal memory access" in results[0].message or "illegal" in results[0].message.lower()
    assert "memory" in results[2].message.lower()
