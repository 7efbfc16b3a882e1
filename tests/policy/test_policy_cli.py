"""`cudal1 eval --policy`: the same correct PyTorch rewrite under CUDA-L1's rules and KernelBench's, stored
apart, and a one-line error for an unknown policy."""

from __future__ import annotations

import json
from pathlib import Path

from cudal1.cli.main import main
from cudal1.store import ResultsStore

TASK = Path(__file__).parent.parent / "fixtures" / "tasks" / "tiny_scale_add.py"
TORCH_ONLY = """
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(dim))

    def forward(self, x):
        return torch.add(x * 2.0, self.bias)
"""


def test_a_pytorch_rewrite_is_correct_for_cuda_l1_and_rejected_by_kernelbench(tmp_path, capsys):
    cand = tmp_path / "cand.py"
    cand.write_text(TORCH_ONLY)
    store = tmp_path / "s.sqlite"
    verdicts = {}
    for policy in ("cuda-l1", "kernelbench"):
        assert main(["eval", "--candidate", str(cand), "--ref", str(TASK), "--device", "cpu", "--store", str(store),
                     "--trials", "2", "--buckets", "2", "--policy", policy, "--json"]) == 0
        line = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("{")][-1]
        verdicts[policy] = json.loads(line)
    assert verdicts["cuda-l1"]["status"] == "correct" and verdicts["cuda-l1"]["protocol"]["policy"] == "cuda-l1"
    assert verdicts["kernelbench"]["status"] == "hack_detected"
    assert verdicts["kernelbench"]["message"].startswith("policy kernelbench: the output is not computed")
    rows = ResultsStore(store).query_evaluations()
    assert sorted(r["status"] for r in rows) == ["correct", "hack_detected"]  # two keys, neither reused


def test_an_unknown_policy_is_a_one_line_error(tmp_path, capsys):
    cand = tmp_path / "cand.py"
    cand.write_text(TORCH_ONLY)
    assert main(["eval", "--candidate", str(cand), "--ref", str(TASK), "--device", "cpu", "--no-store",
                 "--policy", "kernelbenhc"]) == 2
    err = capsys.readouterr().err
    assert "unknown policy 'kernelbenhc'" in err and "Traceback" not in err
