"""Ten small kernels written in both candidate forms, for scripts/bench_forms.py (build time only).

Each kernel's device code is written once with a `__LINKAGE__` marker before `__global__`: the raw form
(`raw_source`) replaces it by `extern "C"` (CUDA headers only, compiled by NVRTC); the KernelBench form
(`inline_module`) drops it and adds the torch headers and a C++ host wrapper that launches the kernel on
torch's current stream, inside a module that calls `load_inline` at import. The kernels are correct FP32
code (relu, gelu, add, mul-add, sigmoid, tanh, row-sum, row-max, transpose, saxpy) but are only built by
the benchmark, never run or checked for speed. Limits: no ModelNew class (the build is what is measured).
"""

from __future__ import annotations

from dataclasses import dataclass

LINKAGE = "__LINKAGE__"

_UNARY = """
__LINKAGE__ __global__ void {name}_kernel(const float* __restrict__ x, float* __restrict__ y, long long n) {{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {{
        float v = x[i];
        y[i] = {expr};
    }}
}}
"""
_UNARY_HOST = """
torch::Tensor {name}_forward(torch::Tensor x) {{
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    const long long n = xc.numel();
    if (n == 0) return y;
    {name}_kernel<<<(unsigned)((n + 255) / 256), 256, 0, at::cuda::getCurrentCUDAStream()>>>(
        xc.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}}
"""
_ADD = """
__LINKAGE__ __global__ void add_kernel(const float* __restrict__ a, const float* __restrict__ b,
                                       float* __restrict__ y, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a[i] + b[i];
}
"""
_ADD_HOST = """
torch::Tensor add_forward(torch::Tensor a, torch::Tensor b) {
    auto ac = a.contiguous(), bc = b.contiguous();
    auto y = torch::empty_like(ac);
    const long long n = ac.numel();
    if (n == 0) return y;
    add_kernel<<<(unsigned)((n + 255) / 256), 256, 0, at::cuda::getCurrentCUDAStream()>>>(
        ac.data_ptr<float>(), bc.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}
"""
_MUL_ADD = """
__LINKAGE__ __global__ void mul_add_kernel(const float* __restrict__ a, const float* __restrict__ b,
                                           const float* __restrict__ c, float* __restrict__ y, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = fmaf(a[i], b[i], c[i]);
}
"""
_MUL_ADD_HOST = """
torch::Tensor mul_add_forward(torch::Tensor a, torch::Tensor b, torch::Tensor c) {
    auto ac = a.contiguous(), bc = b.contiguous(), cc = c.contiguous();
    auto y = torch::empty_like(ac);
    const long long n = ac.numel();
    if (n == 0) return y;
    mul_add_kernel<<<(unsigned)((n + 255) / 256), 256, 0, at::cuda::getCurrentCUDAStream()>>>(
        ac.data_ptr<float>(), bc.data_ptr<float>(), cc.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}
"""
_SAXPY = """
__LINKAGE__ __global__ void saxpy_kernel(float alpha, const float* __restrict__ x, const float* __restrict__ y,
                                         float* __restrict__ out, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = alpha * x[i] + y[i];
}
"""
_SAXPY_HOST = """
torch::Tensor saxpy_forward(torch::Tensor x, torch::Tensor y, double alpha) {
    auto xc = x.contiguous(), yc = y.contiguous();
    auto out = torch::empty_like(xc);
    const long long n = xc.numel();
    if (n == 0) return out;
    saxpy_kernel<<<(unsigned)((n + 255) / 256), 256, 0, at::cuda::getCurrentCUDAStream()>>>(
        (float)alpha, xc.data_ptr<float>(), yc.data_ptr<float>(), out.data_ptr<float>(), n);
    return out;
}
"""
# One block of 256 threads per row; a shared-memory tree reduction.
_ROW_REDUCE = """
__LINKAGE__ __global__ void {name}_kernel(const float* __restrict__ x, float* __restrict__ y, long long D) {{
    __shared__ float part[256];
    const float* xr = x + (long long)blockIdx.x * D;
    float acc = {init};
    for (long long i = threadIdx.x; i < D; i += blockDim.x) acc = {combine_acc};
    part[threadIdx.x] = acc;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {{
        if (threadIdx.x < s) {{
            float a = part[threadIdx.x], b = part[threadIdx.x + s];
            part[threadIdx.x] = {combine_ab};
        }}
        __syncthreads();
    }}
    if (threadIdx.x == 0) y[blockIdx.x] = part[0];
}}
"""
_ROW_REDUCE_HOST = """
torch::Tensor {name}_forward(torch::Tensor x) {{
    auto xc = x.contiguous();
    const long long rows = xc.size(0), D = xc.size(1);
    auto y = torch::empty({{rows}}, xc.options());
    if (rows == 0) return y;
    {name}_kernel<<<(unsigned)rows, 256, 0, at::cuda::getCurrentCUDAStream()>>>(
        xc.data_ptr<float>(), y.data_ptr<float>(), D);
    return y;
}}
"""
# 32x32 tiles through shared memory (padded against bank conflicts); block (32, 8).
_TRANSPOSE = """
__LINKAGE__ __global__ void transpose_kernel(const float* __restrict__ x, float* __restrict__ y, int rows,
                                             int cols) {
    __shared__ float tile[32][33];
    int c = blockIdx.x * 32 + threadIdx.x;
    int r = blockIdx.y * 32 + threadIdx.y;
    for (int k = 0; k < 32; k += 8) {
        if (r + k < rows && c < cols) tile[threadIdx.y + k][threadIdx.x] = x[(long long)(r + k) * cols + c];
    }
    __syncthreads();
    c = blockIdx.y * 32 + threadIdx.x;
    r = blockIdx.x * 32 + threadIdx.y;
    for (int k = 0; k < 32; k += 8) {
        if (r + k < cols && c < rows) y[(long long)(r + k) * rows + c] = tile[threadIdx.x][threadIdx.y + k];
    }
}
"""
_TRANSPOSE_HOST = """
torch::Tensor transpose_forward(torch::Tensor x) {
    auto xc = x.contiguous();
    const int rows = (int)xc.size(0), cols = (int)xc.size(1);
    auto y = torch::empty({cols, rows}, xc.options());
    if (rows == 0 || cols == 0) return y;
    dim3 grid((cols + 31) / 32, (rows + 31) / 32), block(32, 8);
    transpose_kernel<<<grid, block, 0, at::cuda::getCurrentCUDAStream()>>>(
        xc.data_ptr<float>(), y.data_ptr<float>(), rows, cols);
    return y;
}
"""


