"""CUDA candidate for builtin/level1/swish_beta: y = x * sigmoid(beta * x) in one vectorized pass.

Eager PyTorch runs three kernels (beta * x, sigmoid, multiply) and writes two full-size intermediates, moving
about 7 bytes per 2 useful ones; this kernel reads each float4 once and writes it once, so it should run at
close to 3x the eager speed on a bandwidth-bound GPU. Exact expf (no fast-math), FP32 throughout.
"""
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CUDA_SRC = r"""
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>

__device__ __forceinline__ float swish_one(float v, float beta) {
    return v * (1.0f / (1.0f + expf(-(beta * v))));
}

__global__ void swish_kernel(const float* __restrict__ x, float* __restrict__ y, float beta, int64_t n,
                             bool vec) {
    const int64_t stride = (int64_t)blockDim.x * gridDim.x;
    const int64_t start = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    int64_t done = 0;
    if (vec) {
        const int64_t n4 = n / 4;
        const float4* x4 = reinterpret_cast<const float4*>(x);
        float4* y4 = reinterpret_cast<float4*>(y);
        for (int64_t i = start; i < n4; i += stride) {
            float4 v = x4[i];
            v.x = swish_one(v.x, beta);
            v.y = swish_one(v.y, beta);
            v.z = swish_one(v.z, beta);
            v.w = swish_one(v.w, beta);
            y4[i] = v;
        }
        done = n4 * 4;
    }
    for (int64_t i = done + start; i < n; i += stride) {
        y[i] = swish_one(x[i], beta);
    }
}

torch::Tensor swish_forward(torch::Tensor x, double beta) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "x must be a float32 CUDA tensor");
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    const int64_t n = xc.numel();
    if (n == 0) return y;
    const bool vec = (reinterpret_cast<uintptr_t>(xc.data_ptr<float>()) % 16 == 0) &&
                     (reinterpret_cast<uintptr_t>(y.data_ptr<float>()) % 16 == 0);
    const int threads = 256;
    const int64_t work = vec ? (n + 3) / 4 : n;
    const int64_t max_blocks = (int64_t)at::cuda::getCurrentDeviceProperties()->multiProcessorCount * 16;
    const int blocks = (int)std::min<int64_t>((work + threads - 1) / threads, max_blocks);
    swish_kernel<<<blocks, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
        xc.data_ptr<float>(), y.data_ptr<float>(), (float)beta, n, vec);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}
"""

CPP_SRC = "torch::Tensor swish_forward(torch::Tensor x, double beta);"

_ext = load_inline(
    name="cudal1_builtin_swish_beta",
    cpp_sources=CPP_SRC,
    cuda_sources=CUDA_SRC,
    functions=["swish_forward"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, beta):
        super().__init__()
        self.beta = beta

    def forward(self, x):
        return _ext.swish_forward(x, self.beta)
