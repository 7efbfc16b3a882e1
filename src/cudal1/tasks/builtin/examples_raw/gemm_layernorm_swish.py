"""Raw-form CUDA candidate for builtin/level2/gemm_layernorm_swish: torch's GEMM, then one fused
LayerNorm+swish kernel.

The raw-CUDA twin of `examples/gemm_layernorm_swish.py` (same kernel, same launch shape): plain CUDA C
compiled by NVRTC through `cudal1.raw_cuda.load_kernels` instead of `load_inline`, launched on torch's
current stream. The GEMM stays a torch call (F.linear: the same cuBLAS FP32 call as the reference). One
kernel (one block per row, the row cached in shared memory, two-pass mean/variance) then normalizes the GEMM
output in place and applies h * sigmoid(h): 2 passes against eager's 7. Requires a feature count that is a
multiple of 4 and at most 12288 (48 KiB of shared memory), checked before the launch.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

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

__device__ __forceinline__ float ln_swish(float v, float mean, float rstd, float g, float b) {
    float h = (v - mean) * rstd * g + b;
    return h * (1.0f / (1.0f + expf(-h)));
}

// In place over h (BATCH, D); D % 4 == 0 and 16-byte alignment are checked on the host.
extern "C" __global__ void ln_swish_kernel(float4* __restrict__ h, const float4* __restrict__ w,
                                           const float4* __restrict__ b, long long D4, float eps) {
    extern __shared__ float4 row[];  // (D4,)
    __shared__ float scratch[32];
    float4* hr = h + (long long)blockIdx.x * D4;
    const float inv_d = 1.0f / (float)(D4 * 4);
    float s = 0.0f;
    for (long long i = threadIdx.x; i < D4; i += blockDim.x) {
        float4 a = hr[i];
        row[i] = a;
        s += (a.x + a.y) + (a.z + a.w);
    }
    const float mean = block_sum(s, scratch) * inv_d;
    float ss = 0.0f;
    for (long long i = threadIdx.x; i < D4; i += blockDim.x) {
        float4 a = row[i];
        float dx = a.x - mean, dy = a.y - mean, dz = a.z - mean, dw = a.w - mean;
        ss += (dx * dx + dy * dy) + (dz * dz + dw * dw);
    }
    const float rstd = rsqrtf(block_sum(ss, scratch) * inv_d + eps);
    for (long long i = threadIdx.x; i < D4; i += blockDim.x) {
        float4 a = row[i], g = w[i], c = b[i];
        a.x = ln_swish(a.x, mean, rstd, g.x, c.x);
        a.y = ln_swish(a.y, mean, rstd, g.y, c.y);
        a.z = ln_swish(a.z, mean, rstd, g.z, c.z);
        a.w = ln_swish(a.w, mean, rstd, g.w, c.w);
        hr[i] = a;
    }
}
"""

kernels = load_kernels(SOURCE)
MAX_SHARED_BYTES = 48 * 1024


def _aligned16(*tensors):
    return all(t.data_ptr() % 16 == 0 for t in tensors)


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.norm = nn.LayerNorm(out_features)

    def forward(self, x):
        tensors = (x, self.linear.weight, self.linear.bias, self.norm.weight, self.norm.bias)
        if not all(t.is_cuda and t.dtype == torch.float32 for t in tensors):
            raise ValueError("inputs must be float32 CUDA tensors")
        h = F.linear(x, self.linear.weight, self.linear.bias).contiguous()  # (BATCH, OUT), fresh
        w, b = self.norm.weight.contiguous(), self.norm.bias.contiguous()
        d = h.size(-1)
        if d % 4 != 0 or w.numel() != d or b.numel() != d:
            raise ValueError("features must be a multiple of 4")
        if not _aligned16(h, w, b):
            raise ValueError("pointers must be 16-byte aligned")
        rows = h.numel() // d if d else 0
        if rows == 0:
            return h
        smem_bytes = d * 4
        if smem_bytes > MAX_SHARED_BYTES:
            raise ValueError("row too long for the shared-memory cache")
        threads = 256 if d >= 1024 else 128
        kernels.ln_swish_kernel(grid=(rows,), block=(threads,), args=(h, w, b, d // 4, float(self.norm.eps)),
                                shared_mem_bytes=smem_bytes)
        return h
