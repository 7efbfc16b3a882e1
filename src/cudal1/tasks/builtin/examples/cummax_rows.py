"""CUDA candidate for builtin/level1/cummax_rows: a values-only running maximum, one block per row.

torch.cummax also computes and writes int64 indices (twice the bytes of the values) that the task discards.
This kernel scans tiles of THREADS * 8 elements: each thread scans its 8 contiguous elements (two float4
loads), a warp-shuffle scan and a scan over warp totals give each thread its prefix, and a carry joins tiles.
It moves 8 bytes per element instead of ~16, so it should run ~2x faster. Max is exact, so the result is
bit-identical; NaN propagates as in PyTorch.
"""
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CUDA_SRC = r"""
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>

constexpr int THREADS = 512;
constexpr int PER_THREAD = 8;

__device__ __forceinline__ float nanmax(float a, float b) {  // NaN wins, like torch.cummax
    return (b > a || isnan(b)) ? b : a;
}

__global__ void cummax_rows_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t D, bool vec) {
    __shared__ float warp_tot[THREADS / 32];
    const float* xr = x + (int64_t)blockIdx.x * D;
    float* yr = y + (int64_t)blockIdx.x * D;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float carry = -INFINITY;
    for (int64_t tile = 0; tile < D; tile += (int64_t)THREADS * PER_THREAD) {
        const int64_t first = tile + (int64_t)threadIdx.x * PER_THREAD;
        float v[PER_THREAD];
        if (vec && first + PER_THREAD <= D) {
            float4 a = reinterpret_cast<const float4*>(xr + first)[0];
            float4 b = reinterpret_cast<const float4*>(xr + first)[1];
            v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w; v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
        } else {
#pragma unroll
            for (int j = 0; j < PER_THREAD; ++j) v[j] = first + j < D ? xr[first + j] : -INFINITY;
        }
#pragma unroll
        for (int j = 1; j < PER_THREAD; ++j) v[j] = nanmax(v[j - 1], v[j]);
        // Inclusive scan of thread totals within the warp.
        float t = v[PER_THREAD - 1];
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            float other = __shfl_up_sync(0xffffffffu, t, o);
            if (lane >= o) t = nanmax(other, t);
        }
        if (lane == 31) warp_tot[warp] = t;
        __syncthreads();
        if (warp == 0) {
            float wt = lane < THREADS / 32 ? warp_tot[lane] : -INFINITY;
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                float other = __shfl_up_sync(0xffffffffu, wt, o);
                if (lane >= o) wt = nanmax(other, wt);
            }
            if (lane < THREADS / 32) warp_tot[lane] = wt;  // inclusive over warps
        }
        __syncthreads();
        // Prefix before this thread: carry, earlier warps, earlier lanes of this warp.
        float prefix = carry;
        if (warp > 0) prefix = nanmax(prefix, warp_tot[warp - 1]);
        float lane_prev = __shfl_up_sync(0xffffffffu, t, 1);
        if (lane > 0) prefix = nanmax(prefix, lane_prev);
#pragma unroll
        for (int j = 0; j < PER_THREAD; ++j) v[j] = nanmax(prefix, v[j]);
        if (vec && first + PER_THREAD <= D) {
            reinterpret_cast<float4*>(yr + first)[0] = make_float4(v[0], v[1], v[2], v[3]);
            reinterpret_cast<float4*>(yr + first)[1] = make_float4(v[4], v[5], v[6], v[7]);
        } else {
#pragma unroll
            for (int j = 0; j < PER_THREAD; ++j) {
                if (first + j < D) yr[first + j] = v[j];
            }
        }
        carry = nanmax(carry, warp_tot[THREADS / 32 - 1]);
        __syncthreads();  // warp_tot is rewritten by the next tile
    }
}

torch::Tensor cummax_rows(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "x must be a float32 CUDA tensor");
    TORCH_CHECK(x.dim() == 2, "x must be 2-D (rows, D)");
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    const int64_t rows = xc.size(0), D = xc.size(1);
    if (rows == 0 || D == 0) return y;
    const bool vec = D % 4 == 0 && reinterpret_cast<uintptr_t>(xc.data_ptr<float>()) % 16 == 0 &&
                     reinterpret_cast<uintptr_t>(y.data_ptr<float>()) % 16 == 0;
    cummax_rows_kernel<<<(unsigned)rows, THREADS, 0, at::cuda::getCurrentCUDAStream()>>>(
        xc.data_ptr<float>(), y.data_ptr<float>(), D, vec);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}
"""

CPP_SRC = "torch::Tensor cummax_rows(torch::Tensor x);"

_ext = load_inline(
    name="cudal1_builtin_cummax_rows",
    cpp_sources=CPP_SRC,
    cuda_sources=CUDA_SRC,
    functions=["cummax_rows"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return _ext.cummax_rows(x)
