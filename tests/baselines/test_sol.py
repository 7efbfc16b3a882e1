"""Speed of light: FLOPs and minimum bytes on known tasks, the fraction's arithmetic, and the peak probe."""

from __future__ import annotations

import pytest

from cudal1.baselines import sol
from cudal1.baselines.sol import cached_task_cost, measure_peaks, peak_flops, sol_fraction, task_cost
from cudal1.store import ResultsStore
from cudal1.tasks import Task

MATMUL = '''
import torch
import torch.nn as nn
M, K, N = 64, 32, 48


class Model(nn.Module):
    def forward(self, a, b):
        return a @ b


def get_inputs():
    return [torch.randn(M, K), torch.randn(K, N)]


def get_init_inputs():
    return []
'''

ELEMENTWISE = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(dim, dtype=torch.float16))

    def forward(self, x):
        return torch.relu(x + self.bias)


def get_inputs():
    return [torch.randn(1000, 256, dtype=torch.float16)]


def get_init_inputs():
    return [256]
'''

PEAKS = {"copy_bytes_per_s": 1e12, "matmul_flops_per_s": {"float32": 5e13, "bfloat16": 1e15}}


def test_matmul_cost_is_2mnk_flops_and_operands_once():
    cost = task_cost(Task(id="t/mm", source=MATMUL))
    assert cost.flops == 2 * 64 * 48 * 32
    assert cost.min_bytes == 4 * (64 * 32 + 32 * 48 + 64 * 48)
    assert cost.dtype == "float32"


def test_elementwise_cost_is_bytes_in_out_and_parameters():
    cost = task_cost(Task(id="t/ew", source=ELEMENTWISE))
    assert cost.flops == 0
    assert cost.min_bytes == 2 * (1000 * 256 * 2) + 256 * 2
    assert cost.dtype == "float16"


def test_unbuildable_reference_has_unknown_cost():
    broken = MATMUL.replace("return a @ b", "return torch.tensor(a.sum().item())")
    cost = task_cost(Task(id="t/x", source=broken))
    assert cost.flops is None and cost.min_bytes is None and cost.note


def test_sol_fraction_takes_the_binding_limit():
    # 1e9 bytes at 1e12 B/s = 1 ms; 1e10 flops at 5e13 = 0.2 ms: memory-bound, 1 ms limit.
    assert sol_fraction(2.0, 10**10, 10**9, PEAKS) == pytest.approx(0.5)
    # 1e11 flops at 5e13 = 2 ms > 1 ms of bytes: compute-bound.
    assert sol_fraction(4.0, 10**11, 10**9, PEAKS) == pytest.approx(0.5)
    # bf16 tasks are held to the bf16 peak; unknown dtypes fall back to fp32's.
    assert sol_fraction(4.0, 10**11, 0, PEAKS, "bfloat16") == pytest.approx(0.1 / 4.0)
    assert peak_flops(PEAKS, "int8") == 5e13
    assert sol_fraction(None, 1, 1, PEAKS) is None
    assert sol_fraction(1.0, None, None, PEAKS) is None
    assert sol_fraction(1.0, 1, 1, None) is None


def test_cost_is_cached_in_the_store(tmp_path, monkeypatch):
    task = Task(id="t/mm", source=MATMUL)
    with ResultsStore(tmp_path / "s.sqlite") as store:
        first = cached_task_cost(task, "full", store)
        monkeypatch.setattr(sol, "task_cost", lambda *a: pytest.fail("recomputed"))
        assert cached_task_cost(task, "full", store) == first


def test_cpu_peaks_are_measured_in_a_worker_and_cached(tmp_path, monkeypatch):
    with ResultsStore(tmp_path / "s.sqlite") as store:
        peaks = measure_peaks("cpu", store, copy_bytes=8 * 2**20, matmul_n=128)
        assert peaks["gpu_name"] == "cpu" and peaks["copy_bytes_per_s"] > 1e8
        assert set(peaks["matmul_flops_per_s"]) == {"float32", "bfloat16", "float16"}
        assert all(v > 0 for v in peaks["matmul_flops_per_s"].values())
        import cudal1.eval.isolated as processes
        monkeypatch.setattr(processes, "run_isolated", lambda *a, **k: pytest.fail("probed again"))
        assert measure_peaks("cpu", store) == peaks
