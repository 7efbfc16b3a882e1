"""load_kernels / KernelSet / launch_log. CPU tests drive the launch path through a fake driver backend;
`gpu` tests launch real kernels (run them on the GPU machine: pytest -m gpu tests/raw_cuda)."""

from __future__ import annotations

import time

import pytest
import torch

from cudal1.raw_cuda import compiler, launch_log, load_kernels, reset_launch_log
from cudal1.raw_cuda.errors import RawCudaLaunchError
from cudal1.raw_cuda.launcher import KernelSet, Runtime, normalize_dims
from cudal1.raw_cuda.signature import parse_kernel_signatures

requires_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
requires_nvrtc = pytest.mark.skipif(compiler.nvrtc_version() is None, reason="libnvrtc not loadable")

SRC = r'''
extern "C" __global__ void axpb(const float* __restrict__ x, float* __restrict__ y, float a, float b, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + b;
}
extern "C" __global__ void decoy(float* y, int n) {}
template <typename T> __global__ void templated(T* x) {}
'''


class FakeBackend:
    def __init__(self):
        self.loaded, self.launches, self.shared = [], [], []

    def load_module(self, cubin, device):
        self.loaded.append(device)
        return ("module", device)

    def get_function(self, module, name):
        return (module, name) if name in ("axpb", "decoy", "macro_kernel") else None

    def allow_dynamic_shared(self, func, nbytes, kernel):
        self.shared.append(nbytes)

    def launch(self, func, kernel, grid, block, shared_mem_bytes, stream_handle, cargs, device):
        self.launches.append(dict(kernel=kernel, grid=grid, block=block, smem=shared_mem_bytes,
                                  stream=stream_handle, cargs=cargs, device=device))


CURRENT = 0xC0FFEE


@pytest.fixture()
def fake():
    backend = FakeBackend()
    runtime = Runtime(backend=backend, current_device=lambda: 0, current_stream_handle=lambda dev: CURRENT,
                      tensor_pointer=lambda dev: (lambda t: 0x1000 + t.numel()))
    return backend, KernelSet(b"\x7fELF", parse_kernel_signatures(SRC), key="k" * 64, runtime=runtime)


def test_launch_goes_to_current_stream_with_typed_args(fake):
    backend, kernels = fake
    x, y = torch.zeros(10), torch.zeros(10)
    kernels.axpb(grid=(1,), block=(256,), args=(x, y, 2, 0.5, 10))
    (call,) = backend.launches
    assert call["stream"] == CURRENT and call["grid"] == (1, 1, 1) and call["block"] == (256, 1, 1)
    assert [a.ctype for a in call["cargs"]] == ["pointer", "pointer", "float32", "float32", "int32"]
    assert backend.loaded == [0]
    log = launch_log()
    assert log.by_kernel == {"axpb": 1} and log.by_stream == {CURRENT: 1} and log.off_current_stream == 0


def test_side_stream_is_allowed_but_recorded(fake):
    backend, kernels = fake
    kernels.axpb(grid=1, block=32, args=(torch.zeros(1), torch.zeros(1), 1.0, 0.0, 1), stream=0x5EED)
    assert backend.launches[0]["stream"] == 0x5EED
    log = launch_log()
    assert log.off_current_stream == 1 and log.by_stream == {0x5EED: 1}
    reset_launch_log()
    assert launch_log().total == 0 and launch_log().off_current_stream == 0


def test_decoys_are_visible_in_the_log(fake):
    _, kernels = fake
    from cudal1.raw_cuda.launcher import _RECORDER

    _RECORDER.define(kernels.names)
    kernels.axpb(grid=1, block=32, args=(torch.zeros(1), torch.zeros(1), 1.0, 0.0, 1))
    assert launch_log().never_launched() == ["decoy"]


def test_unknown_kernel_lists_the_available_ones(fake):
    _, kernels = fake
    with pytest.raises(AttributeError, match="no kernel 'relu'; available: axpb, decoy"):
        kernels.relu  # noqa: B018
    with pytest.raises(AttributeError, match="'templated' is not extern \"C\""):
        kernels.templated  # noqa: B018
    assert "axpb" in kernels and "axpb" in dir(kernels) and kernels.names == ["axpb", "decoy"]


def test_kernel_in_binary_but_unparsed_uses_untyped_rules(fake):
    backend, kernels = fake
    kernels.macro_kernel(grid=1, block=1, args=(torch.zeros(1), 3))
    assert [a.ctype for a in backend.launches[0]["cargs"]] == ["pointer", "int64"]


def test_argument_errors_surface_before_launch(fake):
    backend, kernels = fake
    with pytest.raises(RawCudaLaunchError, match=r"axpb: argument 4 \(\"n\", int\): expects an integer"):
        kernels.axpb(grid=1, block=32, args=(torch.zeros(1), torch.zeros(1), 1.0, 0.0, 1.0))
    assert backend.launches == [] and launch_log().total == 0


