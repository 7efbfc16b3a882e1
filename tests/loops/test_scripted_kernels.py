"""The scripted GPU kernels compile (or fail to) as their names say: checked on CPU, without a GPU.

The raw-form sources are built for sm_90 with `cudal1.raw_cuda.compile_only` (NVRTC, else nvcc), so CI catches
a compile error in a kernel the GPU tests and the benchmark expect to work. The load_inline twins need the
torch CUDA headers to build, so here they are only parsed and checked for the same launchable structure.
"""

from __future__ import annotations

import ast

import pytest

from tests.loops._scripted import GPU_DIR

VARIANTS = ("fast", "slow", "incorrect", "compile_error")
TASKS = ("swish_beta", "softmax_manual_lastdim")


def _string_constant(path, name: str) -> str:
    tree = ast.parse(path.read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == name for t in node.targets):
            return node.value.value
    raise AssertionError(f"{path.name} defines no {name}")


@pytest.mark.nvcc
@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("variant", VARIANTS)
def test_raw_kernels_compile_for_sm90_unless_meant_not_to(task, variant):
    from cudal1.raw_cuda import RawCudaCompileError, compile_only

    source = _string_constant(GPU_DIR / "raw_cuda" / f"{task}__{variant}.py", "SOURCE")
    if variant == "compile_error":
        with pytest.raises(RawCudaCompileError, match="error"):
            compile_only(source, arch="sm_90", use_cache=False)
    else:
        assert compile_only(source, arch="sm_90", use_cache=False).cubin_bytes


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("variant", VARIANTS)
def test_every_kernel_has_both_forms(task, variant):
    from cudal1.llm import extract_completion
    from cudal1.loops.common import detect_form
    from tests.loops._scripted import answer

    raw = GPU_DIR / "raw_cuda" / f"{task}__{variant}.py"
    twin = GPU_DIR / "load_inline" / f"{task}__{variant}.py"
    assert detect_form(raw.read_text()) == "raw_cuda" and detect_form(twin.read_text()) == "load_inline"
    assert "__global__" in _string_constant(twin, "CUDA_SRC")
    for path in (raw, twin):
        assert extract_completion(answer(path.stem, path.parent)).code == path.read_text()
