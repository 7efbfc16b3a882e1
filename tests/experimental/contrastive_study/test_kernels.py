"""Recipe -> CUDA (experimental.contrastive_study.kernels): every family's template compiles for sm_90 (NVRTC, no GPU), the
static-shared-memory limits fail as a hand-written kernel would, launches cover the data, and the candidate
module the evaluator runs is well-formed and passes the static checks."""

from __future__ import annotations

import ast
import random

import pytest

from cudal1.analysis import analyze_source
from cudal1.raw_cuda import compile_only
from cudal1.raw_cuda.errors import RawCudaCompileError
from experimental.contrastive_study.kernels import (
    MAX_DYNAMIC_SHARED_BYTES,
    candidate_source,
    kernel_source,
    launch_config,
)
from experimental.contrastive_study.ops import FAMILIES, StudyTask, study_tasks
from experimental.contrastive_study.recipes import BY_TEXT, SPACE


def _compile(source: str) -> bytes:
    return compile_only(source, arch="sm_90").cubin_bytes


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_family_compiles_without_warnings_for_a_sample_of_recipes(family):
    task = StudyTask(FAMILIES[family], *FAMILIES[family].shapes[0])
    rng = random.Random(family)
    picks = rng.sample([r for r in SPACE if not (r.stage and r.threads * r.items * r.vec > 4096)], 3)
    for recipe in [BY_TEXT["T256 V4 I2 G S1 M0"], BY_TEXT["T64 V1 I1 O S0 M1"], *picks]:
        result = compile_only(kernel_source(task, recipe), arch="sm_90")
        assert result.cubin_bytes and "warning" not in result.log, (recipe.text, result.log)


def test_a_staged_tile_over_48_kb_does_not_compile():
    ew = StudyTask(FAMILIES["swish"], *FAMILIES["swish"].shapes[0])
    with pytest.raises(RawCudaCompileError, match="too much shared data"):
        _compile(kernel_source(ew, BY_TEXT["T1024 V4 I8 G S1 M0"]))  # 1024 x 8 float4 = 128 KB
    tr = StudyTask(FAMILIES["transpose_add"], *FAMILIES["transpose_add"].shapes[0])
    with pytest.raises(RawCudaCompileError, match="too much shared data"):
        _compile(kernel_source(tr, BY_TEXT["T256 V4 I8 G S1 M0"]))  # 8 tiles of 32 x 129 floats


def test_launches_cover_every_task_and_staged_rows_beyond_the_limit_cannot_launch():
    """One-shot grids cover the data; grid-stride ones fill the GPU at most once (132 SMs)."""
    for task in study_tasks():
        kind = task.family.kind
        for recipe in SPACE:
            launch = launch_config(task, recipe, 132)
            assert launch.block == recipe.threads and launch.grid >= 1
            if kind == "ew":
                per_block, work = recipe.threads * recipe.items, task.cols // recipe.vec
            elif kind == "row":
                per_block, work = (1 if recipe.mapping else recipe.threads // 32), task.rows
            elif recipe.stage:
                per_block, work = recipe.items, (task.rows // 32) * (task.cols // (32 * recipe.vec))
            else:
                per_block, work = recipe.threads * recipe.items, task.numel // recipe.vec
            if recipe.grid_stride:
                assert launch.grid <= max(1, 132 * (2048 // recipe.threads))
            else:
                assert (launch.grid - 1) * per_block < work <= launch.grid * per_block, (task.id, recipe.text)
            assert bool(launch.error) == (launch.shared_bytes > MAX_DYNAMIC_SHARED_BYTES)
    long_rows = next(t for t in study_tasks() if t.id == "study/softmax_r11_c16")
    assert launch_config(long_rows, BY_TEXT["T256 V4 I2 G S1 M1"], 132).error  # a 256 KB row
    assert not launch_config(long_rows, BY_TEXT["T256 V4 I2 G S0 M1"], 132).error


@pytest.mark.parametrize("family", ["swish", "axpby_relu", "softmax", "row_sum", "transpose_add"])
def test_the_candidate_module_is_a_clean_raw_cuda_model_new(family):
    task = next(t for t in study_tasks() if t.family.name == family)
    recipe = BY_TEXT["T256 V4 I2 G S1 M0"]
    source = candidate_source(task, recipe)
    tree = ast.parse(source)
    assert any(isinstance(n, ast.ClassDef) and n.name == "ModelNew" for n in tree.body)
    assert kernel_source(task, recipe) in source and "recipe T256 V4 I2 G S1 M0" in source
    report = analyze_source(source, reference_source=task.reference_source())
    assert report.kernel_class.value == "custom_cuda" and not report.rejected, report.flags