def test_large_dynamic_shared_memory_opt_in_once(fake):
    backend, kernels = fake
    args = (torch.zeros(1), torch.zeros(1), 1.0, 0.0, 1)
    for _ in range(2):
        kernels.axpb(grid=1, block=32, args=args, shared_mem_bytes=100_000)
    kernels.axpb(grid=1, block=32, args=args, shared_mem_bytes=1024)
    assert backend.shared == [100_000] and [c["smem"] for c in backend.launches] == [100_000, 100_000, 1024]


def test_empty_grid_launches_nothing_but_is_recorded(fake):
    backend, kernels = fake
    kernels.axpb(grid=(0,), block=256, args=(torch.zeros(0), torch.zeros(0), 1.0, 0.0, 0))
    assert backend.launches == [] and launch_log().by_kernel == {"axpb": 1}


@pytest.mark.parametrize(("value", "what", "fragment"), [
    ((64, 32), "block", "has 2048 threads; the limit is 1024"),
    ((1, 1, 65), "block", "dimension z is 65; allowed 1..64"),
    ((0,), "block", "dimension x is 0"),
    ((1, 70000), "grid", "dimension y is 70000; allowed 0..65535"),
    ((1, 2, 3, 4), "grid", "tuple of 1 to 3 ints"),
    ((1.5,), "grid", "tuple of 1 to 3 ints"),
    ((True,), "grid", "tuple of 1 to 3 ints"),
])
def test_launch_config_is_checked(value, what, fragment):
    with pytest.raises(RawCudaLaunchError, match=fragment):
        normalize_dims(value, what, "k")


def test_normalize_dims_pads_and_accepts_int_like():
    import numpy as np

    assert normalize_dims(5, "grid", "k") == (5, 1, 1)
    assert normalize_dims((np.int64(4), 2), "grid", "k") == (4, 2, 1)


@requires_nvrtc
def test_load_kernels_without_gpu_compiles_and_defines(cache_dir):
    kernels = load_kernels(SRC, arch="sm_90")
    assert kernels.names == ["axpb", "decoy"] and launch_log().defined_kernels == ("axpb", "decoy")
    assert load_kernels(SRC, arch="sm_90") is kernels
    if not torch.cuda.is_available():
        with pytest.raises(RawCudaLaunchError, match="CUDA is not available"):
            kernels.axpb(grid=1, block=32, args=(torch.zeros(1), torch.zeros(1), 1.0, 0.0, 1))


# ------------------------------------------------------------------------------------------------------
# GPU
# ------------------------------------------------------------------------------------------------------

RELU = r'''
extern "C" __global__ void relu_kernel(const float* __restrict__ x, float* __restrict__ y, long long n) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = fmaxf(x[i], 0.0f);
}
'''

TILED = r'''
#include <cuda_fp16.h>
#define TILE 32
// out (cols, rows) = scale * in(rows, cols)^T + shift, through a shared-memory tile
extern "C" __global__ void transpose_scale(const float* __restrict__ in, float* __restrict__ out,
                                           int rows, long long cols, double scale, float shift) {
    __shared__ float tile[TILE][TILE + 1];
    int x = blockIdx.x * TILE + threadIdx.x, y = blockIdx.y * TILE + threadIdx.y;
    for (int j = 0; j < TILE; j += blockDim.y)
        if (y + j < rows && x < cols) tile[threadIdx.y + j][threadIdx.x] = in[(long long)(y + j) * cols + x];
    __syncthreads();
    x = blockIdx.y * TILE + threadIdx.x; y = blockIdx.x * TILE + threadIdx.y;
    for (int j = 0; j < TILE; j += blockDim.y)
        if (y + j < cols && x < rows)
            out[(long long)(y + j) * rows + x] = (float)(scale * tile[threadIdx.x][threadIdx.y + j]) + shift;
}
extern "C" __global__ void scale_half(const __half* x, __half* y, __half s, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = __hmul(x[i], s);
}
extern "C" __global__ void reverse_dyn(const float* x, float* y, int n) {
    extern __shared__ float buf[];
    for (int i = threadIdx.x; i < n; i += blockDim.x) buf[i] = x[i];
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += blockDim.x) y[i] = buf[n - 1 - i];
}
'''


