"""compile_only: NVRTC and nvcc builds without a GPU, the content-hash cache, and compile errors."""

from __future__ import annotations

import pytest

from cudal1.core.errors import ConfigError
from cudal1.raw_cuda import compiler
from cudal1.raw_cuda.compiler import cache_key, compile_only, normalize_arch
from cudal1.raw_cuda.errors import RawCudaCompileError

requires_nvrtc = pytest.mark.skipif(compiler.nvrtc_version() is None,
                                    reason="libnvrtc not loadable (pip install nvidia-cuda-nvrtc)")
requires_nvcc = pytest.mark.skipif(compiler.nvcc_path() is None, reason="nvcc not on PATH")

RELU = r'''
extern "C" __global__ void relu_kernel(const float* __restrict__ x, float* __restrict__ y, long long n) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = fmaxf(x[i], 0.0f);
}
'''

SYNTAX_ERROR = r'''
extern "C" __global__ void k(float* y, int n) {
    int i = threadIdx.x
    if (i < n) y[i] = 0.0f;
}
'''

TYPE_ERROR = r'''
extern "C" __global__ void k(float* y, int n) {
    float* p = 3.0;
    y[0] = undefined_name;
}
'''

# Everything an LLM habitually includes or uses without an include; NVRTC sees the shims.
HABITS = r'''
#include <cstdint>
#include <cmath>
#include <cfloat>
#include <climits>
#include <cstdio>
#include <cuda_runtime.h>
#include <cuda_fp16.h>
extern "C" __global__ void k(const float* x, float* y, int64_t n, std::size_t m, uint32_t u) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) y[i] = fmaxf(x[i], -FLT_MAX) + (x[i] > INFINITY ? 1.0f : 0.0f) + (u > INT_MAX);
}
'''

BACKENDS = [pytest.param("nvrtc", marks=requires_nvrtc),
            pytest.param("nvcc", marks=[pytest.mark.nvcc, requires_nvcc])]


@pytest.mark.parametrize("backend", BACKENDS)
def test_builds_cubin_then_hits_memory_and_disk_cache(backend, cache_dir):
    first = compile_only(RELU, compiler=backend)
    assert first.cubin_bytes[:4] == b"\x7fELF" and len(first.cubin_bytes) > 1000
    assert not first.cache_hit and first.compiler.startswith(backend) and first.arch == "sm_90"
    assert (cache_dir / f"{first.key}.cubin").read_bytes() == first.cubin_bytes

    second = compile_only(RELU, compiler=backend)
    assert second.cache_hit and second.cubin_bytes == first.cubin_bytes

    compiler.clear_memory_cache()  # a new process: only the disk cache is left
    third = compile_only(RELU, compiler=backend)
    assert third.cache_hit and third.cubin_bytes == first.cubin_bytes
    assert not list(cache_dir.glob("*.tmp"))


@pytest.mark.parametrize("backend", BACKENDS)
def test_cache_key_separates_options_arch_and_source(backend, tmp_path):
    a = compile_only(RELU, compiler=backend, cache_dir=tmp_path)
    b = compile_only(RELU, compiler=backend, cache_dir=tmp_path, options=["-DUNUSED=1"])
    c = compile_only(RELU, compiler=backend, cache_dir=tmp_path, arch="sm_80")
    d = compile_only(RELU + "\n", compiler=backend, cache_dir=tmp_path)
    assert len({a.key, b.key, c.key, d.key}) == 4 and not any(r.cache_hit for r in (b, c, d))
    assert sorted(p.stem for p in tmp_path.glob("*.cubin")) == sorted([a.key, b.key, c.key, d.key])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("source", "line", "text"), [
    (SYNTAX_ERROR, 4, 'error: expected a ";"'),  # reported where the next statement starts
    (TYPE_ERROR, 3, 'error: a value of type "double" cannot be used to initialize an entity of type "float *"'),
])
def test_compile_errors_are_short_and_point_at_the_line(backend, source, line, text, tmp_path):
    with pytest.raises(RawCudaCompileError) as info:
        compile_only(source, compiler=backend, cache_dir=tmp_path)
    msg = str(info.value)
    assert msg.splitlines()[0] == f"kernel.cu({line}): {text}"
    assert len(msg.splitlines()) <= 15 and len(msg) <= 1500
    assert "warning" not in msg and "Remark" not in msg
    assert info.value.log and info.value.compiler == backend
    assert not list(tmp_path.glob("*.cubin"))


