"""Raw-form CUDA candidate for builtin/level1/swish_beta: y = x * sigmoid(beta * x) in one vectorized pass.

The raw-CUDA twin of `examples/swish_beta.py` (same kernel, same launch shape): plain CUDA C compiled by
NVRTC through `cudal1.raw_cuda.load_kernels` (well under a second) instead of `load_inline` (about a
minute), launched on torch's current stream. One grid-stride kernel reads each float4 once and writes it
once instead of eager's three kernels and two intermediates. Exact expf (no fast-math), FP32 throughout.
"""
import torch
import torch.nn as nn

from cudal1.raw_cuda import load_kernels

SOURCE = r"""
__device__ __forceinline__ float swish_one(float v, float beta) {
    return v * (1.0f / (1.0f + expf(-(beta * v))));
}

extern "C" __global__ void swish_kernel(const float* __restrict__ x, float* __restrict__ y, float beta,
                                        long long n, bool vec) {
    const long long stride = (long long)blockDim.x * gridDim.x;
    const long long start = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long done = 0;
    if (vec) {
        const long long n4 = n / 4;
        const float4* x4 = reinterpret_cast<const float4*>(x);
        float4* y4 = reinterpret_cast<float4*>(y);
        for (long long i = start; i < n4; i += stride) {
            float4 v = x4[i];
            v.x = swish_one(v.x, beta);
            v.y = swish_one(v.y, beta);
            v.z = swish_one(v.z, beta);
            v.w = swish_one(v.w, beta);
            y4[i] = v;
        }
        done = n4 * 4;
    }
    for (long long i = done + start; i < n; i += stride) {
        y[i] = swish_one(x[i], beta);
    }
}
"""

kernels = load_kernels(SOURCE)
THREADS = 256


class ModelNew(nn.Module):
    def __init__(self, beta):
        super().__init__()
        self.beta = beta

    def forward(self, x):
        if not (x.is_cuda and x.dtype == torch.float32):
            raise ValueError("x must be a float32 CUDA tensor")
        x = x.contiguous()
        y = torch.empty_like(x)
        n = x.numel()
        if n == 0:
            return y
        vec = x.data_ptr() % 16 == 0 and y.data_ptr() % 16 == 0
        work = (n + 3) // 4 if vec else n
        max_blocks = torch.cuda.get_device_properties(x.device).multi_processor_count * 16
        blocks = min((work + THREADS - 1) // THREADS, max_blocks)
        kernels.swish_kernel(grid=(blocks,), block=(THREADS,), args=(x, y, float(self.beta), n, vec))
        return y
