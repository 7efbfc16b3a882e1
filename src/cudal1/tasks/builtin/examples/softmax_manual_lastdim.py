"""CUDA candidate for builtin/level1/softmax_manual_lastdim: one block per row, the row cached in shared memory.

The reference makes five passes (max, subtract, exp, sum, divide) with three full-size intermediates, about
8 reads/writes per element; this kernel reads each element from global memory once (float4), finds the max and
the sum of exponentials from shared memory, and writes once: about 2 accesses per element, so it should run
3-4x faster than eager. Same arithmetic as the reference (exp(x - max) / sum), exact expf, FP32 sums.
"""
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CUDA_SRC = r"""
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>

template <bool IS_MAX>
__device__ __forceinline__ float warp_reduce(float v) {
    for (int o = 16; o > 0; o >>= 1) {
        float other = __shfl_xor_sync(0xffffffffu, v, o);
        v = IS_MAX ? fmaxf(v, other) : v + other;
    }
    return v;
}

// Every thread returns the block-wide result. blockDim.x must be a multiple of 32.
template <bool IS_MAX>
__device__ float block_reduce(float v, float* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    v = warp_reduce<IS_MAX>(v);
    __syncthreads();  // scratch may still be read by a previous call
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < nwarps ? scratch[lane] : (IS_MAX ? -INFINITY : 0.0f);
    return warp_reduce<IS_MAX>(v);
}

__global__ void softmax_rows_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t D, bool vec) {
    extern __shared__ float row[];  // (D,)
    __shared__ float scratch[32];
    const float* xr = x + (int64_t)blockIdx.x * D;
    float* yr = y + (int64_t)blockIdx.x * D;
    float m = -INFINITY;
    if (vec) {
        for (int64_t i = threadIdx.x; i < D / 4; i += blockDim.x) {
            float4 v = reinterpret_cast<const float4*>(xr)[i];
            reinterpret_cast<float4*>(row)[i] = v;
            m = fmaxf(m, fmaxf(fmaxf(v.x, v.y), fmaxf(v.z, v.w)));
        }
    } else {
        for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
            row[i] = xr[i];
            m = fmaxf(m, row[i]);
        }
    }
    m = block_reduce<true>(m, scratch);
    float s = 0.0f;
    for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
        float e = expf(row[i] - m);
        row[i] = e;
        s += e;
    }
    s = block_reduce<false>(s, scratch);
    __syncthreads();
    if (vec) {
        for (int64_t i = threadIdx.x; i < D / 4; i += blockDim.x) {
            float4 e = reinterpret_cast<const float4*>(row)[i];
            e.x /= s; e.y /= s; e.z /= s; e.w /= s;
            reinterpret_cast<float4*>(yr)[i] = e;
        }
    } else {
        for (int64_t i = threadIdx.x; i < D; i += blockDim.x) yr[i] = row[i] / s;
    }
}

torch::Tensor softmax_rows(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "x must be a float32 CUDA tensor");
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    const int64_t D = xc.size(-1);
    const int64_t rows = D == 0 ? 0 : xc.numel() / D;
    if (rows == 0) return y;
    const size_t smem_bytes = (size_t)D * sizeof(float);
    TORCH_CHECK(smem_bytes <= 200 * 1024, "row too long for the shared-memory cache");
    if (smem_bytes > 48 * 1024) {
        C10_CUDA_CHECK(cudaFuncSetAttribute(softmax_rows_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            (int)smem_bytes));
    }
    const bool vec = D % 4 == 0 && reinterpret_cast<uintptr_t>(xc.data_ptr<float>()) % 16 == 0 &&
                     reinterpret_cast<uintptr_t>(y.data_ptr<float>()) % 16 == 0;
    softmax_rows_kernel<<<(unsigned)rows, 256, smem_bytes, at::cuda::getCurrentCUDAStream()>>>(
        xc.data_ptr<float>(), y.data_ptr<float>(), D, vec);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}
"""

CPP_SRC = "torch::Tensor softmax_rows(torch::Tensor x);"

_ext = load_inline(
    name="cudal1_builtin_softmax_manual_lastdim",
    cpp_sources=CPP_SRC,
    cuda_sources=CUDA_SRC,
    functions=["softmax_rows"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return _ext.softmax_rows(x)
