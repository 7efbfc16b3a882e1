"""GPU: every built-in task's reference runs, and every example candidate is correct through the evaluator.

The `load_inline` examples are built in parallel by the compile service first (`evaluate_many`), then
evaluated one after another with the full strict protocol. Prints one line per example.
"""

from __future__ import annotations

import pytest

from cudal1.eval import EvalConfig, Status, evaluate_many
from cudal1.tasks import load_tasks
from cudal1.tasks.sources import example_candidates

pytestmark = pytest.mark.gpu


def test_every_reference_runs_on_gpu():
    import torch

    for task in load_tasks("builtin"):
        ref = task.load()
        torch.manual_seed(0)
        model = ref.Model(*ref.get_init_inputs()).cuda()
        with torch.device("cuda"), torch.no_grad():
            out = model(*ref.get_inputs())
        torch.cuda.synchronize()
        outs = out if isinstance(out, (tuple, list)) else [out]
        assert all(torch.isfinite(o.float()).all() for o in outs), task.id
        del model, out, outs
        torch.cuda.empty_cache()


@pytest.mark.timeout(1200)
def test_every_example_is_correct_and_timed():
    pairs = example_candidates("cuda")
    assert len(pairs) >= 12
    results = evaluate_many([(t, src) for t, _, src in pairs], EvalConfig(device="cuda", buckets=5))
    failures = []
    for (task, label, _), r in zip(pairs, results, strict=True):
        warm = (r.timing.speedup_warm if r.timing else None) or 0.0
        print(f"{task.id:45s} {label:6s} {r.status.value:14s} speedup {r.speedup or 0:6.2f}x "
              f"(warm {warm:.2f}x) stab {r.stability or 0:.3f} class {r.kernel_class} {r.message[:80]}")
        if r.status is not Status.CORRECT:
            failures.append((task.id, label, r.status.value, r.message))
    assert not failures, failures
