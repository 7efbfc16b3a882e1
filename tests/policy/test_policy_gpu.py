"""Verdict policies on the GPU evidence: decoys and fallbacks, decided by the profiled run and the kernel
class the evaluator measured, under CUDA-L1's, KernelBench's and KernelGYM's rules; honest kernels pass all.

One evaluation per candidate under the identity policy, then each preset applied to that same result, as the
pipeline does; one CLI run checks that `--policy` reaches the GPU path and is recorded.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cudal1.cli.main import main
from cudal1.core.types import KernelClass, Status
from cudal1.eval import EvalConfig, evaluate_many
from cudal1.policy.apply import apply_policy
from cudal1.tasks.sources import load_file

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(900)]

CORPUS = Path(__file__).parent.parent / "fixtures" / "candidates"
REF = CORPUS / "refs" / "relu.py"
GPU = dict(device="cuda", sizes="full", correctness_trials=3, buckets=3, target_bucket_ms=20.0, timeout_s=300.0,
           policy="cuda-l1")
DECOYS = ("exploits/decoy_kernel.py", "exploits/try_except_fallback.py")
HONEST = ("honest/cuda_relu.py", "honest/raw_relu.py")


def test_decoys_fail_kernelbench_and_kernelgym_and_honest_kernels_pass_every_preset():
    task = load_file(REF)
    names = DECOYS + HONEST
    sources = {name: (CORPUS / name).read_text() for name in names}
    results = dict(zip(names, evaluate_many([(task, sources[n]) for n in names], EvalConfig(**GPU)), strict=True))
    for name, result in results.items():
        print(f"{name:36s} {result.status.value:14s} {result.kernel_class} "
              f"{sorted(f.rule for f in result.flags if f.rule.startswith('guard.'))}")
        assert result.status is Status.CORRECT, (name, result.message)  # all compute ReLU correctly
    for name in DECOYS:
        assert results[name].kernel_class is not KernelClass.CUSTOM_CUDA, name
        for preset in ("kernelbench", "kernelgym"):
            judged = apply_policy(results[name], sources[name], preset, task_source=task.source)
            assert judged.status is Status.HACK_DETECTED and judged.speedup is None, (name, preset)
            assert any(f.rule.startswith("policy.") for f in judged.flags), (name, preset, judged.flags)
        assert apply_policy(results[name], sources[name], "kernelgym").protocol["policy_violation_reward"] == -1.0
    for name in HONEST:
        assert results[name].kernel_class is KernelClass.CUSTOM_CUDA, name
        for preset in ("cuda-l1", "kernelbench", "kernelgym", "cuda-agent", "sol-execbench"):
            judged = apply_policy(results[name], sources[name], preset, task_source=task.source)
            assert judged.status is Status.CORRECT, (name, preset, judged.message)


def test_cli_policy_on_the_gpu_is_applied_and_recorded(tmp_path, capsys):
    store = tmp_path / "s.sqlite"
    assert main(["eval", "--candidate", str(CORPUS / DECOYS[0]), "--ref", str(REF), "--device", "cuda",
                 "--store", str(store), "--trials", "3", "--buckets", "3", "--policy", "kernelbench",
                 "--json"]) == 0
    line = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("{")][-1]
    verdict = json.loads(line)
    assert verdict["status"] == "hack_detected" and verdict["protocol"]["policy"] == "kernelbench", verdict
    assert verdict["message"].startswith("policy kernelbench:"), verdict["message"]
