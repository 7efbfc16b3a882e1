"""Raw-form CUDA candidate for builtin/level1/rmsnorm_lastdim: one block per row, the row cached in shared memory.

The raw-CUDA twin of `examples/rmsnorm_lastdim.py` (same kernel, same launch shape): plain CUDA C compiled
by NVRTC through `cudal1.raw_cuda.load_kernels` instead of `load_inline`, launched on torch's current
stream. The row is read once (float4) into shared memory, the sum of squares is reduced in FP32 (per-thread
partial sums, then a warp-shuffle tree), and x * rsqrt(mean + eps) * weight is written once: ~2 passes
against the reference's ~7. Rows above 48 KiB of shared memory are opted in automatically by the launcher.
"""
import torch
import torch.nn as nn

from cudal1.raw_cuda import load_kernels

SOURCE = r"""
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

extern "C" __global__ void rmsnorm_rows_kernel(const float* __restrict__ x, const float* __restrict__ w,
                                               float* __restrict__ y, long long D, float eps, bool vec) {
    extern __shared__ float row[];  // (D,)
    __shared__ float scratch[32];
    const float* xr = x + (long long)blockIdx.x * D;
    float* yr = y + (long long)blockIdx.x * D;
    float ss = 0.0f;
    if (vec) {
        for (long long i = threadIdx.x; i < D / 4; i += blockDim.x) {
            float4 v = reinterpret_cast<const float4*>(xr)[i];
            reinterpret_cast<float4*>(row)[i] = v;
            ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
        }
    } else {
        for (long long i = threadIdx.x; i < D; i += blockDim.x) {
            float v = xr[i];
            row[i] = v;
            ss += v * v;
        }
    }
    ss = block_sum(ss, scratch);
    const float inv_rms = rsqrtf(ss / (float)D + eps);
    // Each thread reads back exactly the elements it stored, so no barrier is needed here.
    if (vec) {
        for (long long i = threadIdx.x; i < D / 4; i += blockDim.x) {
            float4 v = reinterpret_cast<const float4*>(row)[i];
            float4 g = reinterpret_cast<const float4*>(w)[i];
            v.x = v.x * inv_rms * g.x; v.y = v.y * inv_rms * g.y;
            v.z = v.z * inv_rms * g.z; v.w = v.w * inv_rms * g.w;
            reinterpret_cast<float4*>(yr)[i] = v;
        }
    } else {
        for (long long i = threadIdx.x; i < D; i += blockDim.x) yr[i] = row[i] * inv_rms * w[i];
    }
}
"""

kernels = load_kernels(SOURCE)
THREADS = 256
MAX_SHARED_BYTES = 200 * 1024


class ModelNew(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim) + 0.1 * torch.randn(dim))  # same draw as the reference

    def forward(self, x):
        if not (x.is_cuda and x.dtype == torch.float32 and self.weight.dtype == torch.float32):
            raise ValueError("x and weight must be float32 CUDA tensors")
        x = x.contiguous()
        w = self.weight.contiguous()
        y = torch.empty_like(x)
        d = x.size(-1)
        if w.numel() != d:
            raise ValueError("weight must have the size of the last dimension")
        rows = x.numel() // d if d else 0
        if rows == 0:
            return y
        smem_bytes = d * 4
        if smem_bytes > MAX_SHARED_BYTES:
            raise ValueError("row too long for the shared-memory cache")
        vec = d % 4 == 0 and x.data_ptr() % 16 == 0 and w.data_ptr() % 16 == 0 and y.data_ptr() % 16 == 0
        kernels.rmsnorm_rows_kernel(grid=(rows,), block=(THREADS,), args=(x, w, y, d, float(self.eps), vec),
                                    shared_mem_bytes=smem_bytes)
        return y
