"""Verdict policies: each preset rejects what its harness rejects, from the recorded evidence, and nothing else."""

from __future__ import annotations

from pathlib import Path

import pytest

from cudal1.core.errors import ConfigError
from cudal1.core.types import EvalResult, Flag, KernelClass, Severity, Status
from cudal1.policy import PRESETS, apply_policy, resolve_policy

TORCH_ONLY = """
import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def forward(self, x):
        return F.softmax(x, dim=1)
"""

OWN_KERNEL = '''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CUDA = r"""
__global__ void k(const float* x, float* y, int n) { int i = blockIdx.x * 256 + threadIdx.x; if (i < n) y[i] = x[i]; }
torch::Tensor run(torch::Tensor x) {
    auto y = torch::empty_like(x);
    k<<<(x.numel() + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), x.numel());
    return y;
}
"""
ext = load_inline("own", cpp_sources="torch::Tensor run(torch::Tensor x);", cuda_sources=CUDA, functions=["run"])


class ModelNew(nn.Module):
    def forward(self, x):
        return ext.run(x)
'''

CPP_TORCH_OP = OWN_KERNEL.replace("auto y = torch::empty_like(x);", "auto y = torch::softmax(x, 1);")

BUILD_IN_FORWARD = '''
import torch.nn as nn
from torch.utils.cpp_extension import load_inline


class ModelNew(nn.Module):
    def forward(self, x):
        ext = load_inline("late", cpp_sources="", cuda_sources="", functions=["run"])
        return ext.run(x)
'''


def correct(kernel_class=KernelClass.CUSTOM_CUDA, *flags):
    return EvalResult(status=Status.CORRECT, speedup=1.5, kernel_class=kernel_class, flags=list(flags), task_id="t")


def rules(result):
    return [f.rule for f in result.flags if f.source == "policy"]


def test_cuda_l1_adds_nothing_and_every_result_records_its_policy():
    out = apply_policy(correct(KernelClass.PYTORCH_ONLY), TORCH_ONLY, "cuda-l1")
    assert out.status is Status.CORRECT and out.speedup == 1.5 and out.protocol["policy"] == "cuda-l1"
    failed = apply_policy(EvalResult(status=Status.INCORRECT, task_id="t"), TORCH_ONLY, "kernelbench")
    assert failed.status is Status.INCORRECT and failed.protocol["policy"] == "kernelbench"


def test_kernelbench_wants_the_output_from_the_candidate_s_own_kernel():
    out = apply_policy(correct(KernelClass.PYTORCH_ONLY), TORCH_ONLY, "kernelbench")
    assert out.status is Status.HACK_DETECTED and out.speedup is None and rules(out) == ["policy.own_kernel"]
    assert out.message.startswith("policy kernelbench:")
    decoy = Flag("guard.decoy_kernel", Severity.WARNING, "none of the candidate's kernels ran")
    fallback = Flag("exception_fallback", Severity.WARNING, "swallows exceptions", line=9)
    out = apply_policy(correct(KernelClass.CUSTOM_CUDA, decoy, fallback), OWN_KERNEL, "kernelbench")
    assert rules(out) == ["policy.decoy_kernel", "policy.fallback"]
    assert apply_policy(correct(), OWN_KERNEL, "kernelbench").status is Status.CORRECT


def test_kernelgym_gives_a_decoy_a_negative_reward():
    decoy = Flag("guard.kernels_not_run", Severity.WARNING, "its kernels never ran")
    out = apply_policy(correct(KernelClass.CUSTOM_CUDA, decoy), OWN_KERNEL, "kernelgym")
    assert out.status is Status.HACK_DETECTED and out.protocol["policy_violation_reward"] == -1.0



def test_kernelgym_wants_a_kernel_of_its_own_cuda_or_triton():
    # KernelGYM profiles the forward: kernels ran but none is the candidate's own (CUDA or Triton) is a decoy.
    out = apply_policy(correct(KernelClass.PYTORCH_ONLY), TORCH_ONLY, "kernelgym")
    assert out.status is Status.HACK_DETECTED and rules(out) == ["policy.own_kernel"]
    assert out.protocol["policy_violation_reward"] == -1.0 and "custom_cuda or triton" in out.message
    assert apply_policy(correct(KernelClass.TRITON), TORCH_ONLY, "kernelgym").status is Status.CORRECT
    assert apply_policy(correct(KernelClass.TRITON), TORCH_ONLY, "kernelbench").status is Status.HACK_DETECTED


def test_a_policy_file_names_its_own_kernel_classes(tmp_path):
    path = tmp_path / "triton_ok.yaml"
    path.write_text("base: kernelbench\nown_kernel_classes: [custom_cuda, triton]\n")
    assert apply_policy(correct(KernelClass.TRITON), OWN_KERNEL, str(path)).status is Status.CORRECT
    path.write_text("base: kernelbench\nown_kernel_classes: [cuda]\n")
    with pytest.raises(ConfigError, match="unknown kernel class"):
        resolve_policy(str(path))


