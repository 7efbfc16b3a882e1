"""A kernel-form candidate through the real evaluator (`evaluate_candidate`): spec mistakes and build failures are
`compile_error` with one line, the sandboxed build and the scan run before any runner, timer reads are flagged and
judged by the policy, a forbidden construct is rejected under every policy, and on a CPU a spec that builds gets
`infra_error` ("needs a GPU"), never a traceback. On a GPU (marked `gpu`): the same session as a module's,
`correct` with a speedup, `incorrect` for a wrong kernel, weights bound from the reference's state_dict."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from cudal1.core import flags as F
from cudal1.core.types import KernelClass
from cudal1.eval import EvalConfig, Status, evaluate_candidate, kernel_build
from cudal1.kernel_form.errors import KernelRejectedError
from cudal1.kernel_form.examples import RELU_SPEC, SCALE_ADD_SPEC
from cudal1.raw_cuda.compiler import nvrtc_version
from cudal1.store import ResultsStore
from cudal1.tasks.sources import load_file

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
PLANTED = Path(__file__).resolve().parents[2] / "scripts" / "trusted_time"
CPU = dict(device="cpu", sizes="full")
needs_nvrtc = pytest.mark.skipif(nvrtc_version() is None, reason="libnvrtc not loadable")


@pytest.fixture(scope="module")
def relu_task():
    return load_file(FIXTURES / "candidates" / "refs" / "relu.py")


@pytest.fixture(scope="module")
def scale_add_task():
    return load_file(FIXTURES / "tasks" / "tiny_scale_add.py")


def _spec(**changes) -> str:
    data = copy.deepcopy(RELU_SPEC)
    for key, value in changes.items():
        if key in ("grid", "kernel", "args"):
            data["steps"][0][key] = value
        else:
            data[key] = value
    return json.dumps(data, indent=2)


def _timer_spec() -> str:
    return _spec(source=(PLANTED / "planted_timer.cu").read_text(), kernel="timed", args=[{"buf": "y"}])


@pytest.mark.parametrize(("text", "message"), [
    (_spec(grid="N"), "kernel-form spec: steps[0].grid[0]: 'N': unknown name 'N' (the task's constants: "
                      "batch_size, dim; per buffer b: b_numel, b_dim0, b_dim1, ...)"),
    (_spec(args=[{"buf": "x"}, {"buf": "y"}, {"scalar": "x_numel", "type": "int32"}]),
     "kernel-form spec: steps[0].args[2].type: int32 but the kernel declares"),
    (_spec(kernel="nope"), "kernel-form spec: steps[0].kernel: no extern \"C\" __global__ 'nope' in the source"),
    ('{"format": 2, "steps": []}', "kernel-form spec: source: is missing"),
    ('{"format": 1, "steps": [', "kernel-form spec: the spec is not JSON: Expecting value at line 1 column 25"),
])
def test_a_malformed_spec_is_a_compile_error_naming_the_field(relu_task, text, message):
    result = evaluate_candidate(relu_task, text, EvalConfig(**CPU))
    assert result.status is Status.COMPILE_ERROR
    assert result.message.startswith(message), result.message
    assert "\n" not in result.message and "Traceback" not in result.message
    assert result.protocol["form"] == "kernel" and result.kernel_class is KernelClass.CUSTOM_CUDA


@needs_nvrtc
def test_a_build_failure_in_the_sandbox_is_a_compile_error_with_the_trimmed_log(relu_task):
    text = _spec(source=RELU_SPEC["source"].replace("fmaxf(x[i], 0.0f)", "fmaxf(x[i], zero)"))
    result = evaluate_candidate(relu_task, text, EvalConfig(**CPU))
    assert result.status is Status.COMPILE_ERROR
    assert result.message.splitlines()[0] == 'kernel.cu(3): error: identifier "zero" is undefined'
    assert "fmaxf(x[i], zero)" in result.compile_log


@needs_nvrtc
def test_on_a_cpu_a_spec_that_builds_gets_infra_error_and_is_not_stored(relu_task, tmp_path):
    store = ResultsStore(tmp_path / "results.sqlite")
    result = evaluate_candidate(relu_task, json.dumps(RELU_SPEC), EvalConfig(**CPU), store=store)
    assert result.status is Status.INFRA_ERROR
    assert result.message.startswith("this candidate compiles CUDA code, which needs a GPU")
    assert "kernel form: its spec, build for sm_90 and scan passed" in result.message
    build = result.protocol["kernel_build"]
    assert result.protocol["form"] == "kernel" and build["arch"] == "sm_90" and build["kernels"] == ["relu"]
    assert build["cubin_bytes"] > 0 and (build["cached"] or 0 < build["compile_s"] < build["wall_s"])
    assert store.query_evaluations() == []


@needs_nvrtc
def test_timer_reads_are_flagged_and_judged_by_the_policy(relu_task):
    strict = evaluate_candidate(relu_task, _timer_spec(), EvalConfig(**CPU))  # guarded: rejects, nothing runs
    assert strict.status is Status.HACK_DETECTED
    assert [(f.rule, f.message, f.source) for f in strict.flags] == [
        (F.KERNEL_TIMER_READ, "reads %globaltimer (PTX)", "build"), (F.KERNEL_TIMER_READ, "reads %clock (PTX)", "build")]
    assert strict.message.startswith("kernel.timer_read: reads %globaltimer (PTX)")
    loose = evaluate_candidate(relu_task, _timer_spec(), EvalConfig(**CPU, profile="loose"))  # cuda-l1: recorded
    assert loose.status is Status.INFRA_ERROR and [f.rule for f in loose.flags] == [F.KERNEL_TIMER_READ] * 2


def test_a_scan_rejection_is_hack_detected_under_every_policy(relu_task, monkeypatch):
    def rejected(*args, **kwargs):
        raise KernelRejectedError("device-runtime symbols (dynamic parallelism): cudaLaunchDeviceV2")

    monkeypatch.setattr(kernel_build, "build_kernel_form", rejected)
    for profile in ("strict", "loose", "trusted"):
        result = evaluate_candidate(relu_task, json.dumps(RELU_SPEC), EvalConfig(**CPU, profile=profile,
                                                                                 sandbox="none"))
        assert result.status is Status.HACK_DETECTED, profile
        assert [f.rule for f in result.flags] == [F.KERNEL_SCAN_REJECTED]
        assert result.message == "kernel.scan_rejected: device-runtime symbols (dynamic parallelism): cudaLaunchDeviceV2"


@needs_nvrtc
def test_a_module_too_large_for_the_runners_message_is_a_compile_error(relu_task, monkeypatch):
    monkeypatch.setattr(kernel_build, "MAX_MODULE_MESSAGE_BYTES", 1000)
    result = evaluate_candidate(relu_task, json.dumps(RELU_SPEC), EvalConfig(**CPU))
    assert result.status is Status.COMPILE_ERROR
    assert result.message.startswith("the module for this candidate (its spec, its cubin of ")
    assert result.message.endswith("over the 1000 of a runner's message: a smaller source or cubin")


def test_json_that_is_not_a_spec_is_judged_as_a_module(relu_task):
    result = evaluate_candidate(relu_task, '{"a": 1}', EvalConfig(**CPU))
    assert result.status is Status.COMPILE_ERROR and "form" not in result.protocol


def test_a_batch_builds_no_extension_for_a_spec_whatever_its_comments_say(relu_task, monkeypatch):
    from cudal1.eval import pipeline

    text = _spec(source="// torch.utils.cpp_extension.load_inline\n" + RELU_SPEC["source"])
    assert not pipeline.uses_load_inline(text) and not pipeline.launches_raw_cuda(text)


# ----------------------------------------------------------------------------------------------------
# On a GPU: the same session as a module's
# ----------------------------------------------------------------------------------------------------

GPU = dict(device="cuda", correctness_trials=3)


@pytest.mark.gpu
def test_the_relu_spec_is_correct_and_timed_like_a_module(relu_task):
    result = evaluate_candidate(relu_task, json.dumps(RELU_SPEC), EvalConfig(**GPU))
    assert result.status is Status.CORRECT, result.message
    assert result.speedup is not None and result.speedup > 0 and result.timing.candidate_ms > 0
    assert result.protocol["form"] == "kernel" and result.kernel_class is KernelClass.CUSTOM_CUDA
    assert result.flags == [] or all(f.rule != F.KERNEL_TIMER_READ for f in result.flags)


@pytest.mark.gpu
def test_a_kernel_that_copies_x_is_incorrect(relu_task):
    wrong = _spec(source=RELU_SPEC["source"].replace("fmaxf(x[i], 0.0f)", "x[i]"))
    result = evaluate_candidate(relu_task, wrong, EvalConfig(**GPU))
    assert result.status is Status.INCORRECT, result.message
    assert result.mismatch is not None


@pytest.mark.gpu
def test_scale_add_binds_the_references_bias_and_is_correct(scale_add_task):
    result = evaluate_candidate(scale_add_task, json.dumps(SCALE_ADD_SPEC), EvalConfig(**GPU))
    assert result.status is Status.CORRECT, result.message


@pytest.mark.gpu
def test_a_kernel_reading_the_globaltimer_is_flagged(relu_task):
    """Under `loose` (cuda-l1) the flag is recorded and the kernel runs; under `strict` it rejects unrun."""
    timer = _spec(source=RELU_SPEC["source"].replace(
        "if (i < n)", 'unsigned long long t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));\n    if (i < n)'))
    loose = evaluate_candidate(relu_task, timer, EvalConfig(**GPU, profile="loose"))
    assert [f.rule for f in loose.flags if f.rule.startswith("kernel.")] == [F.KERNEL_TIMER_READ]
    assert loose.status is Status.CORRECT, loose.message
    strict = evaluate_candidate(relu_task, timer, EvalConfig(**GPU))
    assert strict.status is Status.HACK_DETECTED and strict.timing is None
