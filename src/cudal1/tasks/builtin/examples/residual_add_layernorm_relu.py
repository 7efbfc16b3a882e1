"""CUDA candidate for builtin/level2/residual_add_layernorm_relu: relu(LayerNorm(x + r)) in one kernel.

Eager runs add, layer_norm and relu: about 7 full passes over 537 MB tensors. This kernel, one block per row,
reads x and r once (float4), keeps x + r in shared memory, computes the mean and then the centered variance
from shared memory (two-pass, as accurate as PyTorch's Welford), and writes relu(norm * w + b) once: 3 passes,
so it should be ~2x faster than eager.
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

// Requires D % 4 == 0 and 16-byte aligned pointers (checked on the host).
__global__ void add_ln_relu_kernel(const float4* __restrict__ x, const float4* __restrict__ r,
                                   const float4* __restrict__ w, const float4* __restrict__ b,
                                   float4* __restrict__ y, int64_t D4, float eps) {
    extern __shared__ float4 row[];  // (D4,)
    __shared__ float scratch[32];
    const int64_t base = (int64_t)blockIdx.x * D4;
    const float inv_d = 1.0f / (float)(D4 * 4);
    float s = 0.0f;
    for (int64_t i = threadIdx.x; i < D4; i += blockDim.x) {
        float4 a = x[base + i], c = r[base + i];
        a.x += c.x; a.y += c.y; a.z += c.z; a.w += c.w;
        row[i] = a;
        s += (a.x + a.y) + (a.z + a.w);
    }
    const float mean = block_sum(s, scratch) * inv_d;
    float ss = 0.0f;
    for (int64_t i = threadIdx.x; i < D4; i += blockDim.x) {
        float4 a = row[i];
        float dx = a.x - mean, dy = a.y - mean, dz = a.z - mean, dw = a.w - mean;
        ss += (dx * dx + dy * dy) + (dz * dz + dw * dw);
    }
    const float rstd = rsqrtf(block_sum(ss, scratch) * inv_d + eps);
    for (int64_t i = threadIdx.x; i < D4; i += blockDim.x) {
        float4 a = row[i], g = w[i], h = b[i];
        a.x = fmaxf((a.x - mean) * rstd * g.x + h.x, 0.0f);
        a.y = fmaxf((a.y - mean) * rstd * g.y + h.y, 0.0f);
        a.z = fmaxf((a.z - mean) * rstd * g.z + h.z, 0.0f);
        a.w = fmaxf((a.w - mean) * rstd * g.w + h.w, 0.0f);
        y[base + i] = a;
    }
}

static bool aligned16(const torch::Tensor& t) {
    return reinterpret_cast<uintptr_t>(t.data_ptr<float>()) % 16 == 0;
}

torch::Tensor add_ln_relu(torch::Tensor x, torch::Tensor r, torch::Tensor weight, torch::Tensor bias,
                          double eps) {
    for (const auto& t : {x, r, weight, bias}) {
        TORCH_CHECK(t.is_cuda() && t.scalar_type() == torch::kFloat32, "inputs must be float32 CUDA tensors");
    }
    auto xc = x.contiguous(), rc = r.contiguous(), wc = weight.contiguous(), bc = bias.contiguous();
    TORCH_CHECK(xc.sizes() == rc.sizes(), "x and r must have the same shape");
    auto y = torch::empty_like(xc);
    const int64_t D = xc.size(-1);
    TORCH_CHECK(D % 4 == 0 && wc.numel() == D && bc.numel() == D, "last dim must be a multiple of 4");
    TORCH_CHECK(aligned16(xc) && aligned16(rc) && aligned16(wc) && aligned16(bc) && aligned16(y),
                "pointers must be 16-byte aligned");
    const int64_t rows = xc.numel() / D;
    if (rows == 0) return y;
    const size_t smem_bytes = (size_t)D * sizeof(float);
    TORCH_CHECK(smem_bytes <= 200 * 1024, "row too long for the shared-memory cache");
    if (smem_bytes > 48 * 1024) {
        C10_CUDA_CHECK(cudaFuncSetAttribute(add_ln_relu_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            (int)smem_bytes));
    }
    add_ln_relu_kernel<<<(unsigned)rows, 256, smem_bytes, at::cuda::getCurrentCUDAStream()>>>(
        reinterpret_cast<const float4*>(xc.data_ptr<float>()), reinterpret_cast<const float4*>(rc.data_ptr<float>()),
        reinterpret_cast<const float4*>(wc.data_ptr<float>()), reinterpret_cast<const float4*>(bc.data_ptr<float>()),
        reinterpret_cast<float4*>(y.data_ptr<float>()), D / 4, (float)eps);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}
"""

CPP_SRC = ("torch::Tensor add_ln_relu(torch::Tensor x, torch::Tensor r, torch::Tensor weight, "
           "torch::Tensor bias, double eps);")

_ext = load_inline(
    name="cudal1_builtin_residual_add_layernorm_relu",
    cpp_sources=CPP_SRC,
    cuda_sources=CUDA_SRC,
    functions=["add_ln_relu"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        with torch.no_grad():  # same draws, same order as the reference
            self.norm.weight.add_(0.1 * torch.randn(dim))
            self.norm.bias.add_(0.1 * torch.randn(dim))

    def forward(self, x, r):
        return _ext.add_ln_relu(x, r, self.norm.weight, self.norm.bias, self.norm.eps)