@requires_nvrtc
def test_type_error_reports_every_error_in_order(tmp_path):
    with pytest.raises(RawCudaCompileError) as info:
        compile_only(TYPE_ERROR, compiler="nvrtc", cache_dir=tmp_path)
    errors = [ln for ln in str(info.value).splitlines() if ": error:" in ln]
    assert [e.split(":")[0] for e in errors] == ["kernel.cu(3)", "kernel.cu(4)"]
    assert 'identifier "undefined_name" is undefined' in errors[1]


@requires_nvrtc
def test_nvrtc_shims_accept_common_includes(tmp_path):
    assert compile_only(HABITS, compiler="nvrtc", cache_dir=tmp_path).cubin_bytes


@requires_nvrtc
def test_missing_header_is_a_compile_error(tmp_path):
    with pytest.raises(RawCudaCompileError, match='cannot open source file "torch/extension.h"'):
        compile_only('#include <torch/extension.h>\n' + RELU, compiler="nvrtc", cache_dir=tmp_path)


@requires_nvrtc
def test_use_cache_false_writes_nothing(tmp_path):
    r1 = compile_only(RELU, compiler="nvrtc", cache_dir=tmp_path, use_cache=False)
    r2 = compile_only(RELU, compiler="nvrtc", cache_dir=tmp_path, use_cache=False)
    assert not r1.cache_hit and not r2.cache_hit and not list(tmp_path.iterdir())


def test_unknown_arch_for_nvrtc_is_a_compile_error(tmp_path):
    if compiler.nvrtc_version() is None:
        pytest.skip("libnvrtc not loadable")
    with pytest.raises(RawCudaCompileError, match="cannot build sm_10"):
        compile_only(RELU, compiler="nvrtc", arch="sm_10", cache_dir=tmp_path)


def test_arch_in_options_and_bad_compiler_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="arch='sm_XX'"):
        compile_only(RELU, options=["-arch=sm_80"], cache_dir=tmp_path)
    with pytest.raises(ConfigError, match="choose one of auto, nvrtc, nvcc"):
        compile_only(RELU, compiler="clang", cache_dir=tmp_path)


@pytest.mark.parametrize(("arch", "expected"), [
    ("sm_90", "sm_90"), ("90", "sm_90"), (90, "sm_90"), ("9.0", "sm_90"), ((8, 6), "sm_86"),
    ("sm_90a", "sm_90a"), ("SM_100", "sm_100"),
])
def test_normalize_arch(arch, expected):
    assert normalize_arch(arch) == expected


def test_normalize_arch_rejects_ptx_targets():
    with pytest.raises(ConfigError):
        normalize_arch("compute_90")


def test_cache_key_is_stable():
    assert cache_key("s", ["-a"], "sm_90", "nvrtc", "13.0") == cache_key("s", ("-a",), "sm_90", "nvrtc", "13.0")
    assert cache_key("s", ["-a"], "sm_90", "nvrtc", "13.0") != cache_key("s", ["-a"], "sm_90", "nvrtc", "13.1")


def test_cache_dir_resolution(monkeypatch, tmp_path):
    monkeypatch.setenv("CUDAL1_CACHE_DIR", str(tmp_path))
    assert compiler.resolve_cache_dir() == tmp_path / "raw_cuda"
    assert compiler.resolve_cache_dir(tmp_path / "x") == tmp_path / "x"
    monkeypatch.delenv("CUDAL1_CACHE_DIR")
    assert compiler.resolve_cache_dir().parts[-3:] == (".cache", "cudal1", "raw_cuda")
