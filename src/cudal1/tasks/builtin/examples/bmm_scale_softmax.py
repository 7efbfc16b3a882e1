"""CUDA candidate for builtin/level2/bmm_scale_softmax: torch's bmm for q k^T, then one fused scale+softmax kernel.

Eager runs bmm, a full-size multiply by the scale and a softmax: two extra passes over the 537 MB score
tensor. Here the bmm output (a fresh tensor owned by this call) is scaled and normalized in place by one
kernel that caches each row in shared memory: one read and one write per score, saving about a third of the
eager time. The scale is applied before the max exactly as the reference does (same rounding).
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

template <bool IS_MAX>
__device__ float block_reduce(float v, float* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    v = warp_reduce<IS_MAX>(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < nwarps ? scratch[lane] : (IS_MAX ? -INFINITY : 0.0f);
    return warp_reduce<IS_MAX>(v);
}

// In place: each block loads its whole row into shared memory before writing any of it.
__global__ void scale_softmax_rows_kernel(float* __restrict__ s, int64_t D, float scale, bool vec) {
    extern __shared__ float row[];  // (D,)
    __shared__ float scratch[32];
    float* sr = s + (int64_t)blockIdx.x * D;
    float m = -INFINITY;
    if (vec) {
        for (int64_t i = threadIdx.x; i < D / 4; i += blockDim.x) {
            float4 v = reinterpret_cast<const float4*>(sr)[i];
            v.x *= scale; v.y *= scale; v.z *= scale; v.w *= scale;
            reinterpret_cast<float4*>(row)[i] = v;
            m = fmaxf(m, fmaxf(fmaxf(v.x, v.y), fmaxf(v.z, v.w)));
        }
    } else {
        for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
            row[i] = sr[i] * scale;
            m = fmaxf(m, row[i]);
        }
    }
    m = block_reduce<true>(m, scratch);
    float total = 0.0f;
    for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
        float e = expf(row[i] - m);
        row[i] = e;
        total += e;
    }
    total = block_reduce<false>(total, scratch);
    const float inv = 1.0f / total;
    if (vec) {
        for (int64_t i = threadIdx.x; i < D / 4; i += blockDim.x) {
            float4 e = reinterpret_cast<const float4*>(row)[i];
            e.x *= inv; e.y *= inv; e.z *= inv; e.w *= inv;
            reinterpret_cast<float4*>(sr)[i] = e;
        }
    } else {
        for (int64_t i = threadIdx.x; i < D; i += blockDim.x) sr[i] = row[i] * inv;
    }
}

torch::Tensor bmm_scale_softmax(torch::Tensor q, torch::Tensor k, double scale) {
    TORCH_CHECK(q.is_cuda() && q.scalar_type() == torch::kFloat32, "q must be a float32 CUDA tensor");
    TORCH_CHECK(k.is_cuda() && k.scalar_type() == torch::kFloat32, "k must be a float32 CUDA tensor");
    auto s = at::bmm(q, k.transpose(1, 2)).contiguous();  // (B, T, T), fresh
    const int64_t D = s.size(-1);
    const int64_t rows = D == 0 ? 0 : s.numel() / D;
    if (rows == 0) return s;
    const size_t smem_bytes = (size_t)D * sizeof(float);
    TORCH_CHECK(smem_bytes <= 200 * 1024, "row too long for the shared-memory cache");
    if (smem_bytes > 48 * 1024) {
        C10_CUDA_CHECK(cudaFuncSetAttribute(scale_softmax_rows_kernel,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_bytes));
    }
    const bool vec = D % 4 == 0 && reinterpret_cast<uintptr_t>(s.data_ptr<float>()) % 16 == 0;
    scale_softmax_rows_kernel<<<(unsigned)rows, 256, smem_bytes, at::cuda::getCurrentCUDAStream()>>>(
        s.data_ptr<float>(), D, (float)scale, vec);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return s;
}
"""

CPP_SRC = "torch::Tensor bmm_scale_softmax(torch::Tensor q, torch::Tensor k, double scale);"

_ext = load_inline(
    name="cudal1_builtin_bmm_scale_softmax",
    cpp_sources=CPP_SRC,
    cuda_sources=CUDA_SRC,
    functions=["bmm_scale_softmax"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, q, k):
        return _ext.bmm_scale_softmax(q, k, self.scale)
