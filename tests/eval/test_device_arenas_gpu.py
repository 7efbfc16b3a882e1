"""GPU: device arenas (outputs committed and compared on the device) give the verdicts host arenas give."""

from __future__ import annotations

from pathlib import Path

import pytest

from cudal1.eval import EvalConfig, Status, evaluate_many
from cudal1.eval.device_helper import close_helpers
from cudal1.tasks.sources import load_file

FIXTURES = Path(__file__).parent.parent / "fixtures"

pytestmark = pytest.mark.gpu

#: A reference with 64 MB of output per call: where host arenas cost most.
BIG_OUTPUT = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x) * 2.0


def get_inputs():
    return [torch.randn(4096, 4096)]


def get_init_inputs():
    return []
'''
BIG_HONEST = '''
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.clamp_min(x, 0.0).mul_(2.0)
'''
BIG_WRONG_CORNER = '''
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        out = torch.relu(x) * 2.0
        out[-1, -1] += 1.0
        return out
'''


def _run(pairs, monkeypatch, host: bool):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    if host:
        monkeypatch.setenv("CUDAL1_HOST_ARENAS", "1")
    else:
        monkeypatch.delenv("CUDAL1_HOST_ARENAS", raising=False)
    close_helpers()  # the helper reads the setting when it starts
    try:
        return evaluate_many(pairs, EvalConfig(device="cuda", timeout_s=120.0, buckets=3, skip_static=True))
    finally:
        close_helpers()


def test_device_and_host_arenas_agree(tmp_path, monkeypatch):
    tiny = load_file(FIXTURES / "tasks" / "tiny_scale_add.py")
    (tmp_path / "big.py").write_text(BIG_OUTPUT)
    big = load_file(tmp_path / "big.py")
    cases = [(tiny, "correct", Status.CORRECT), (tiny, "wrong_values", Status.INCORRECT),
             (tiny, "input_mutation", Status.INCORRECT), (tiny, "wrong_shape", Status.INCORRECT),
             (tiny, "tensor_subclass", Status.HACK_DETECTED), (big, BIG_HONEST, Status.CORRECT),
             (big, BIG_WRONG_CORNER, Status.INCORRECT)]
    pairs = [(task, (FIXTURES / "eval" / f"{c}.py").read_text() if task is tiny else c) for task, c, _ in cases]
    seen = {}
    for host in (False, True):
        results = _run(pairs, monkeypatch, host)
        for (task, _, _), r in zip(cases, results, strict=True):
            print(f"{'host' if host else 'device':6s} {task.id:20s} {r.status.value:14s} {r.protocol.get('tensors')} "
                  f"{r.protocol.get('phase_s', {}).get('session', 0):.2f} s {r.message[:80]}")
        assert [r.status for r in results] == [c[2] for c in cases]
        assert "in place" in results[2].message, results[2].message
        tensors = {r.protocol.get("tensors") for r in results if r.status is Status.CORRECT}
        assert tensors == {"host" if host else "device"}, tensors
        seen[host] = results
    # The big task's honest speedup is measured alike either way (same calls; only the commit differs).
    speedups = [seen[h][5].speedup for h in (False, True)]
    assert all(s is not None and 0.5 < s < 2.0 for s in speedups), speedups


def test_results_record_each_roles_gpu_memory(tmp_path, monkeypatch):
    (tmp_path / "big.py").write_text(BIG_OUTPUT)
    big = load_file(tmp_path / "big.py")
    result = _run([(big, BIG_HONEST)], monkeypatch, host=False)[0]
    assert result.status is Status.CORRECT, result.message
    memory = result.protocol["gpu_memory_gib"]
    print(memory)
    assert set(memory) == {"reference", "candidate", "helper"}, memory
    for who in ("reference", "candidate"):  # a 64 MiB input and output live in each runner at its peak
        assert memory[who]["peak_allocated"] >= 0.0625, memory
        assert memory[who]["reserved"] >= memory[who]["allocated"], memory


@pytest.mark.parametrize("gpu_clock", [True, False], ids=["gpu-clock", "host-clock"])
def test_the_reference_runner_holds_no_more_than_a_call_after_evaluating_a_2_gib_input_task(gpu_clock):
    """On an H100 the CUDA-graph baseline of `layernorm_lastdim` (2 GiB in, 2 GiB out a call) failed: the
    reference's runner ran out of its 45 % of the card in `get_inputs`, with 34 GiB allocated. A runner that
    keeps nothing between requests holds its model and at most a call's inputs and outputs after the
    evaluation; the default cap must suffice on a card of 80 GB."""
    import torch

    from cudal1.eval.pipeline import evaluate_candidate
    from cudal1.tasks import load_tasks

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    task = next(t for t in load_tasks("builtin") if t.name == "layernorm_lastdim")
    eager_copy = task.source.replace("class Model(", "class ModelNew(")
    config = EvalConfig(device="cuda", correctness_trials=3, buckets=2, target_bucket_ms=20.0, warm_buckets=0,
                        gpu_clock=gpu_clock)
    result = evaluate_candidate(task, eager_copy, config)
    memory = result.protocol.get("gpu_memory_gib", {})
    print(result.status.value, result.speedup, result.message[:200], memory)
    assert result.status is Status.CORRECT, result.message
    call_gib = 4 * 32768 * 16384 / 2**30  # one call's input or output
    assert memory["reference"]["allocated"] <= 2 * call_gib + 0.5, memory