@pytest.mark.gpu
@requires_gpu
def test_gpu_relu_and_axpb(cache_dir):
    kernels, relu = load_kernels(SRC), load_kernels(RELU)
    x = torch.randn(100_003, device="cuda")
    y = torch.empty_like(x)
    relu.relu_kernel(grid=((x.numel() + 255) // 256,), block=(256,), args=(x, y, x.numel()))
    torch.testing.assert_close(y, torch.relu(x), rtol=0, atol=0)
    z = torch.empty_like(x)
    kernels.axpb(grid=((x.numel() + 127) // 128,), block=128, args=(x, z, 2.5, -1.0, x.numel()))
    torch.testing.assert_close(z, 2.5 * x - 1.0)


@pytest.mark.gpu
@requires_gpu
def test_gpu_tiled_int32_int64_double_half_and_dynamic_shared(cache_dir):
    kernels = load_kernels(TILED)
    a = torch.randn(300, 517, device="cuda")
    out = torch.empty(517, 300, device="cuda")
    kernels.transpose_scale(grid=((517 + 31) // 32, (300 + 31) // 32), block=(32, 8),
                            args=(a, out, 300, 517, 0.5, 1.0))
    torch.testing.assert_close(out, 0.5 * a.t() + 1.0)
    h = torch.randn(1000, device="cuda", dtype=torch.float16)
    hy = torch.empty_like(h)
    kernels.scale_half(grid=4, block=256, args=(h, hy, 2.0, 1000))
    torch.testing.assert_close(hy, h * 2)
    n = 20_000  # 80 KB of dynamic shared memory: needs the opt-in above 48 KB
    v = torch.randn(n, device="cuda")
    w = torch.empty_like(v)
    kernels.reverse_dyn(grid=1, block=1024, args=(v, w, n), shared_mem_bytes=n * 4)
    torch.testing.assert_close(w, v.flip(0))


@pytest.mark.gpu
@requires_gpu
def test_gpu_launch_follows_the_current_stream(cache_dir):
    relu = load_kernels(RELU)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        x = torch.full((1 << 20,), -3.0, device="cuda").add_(torch.arange(1 << 20, device="cuda") % 7)
        y = torch.empty_like(x)
        relu.relu_kernel(grid=((x.numel() + 255) // 256,), block=256, args=(x, y, x.numel()))
        z = y * 2  # ordered after the kernel only if the kernel ran on `side`
    side.synchronize()
    torch.testing.assert_close(z, torch.relu(x) * 2)
    log = launch_log()
    assert log.by_stream == {side.cuda_stream: 1} and log.off_current_stream == 0
    relu.relu_kernel(grid=((x.numel() + 255) // 256,), block=256, args=(x, y, x.numel()), stream=side)
    torch.cuda.synchronize()
    assert launch_log().off_current_stream == 1


@pytest.mark.gpu
@requires_gpu
def test_gpu_errors_for_bad_tensors(cache_dir):
    relu = load_kernels(RELU)
    x = torch.randn(64, device="cuda")
    with pytest.raises(RawCudaLaunchError, match="tensor is on cpu"):
        relu.relu_kernel(grid=1, block=64, args=(x.cpu(), x, 64))
    with pytest.raises(RawCudaLaunchError, match="got a float16 tensor"):
        relu.relu_kernel(grid=1, block=64, args=(x.half(), x, 64))


@pytest.mark.gpu
@requires_gpu
def test_gpu_build_time_and_cache(cache_dir):
    src = RELU.replace("relu_kernel", "relu_timed")
    start = time.perf_counter()
    load_kernels(src)
    build_s = time.perf_counter() - start
    print(f"raw_cuda: first build of a small kernel took {build_s * 1e3:.0f} ms")
    assert build_s < 1.0
    compiler.clear_memory_cache()
    from cudal1.raw_cuda import launcher

    launcher._kernel_sets.clear()
    start = time.perf_counter()
    kernels = load_kernels(src)  # disk cache only
    assert time.perf_counter() - start < 0.05
    start = time.perf_counter()
    assert load_kernels(src) is kernels
    assert time.perf_counter() - start < 0.05


BIAS_GELU = r'''
extern "C" __global__ void bias_gelu(const float* __restrict__ x, const float* __restrict__ bias,
                                     float* __restrict__ out, long long n, int d) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) {
        float v = x[i] + bias[i % d];
        out[i] = 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
    }
}
'''


@pytest.mark.gpu
@requires_gpu
def test_gpu_docs_bias_gelu_matches_torch(cache_dir):
    """The raw-form example of docs/raw_cuda.md."""
    kernels = load_kernels(BIAS_GELU)
    x, bias = torch.randn(128, 1000, device="cuda"), torch.randn(1000, device="cuda")  # (N, D), (D,)
    out = torch.empty_like(x)
    kernels.bias_gelu(grid=((x.numel() + 255) // 256,), block=(256,), args=(x, bias, out, x.numel(), 1000))
    torch.testing.assert_close(out, torch.nn.functional.gelu(x + bias))
    assert launch_log().never_launched() == []
