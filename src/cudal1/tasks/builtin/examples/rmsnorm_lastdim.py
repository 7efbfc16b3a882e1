"""CUDA candidate for builtin/level1/rmsnorm_lastdim: one block per row, the row cached in shared memory.

The reference runs pow, mean, add, rsqrt and two multiplies: about 7 full passes over the 1 GB input. This
kernel reads the row once (float4) into shared memory, reduces the sum of squares in FP32 (per-thread partial
sums, then a warp-shuffle tree), and writes x * rsqrt(mean + eps) * weight once: ~2 passes, so ~3x faster.
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CUDA_SRC = r"""
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ float block_sum(float v, float* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < nwarps ? scratch[lane] : 0.0f;
    return warp_sum(v);
}

__global__ void rmsnorm_rows_kernel(const float* __restrict__ x, const float* __restrict__ w,
                                    float* __restrict__ y, int64_t D, float eps, bool vec) {
    extern __shared__ float row[];  // (D,)
    __shared__ float scratch[32];
    const float* xr = x + (int64_t)blockIdx.x * D;
    float* yr = y + (int64_t)blockIdx.x * D;
    float ss = 0.0f;
    if (vec) {
        for (int64_t i = threadIdx.x; i < D / 4; i += blockDim.x) {
            float4 v = reinterpret_cast<const float4*>(xr)[i];
            reinterpret_cast<float4*>(row)[i] = v;
            ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
        }
    } else {
        for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
            float v = xr[i];
            row[i] = v;
            ss += v * v;
        }
    }
    ss = block_sum(ss, scratch);
    const float inv_rms = rsqrtf(ss / (float)D + eps);
    // Each thread reads back exactly the elements it stored, so no barrier is needed here.
    if (vec) {
        for (int64_t i = threadIdx.x; i < D / 4; i += blockDim.x) {
            float4 v = reinterpret_cast<const float4*>(row)[i];
            float4 g = reinterpret_cast<const float4*>(w)[i];
            v.x = v.x * inv_rms * g.x; v.y = v.y * inv_rms * g.y;
            v.z = v.z * inv_rms * g.z; v.w = v.w * inv_rms * g.w;
            reinterpret_cast<float4*>(yr)[i] = v;
        }
    } else {
        for (int64_t i = threadIdx.x; i < D; i += blockDim.x) yr[i] = row[i] * inv_rms * w[i];
    }
}

torch::Tensor rmsnorm_rows(torch::Tensor x, torch::Tensor weight, double eps) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "x must be a float32 CUDA tensor");
    TORCH_CHECK(weight.is_cuda() && weight.scalar_type() == torch::kFloat32, "weight must be float32 CUDA");
    auto xc = x.contiguous();
    auto wc = weight.contiguous();
    auto y = torch::empty_like(xc);
    const int64_t D = xc.size(-1);
    TORCH_CHECK(wc.numel() == D, "weight must have the size of the last dimension");
    const int64_t rows = D == 0 ? 0 : xc.numel() / D;
    if (rows == 0) return y;
    const size_t smem_bytes = (size_t)D * sizeof(float);
    TORCH_CHECK(smem_bytes <= 200 * 1024, "row too long for the shared-memory cache");
    if (smem_bytes > 48 * 1024) {
        C10_CUDA_CHECK(cudaFuncSetAttribute(rmsnorm_rows_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            (int)smem_bytes));
    }
    const bool vec = D % 4 == 0 && reinterpret_cast<uintptr_t>(xc.data_ptr<float>()) % 16 == 0 &&
                     reinterpret_cast<uintptr_t>(wc.data_ptr<float>()) % 16 == 0 &&
                     reinterpret_cast<uintptr_t>(y.data_ptr<float>()) % 16 == 0;
    rmsnorm_rows_kernel<<<(unsigned)rows, 256, smem_bytes, at::cuda::getCurrentCUDAStream()>>>(
        xc.data_ptr<float>(), wc.data_ptr<float>(), y.data_ptr<float>(), D, (float)eps, vec);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}
"""

CPP_SRC = "torch::Tensor rmsnorm_rows(torch::Tensor x, torch::Tensor weight, double eps);"

_ext = load_inline(
    name="cudal1_builtin_rmsnorm_lastdim",
    cpp_sources=CPP_SRC,
    cuda_sources=CUDA_SRC,
    functions=["rmsnorm_rows"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim) + 0.1 * torch.randn(dim))  # same draw as the reference

    def forward(self, x):
        return _ext.rmsnorm_rows(x, self.weight, self.eps)
