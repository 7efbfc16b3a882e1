"""Raw-form CUDA candidate for builtin/level1/cummax_rows: a values-only running maximum, one block per row.

The raw-CUDA twin of `examples/cummax_rows.py` (same kernel, same launch shape): plain CUDA C compiled by
NVRTC through `cudal1.raw_cuda.load_kernels` instead of `load_inline`, launched on torch's current stream.
torch.cummax also writes int64 indices that the task discards; this kernel scans tiles of THREADS * 8
elements (per-thread scan of 8 values loaded as two float4, warp-shuffle scan, scan over warp totals, a
carry between tiles) and moves 8 bytes per element instead of ~16. Max is exact, so the result is
bit-identical; NaN propagates as in PyTorch.
"""
import torch
import torch.nn as nn

from cudal1.raw_cuda import load_kernels

SOURCE = r"""
#include <cmath>

constexpr int THREADS = 512;
constexpr int PER_THREAD = 8;

__device__ __forceinline__ float nanmax(float a, float b) {  // NaN wins, like torch.cummax
    return (b > a || isnan(b)) ? b : a;
}

extern "C" __global__ void cummax_rows_kernel(const float* __restrict__ x, float* __restrict__ y, long long D,
                                              bool vec) {
    __shared__ float warp_tot[THREADS / 32];
    const float* xr = x + (long long)blockIdx.x * D;
    float* yr = y + (long long)blockIdx.x * D;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float carry = -INFINITY;
    for (long long tile = 0; tile < D; tile += (long long)THREADS * PER_THREAD) {
        const long long first = tile + (long long)threadIdx.x * PER_THREAD;
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
"""

kernels = load_kernels(SOURCE)
THREADS = 512  # must equal THREADS in SOURCE


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        if not (x.is_cuda and x.dtype == torch.float32 and x.dim() == 2):
            raise ValueError("x must be a 2-D (rows, D) float32 CUDA tensor")
        x = x.contiguous()
        y = torch.empty_like(x)
        rows, d = x.shape
        if rows == 0 or d == 0:
            return y
        vec = d % 4 == 0 and x.data_ptr() % 16 == 0 and y.data_ptr() % 16 == 0
        kernels.cummax_rows_kernel(grid=(rows,), block=(THREADS,), args=(x, y, d, vec))
        return y