@dataclass(frozen=True)
class SimpleKernel:
    """One small kernel: its device code (with the `__LINKAGE__` marker), host wrapper and declaration."""

    name: str
    device_code: str
    host_code: str
    cpp_decl: str

    def raw_source(self) -> str:
        """The raw form's SOURCE: extern "C" kernels, CUDA headers only."""
        return self.device_code.replace(LINKAGE, 'extern "C"')

    def inline_module(self) -> str:
        """A module that builds the kernel with `load_inline` when imported (KernelBench form)."""
        cuda = "#include <ATen/cuda/CUDAContext.h>\n" + self.device_code.replace(LINKAGE + " ", "") + self.host_code
        return (
            "from torch.utils.cpp_extension import load_inline\n\n"
            f'CUDA_SRC = r"""\n{cuda}"""\n\n'
            f"CPP_SRC = {self.cpp_decl!r}\n\n"
            f'_ext = load_inline(name="cudal1_bench_{self.name}", cpp_sources=CPP_SRC, cuda_sources=CUDA_SRC,\n'
            f'                   functions=["{self.name}_forward"], extra_cuda_cflags=["-O3"], verbose=False)\n'
        )


def _unary(name: str, expr: str) -> SimpleKernel:
    return SimpleKernel(name, _UNARY.format(name=name, expr=expr), _UNARY_HOST.format(name=name),
                        f"torch::Tensor {name}_forward(torch::Tensor x);")


def _row_reduce(name: str, init: str, combine: str) -> SimpleKernel:
    device = _ROW_REDUCE.format(name=name, init=init, combine_acc=combine.format(a="acc", b="xr[i]"),
                                combine_ab=combine.format(a="a", b="b"))
    return SimpleKernel(name, device, _ROW_REDUCE_HOST.format(name=name),
                        f"torch::Tensor {name}_forward(torch::Tensor x);")


SIMPLE_KERNELS: tuple[SimpleKernel, ...] = (
    _unary("relu", "fmaxf(v, 0.0f)"),
    _unary("gelu", "0.5f * v * (1.0f + erff(v * 0.70710678118654752f))"),
    SimpleKernel("add", _ADD, _ADD_HOST, "torch::Tensor add_forward(torch::Tensor a, torch::Tensor b);"),
    SimpleKernel("mul_add", _MUL_ADD, _MUL_ADD_HOST,
                 "torch::Tensor mul_add_forward(torch::Tensor a, torch::Tensor b, torch::Tensor c);"),
    _unary("sigmoid", "1.0f / (1.0f + expf(-v))"),
    _unary("tanh", "tanhf(v)"),
    _row_reduce("row_sum", "0.0f", "{a} + {b}"),
    _row_reduce("row_max", "-3.402823466e+38f", "fmaxf({a}, {b})"),
    SimpleKernel("transpose", _TRANSPOSE, _TRANSPOSE_HOST, "torch::Tensor transpose_forward(torch::Tensor x);"),
    SimpleKernel("saxpy", _SAXPY, _SAXPY_HOST,
                 "torch::Tensor saxpy_forward(torch::Tensor x, torch::Tensor y, double alpha);"),
)