FIXTURES = Path(__file__).parent.parent / "fixtures" / "candidates"


@pytest.mark.parametrize("name", ["exploits/decoy_kernel.py", "exploits/try_except_fallback.py"])
def test_kernels_built_but_not_guaranteed_to_run_are_decoys_under_kernelgym(name):
    # The profiler's decoy check covers custom-classified candidates only: a kernel never launched (or only
    # inside a fallback) leaves a pytorch_only candidate, which KernelGYM's rule once passed as correct.
    out = apply_policy(correct(KernelClass.PYTORCH_ONLY), (FIXTURES / name).read_text(), "kernelgym")
    assert out.status is Status.HACK_DETECTED and "policy.decoy_kernel" in rules(out)
    assert out.protocol["policy_violation_reward"] == -1.0


HONEST_UNDER = [(name, preset) for name in ("honest/cuda_relu.py", "honest/raw_relu.py")
                for preset in ("cuda-l1", "kernelbench", "kernelgym", "cuda-agent", "sol-execbench")]
HONEST_UNDER += [("honest/triton_relu.py", preset) for preset in ("cuda-l1", "kernelgym", "sol-execbench")]


@pytest.mark.parametrize(("name", "preset"), HONEST_UNDER)
def test_honest_kernels_pass_every_preset_that_admits_their_kind(name, preset):
    kernel_class = KernelClass.TRITON if "triton" in name else KernelClass.CUSTOM_CUDA
    out = apply_policy(correct(kernel_class), (FIXTURES / name).read_text(), preset,
                       task_source=(FIXTURES / "refs" / "relu.py").read_text())
    assert out.status is Status.CORRECT, out.message


def test_cuda_agent_forbids_torch_ops_in_python_and_in_the_extension():
    assert apply_policy(correct(), OWN_KERNEL, "cuda-agent").status is Status.CORRECT  # empty_like is allowed
    out = apply_policy(correct(), CPP_TORCH_OP, "cuda-agent")
    assert rules(out) == ["policy.torch_op"] and "torch::softmax (C++)" in out.message
    mixed = OWN_KERNEL.replace("return ext.run(x)", "return ext.run(torch.relu(x))")
    assert "torch.relu" in apply_policy(correct(), mixed, "cuda-agent").message


def test_kernelbench_hard_uses_the_task_s_forbidden_ops_else_its_own():
    out = apply_policy(correct(KernelClass.PYTORCH_ONLY), TORCH_ONLY, "kernelbench-hard")
    assert rules(out) == ["policy.forbidden_op"] and "torch.nn.functional.softmax" in out.message
    method = TORCH_ONLY.replace("F.softmax(x, dim=1)", "x.topk(3).values")
    assert "torch.topk" in apply_policy(correct(KernelClass.PYTORCH_ONLY), method, "kernelbench-hard").message
    task = "FORBIDDEN_OPS = ['torch.relu']\n"
    assert apply_policy(correct(KernelClass.PYTORCH_ONLY), TORCH_ONLY, "kernelbench-hard",
                        task_source=task).status is Status.CORRECT
    assert apply_policy(correct(), CPP_TORCH_OP, "kernelbench-hard").status is Status.HACK_DETECTED


def test_sol_execbench_forbids_a_build_inside_forward_only():
    assert rules(apply_policy(correct(), BUILD_IN_FORWARD, "sol-execbench")) == ["policy.build_in_forward"]
    assert apply_policy(correct(), OWN_KERNEL, "sol-execbench").status is Status.CORRECT


def test_users_extend_a_preset_from_a_file_with_clear_errors(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("base: kernelbench\nforbidden_ops: [torch.bmm]\nviolation_reward: -0.5\n")
    mine = resolve_policy(str(path))
    assert mine.own_kernel and mine.forbidden_ops == ("torch.bmm",) and mine.violation_reward == -0.5
    assert mine.name == "kernelbench+mine"
    for text, needle in (("base: nope\n", "unknown base"), ("colour: red\n", "unknown field"), ("[1, 2]\n", "mapping"),
                         ("a: [\n", "cannot be parsed")):
        path.write_text(text)
        with pytest.raises(ConfigError, match=needle):
            resolve_policy(str(path))
    with pytest.raises(ConfigError, match="unknown policy"):
        resolve_policy("kernelbenhc")
    assert set(PRESETS) == {"guarded", "cuda-l1", "kernelbench-v0", "kernelbench", "kernelgym", "cuda-agent", "kernelbench-hard", "sol-execbench"}
