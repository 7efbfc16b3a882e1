"""Raw-form CUDA candidate for builtin/level2/residual_add_layernorm_relu: relu(LayerNorm(x + r)) in one kernel.

The raw-CUDA twin of `examples/residual_add_layernorm_relu.py` (same kernel, same launch shape): plain CUDA
C compiled by NVRTC through `cudal1.raw_cuda.load_kernels` instead of `load_inline`, launched on torch's
current stream. One block per row reads x and r once (float4), keeps x + r in shared memory, computes the
mean and then the centered variance from shared memory (two-pass), and writes relu(norm * w + b) once:
3 passes against eager's ~7. Requires a last dimension that is a multiple of 4 and 16-byte aligned
tensors (checked before the launch); rows above 48 KiB are opted in automatically by the launcher.
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

// Requires D % 4 == 0 and 16-byte aligned pointers (checked on the host).
extern "C" __global__ void add_ln_relu_kernel(const float4* __restrict__ x, const float4* __restrict__ r,
                                              const float4* __restrict__ w, const float4* __restrict__ b,
                                              float4* __restrict__ y, long long D4, float eps) {
    extern __shared__ float4 row[];  // (D4,)
    __shared__ float scratch[32];
    const long long base = (long long)blockIdx.x * D4;
    const float inv_d = 1.0f / (float)(D4 * 4);
    float s = 0.0f;
    for (long long i = threadIdx.x; i < D4; i += blockDim.x) {
        float4 a = x[base + i], c = r[base + i];
        a.x += c.x; a.y += c.y; a.z += c.z; a.w += c.w;
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
        float4 a = row[i], g = w[i], h = b[i];
        a.x = fmaxf((a.x - mean) * rstd * g.x + h.x, 0.0f);
        a.y = fmaxf((a.y - mean) * rstd * g.y + h.y, 0.0f);
        a.z = fmaxf((a.z - mean) * rstd * g.z + h.z, 0.0f);
        a.w = fmaxf((a.w - mean) * rstd * g.w + h.w, 0.0f);
        y[base + i] = a;
    }
}
"""

kernels = load_kernels(SOURCE)
THREADS = 256
MAX_SHARED_BYTES = 200 * 1024


def _aligned16(*tensors):
    return all(t.data_ptr() % 16 == 0 for t in tensors)


class ModelNew(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        with torch.no_grad():  # same draws, same order as the reference
            self.norm.weight.add_(0.1 * torch.randn(dim))
            self.norm.bias.add_(0.1 * torch.randn(dim))

    def forward(self, x, r):
        tensors = (x, r, self.norm.weight, self.norm.bias)
        if not all(t.is_cuda and t.dtype == torch.float32 for t in tensors):
            raise ValueError("inputs must be float32 CUDA tensors")
        x, r = x.contiguous(), r.contiguous()
        w, b = self.norm.weight.contiguous(), self.norm.bias.contiguous()
        if x.shape != r.shape:
            raise ValueError("x and r must have the same shape")
        y = torch.empty_like(x)
        d = x.size(-1)
        if d % 4 != 0 or w.numel() != d or b.numel() != d:
            raise ValueError("last dim must be a multiple of 4")
        if not _aligned16(x, r, w, b, y):
            raise ValueError("pointers must be 16-byte aligned")
        rows = x.numel() // d if d else 0
        if rows == 0:
            return y
        smem_bytes = d * 4
        if smem_bytes > MAX_SHARED_BYTES:
            raise ValueError("row too long for the shared-memory cache")
        kernels.add_ln_relu_kernel(grid=(rows,), block=(THREADS,),
                                   args=(x, r, w, b, y, d // 4, float(self.norm.eps)),
                                   shared_mem_bytes=smem_bytes)
        return y
