"""The build (NVRTC in the evaluator's sandbox, no GPU needed) and the scan of its cubin and PTX: a good kernel
gives a cubin, a bad one a precise compile error, a planted device-side launch is refused, planted timer reads
are flagged."""

from __future__ import annotations

import copy
import shutil
import subprocess
from pathlib import Path

import pytest

from cudal1.eval.kernel_build import build_kernel_form
from cudal1.kernel_form.errors import KernelBuildError
from cudal1.kernel_form.examples import RELU_SPEC
from cudal1.kernel_form.scan import elf_symbols, scan_build
from cudal1.kernel_form.spec import parse_spec
from cudal1.raw_cuda.compiler import nvrtc_version

pytestmark = pytest.mark.skipif(nvrtc_version() is None, reason="libnvrtc not loadable")

PLANTED = Path(__file__).resolve().parents[2] / "scripts" / "trusted_time"


def _spec(source: str, kernel: str = "relu", args=None):
    data = copy.deepcopy(RELU_SPEC)
    data["source"] = source
    data["steps"][0]["kernel"] = kernel
    if args is not None:
        data["steps"][0]["args"] = args
    return parse_spec(data)


def test_the_example_builds_to_a_cubin_in_the_sandbox(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDAL1_CACHE_DIR", str(tmp_path))  # a cold build cache: a real compile
    build = build_kernel_form(parse_spec(RELU_SPEC))
    e_type, symbols = elf_symbols(build.cubin)
    assert e_type == 2 and ("relu", 2, 1) in [(n, t, b) for n, t, b, _ in symbols]
    assert build.scan.kernels == ["relu"] and build.scan.ok and build.scan.flags == []
    assert ".entry relu" in build.ptx and build.compiler.startswith("nvrtc ") and build.arch == "sm_90"
    assert 0 < build.compile_s < build.wall_s and not build.cached


def test_a_build_that_passed_is_reused_by_content_and_scanned_again(tmp_path, monkeypatch):
    """The same source, options and arch are not compiled twice: the second build reads the first child's
    reply from the cache (no child runs) and scans its cubin again; another source is built."""
    import cudal1.eval.kernel_build as kernel_build

    monkeypatch.setenv("CUDAL1_CACHE_DIR", str(tmp_path))
    first = build_kernel_form(parse_spec(RELU_SPEC))
    children = []
    real = kernel_build.run_isolated
    monkeypatch.setattr(kernel_build, "run_isolated", lambda *a, **k: children.append(a) or real(*a, **k))
    again = build_kernel_form(parse_spec(RELU_SPEC))
    assert children == [] and again.cached and again.compile_s == 0.0 and again.cubin == first.cubin
    assert again.scan.kernels == ["relu"] and again.wall_s < first.wall_s
    other = RELU_SPEC["source"].replace("fmaxf(x[i], 0.0f)", "fmaxf(x[i], 0.5f)")
    assert not build_kernel_form(_spec(other)).cached and len(children) == 1
    for entry in (tmp_path / "kernel_form").glob("*.json"):
        entry.write_text("{not json")  # a damaged entry is built again
    rebuilt = build_kernel_form(parse_spec(RELU_SPEC))
    assert not rebuilt.cached and rebuilt.cubin == first.cubin and len(children) == 2


def test_a_compile_error_comes_back_from_the_sandbox_as_the_trimmed_log():
    source = RELU_SPEC["source"].replace("fmaxf(x[i], 0.0f)", "fmaxf(x[i], zero)")
    with pytest.raises(KernelBuildError) as info:
        build_kernel_form(_spec(source))
    lines = str(info.value).splitlines()
    assert lines[0] == 'kernel.cu(3): error: identifier "zero" is undefined'
    assert "fmaxf(x[i], zero)" in lines[1] and lines[-1].startswith("1 error detected")


def test_a_planted_device_side_launch_does_not_build_without_rdc():
    source = (PLANTED / "planted_cdp.cu").read_text()
    with pytest.raises(KernelBuildError, match="device-side kernel launch could not be processed"):
        build_kernel_form(_spec(source, "parent", [{"buf": "y"}]), isolate=False)


@pytest.mark.nvcc
def test_the_scan_rejects_a_relocatable_cubin_with_device_runtime_calls(tmp_path):
    out = tmp_path / "cdp.cubin"
    subprocess.run([shutil.which("nvcc"), "-cubin", "-rdc=true", "-arch=sm_90", "-o", str(out),
                    str(PLANTED / "planted_cdp.cu")], check=True, capture_output=True, timeout=300)
    report = scan_build(out.read_bytes(), "", use_sass=False)
    assert not report.ok
    assert report.rejections[0].startswith("a relocatable cubin (ELF type 1)")
    assert report.rejections[1].startswith("device-runtime symbols (dynamic parallelism): __cudaCDP2")


def test_the_scan_rejects_device_runtime_calls_in_the_ptx_and_bytes_that_are_not_a_cubin():
    good = build_kernel_form(parse_spec(RELU_SPEC), isolate=False)
    ptx = good.ptx + "\n\tcall.uni (retval0), cudaLaunchDeviceV2, (param0, param1);\n"
    assert scan_build(good.cubin, ptx, use_sass=False).rejections == [
        "the PTX calls the device runtime (dynamic parallelism): cudaLaunchDeviceV2"]
    assert scan_build(b"\x7fELF" + b"\0" * 100, "", use_sass=False).rejections == [
        "the build is not a CUDA cubin: not a 64-bit little-endian ELF file"]
    truncated = scan_build(good.cubin[:200], "", use_sass=False)
    assert truncated.rejections[0].startswith("the build is not a CUDA cubin: reads past the end")


def test_planted_timer_reads_are_flagged():
    source = (PLANTED / "planted_timer.cu").read_text()
    build = build_kernel_form(_spec(source, "timed", [{"buf": "y"}]), isolate=False)
    assert build.scan.ok and build.scan.flags[:2] == ["reads %globaltimer (PTX)", "reads %clock (PTX)"]


def test_a_step_naming_a_kernel_the_cubin_lacks_is_a_build_error():
    # The signature parser still lists a kernel inside `#if 0`; the cubin's symbols decide. The candidate's
    # mistake, not a forbidden construct: a build error (compile_error), not a rejection.
    hidden = 'extern "C" __global__ void other(float* y) {}\n#if 0\n' + RELU_SPEC["source"] + "#endif\n"
    with pytest.raises(KernelBuildError, match="the cubin defines no kernel 'relu' \\(it has: other\\)"):
        build_kernel_form(_spec(hidden), isolate=False)


def test_an_arch_that_is_not_a_cubin_target_is_refused():
    with pytest.raises(KernelBuildError, match="arch 'compute_90' is not a CUBIN target"):
        build_kernel_form(parse_spec(RELU_SPEC), arch="compute_90", isolate=False)
