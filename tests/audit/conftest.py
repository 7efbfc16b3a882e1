"""A tiny PyTorch-only release (3 tasks, one wrong candidate) and synthetic results for audit tests."""

from __future__ import annotations

import json

import pytest

from cudal1.core.types import EvalResult, KernelClass, Status, TimingStats
from cudal1.store import ResultsStore

REF = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return x * {k}


def get_inputs():
    return [torch.randn(16, 16)]


def get_init_inputs():
    return []
'''

CAND = '''import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return x * {k}
'''


def release_rows() -> list[dict]:
    """Level 1 tasks 1-2 (correct candidates), level 2 task 1 (a wrong one: multiplies by 5, not 3)."""
    rows = []
    for level, task_id, k, cand_k, score in ((1, 1, 2, 2, 2.0), (1, 2, 4, 4, 1.5), (2, 1, 3, 5, 4.0)):
        rows.append({"level_id": level, "task_id": task_id, "ref_code": REF.format(k=k),
                     "custom_code": CAND.format(k=cand_k), "cuda_graph_code": None, "cudnn_code": None,
                     "score_default": str(score), "score_cuda_graph": str(score / 2)})
    return rows


@pytest.fixture
def release(tmp_path):
    path = tmp_path / "tiny.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in release_rows()) + "\n")
    return path


@pytest.fixture
def store(tmp_path):
    with ResultsStore(tmp_path / "audit.sqlite") as s:
        yield s


def synthetic(status: Status, speedup: float | None = None, env: dict | None = None,
              protocol: dict | None = None) -> EvalResult:
    timing = None if speedup is None else TimingStats(ref_ms=1.0, candidate_ms=1.0 / speedup, speedup=speedup,
                                                      stability=0.01, bucket_speedups=[speedup])
    return EvalResult(status=status, speedup=speedup if status is Status.CORRECT else None, timing=timing,
                      kernel_class=KernelClass.PYTORCH_ONLY, environment=env or {}, protocol=protocol or {},
                      message="" if status is Status.CORRECT else "output 0: 256/256 elements off")
