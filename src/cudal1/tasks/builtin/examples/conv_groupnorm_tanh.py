"""CUDA candidate for builtin/level2/conv_groupnorm_tanh: torch's conv2d, then GroupNorm+tanh in two kernels.

The convolution goes through at::conv2d (the same cuDNN call as the reference). Eager then runs group_norm
(statistics plus normalize) and a separate tanh pass. Here a statistics kernel splits each (sample, group)
slab over SPLITS blocks and writes FP64 partial sums (deterministic, no atomics, no cancellation in
E[x^2] - E[x]^2), and an apply kernel with the same split normalizes, applies the per-channel affine and tanh
in one read and one write, fully parallel over the GPU. That removes the separate tanh round trip.
"""
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CUDA_SRC = r"""
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>

constexpr int SPLITS = 16;
constexpr int THREADS = 256;

__device__ __forceinline__ double warp_sum_d(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ double block_sum_d(double v, double* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    v = warp_sum_d(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < nwarps ? scratch[lane] : 0.0;
    return warp_sum_d(v);
}

// grid (N*G, SPLITS): block (slab, part) sums its chunk of the slab into partial[slab][part][0..1].
__global__ void gn_stats_kernel(const float* __restrict__ x, double* __restrict__ partial, int64_t slab_size) {
    __shared__ double scratch[32];
    const int64_t slab = blockIdx.x, part = blockIdx.y;
    const int64_t chunk = (slab_size + SPLITS - 1) / SPLITS;
    const int64_t begin = part * chunk;
    const int64_t end = begin + chunk < slab_size ? begin + chunk : slab_size;
    const float* xs = x + slab * slab_size;
    double s = 0.0, ss = 0.0;
    for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
        double v = (double)xs[i];
        s += v;
        ss += v * v;
    }
    s = block_sum_d(s, scratch);
    ss = block_sum_d(ss, scratch);
    if (threadIdx.x == 0) {
        partial[(slab * SPLITS + part) * 2] = s;
        partial[(slab * SPLITS + part) * 2 + 1] = ss;
    }
}

__global__ void gn_apply_tanh_kernel(const float* __restrict__ x, const double* __restrict__ partial,
                                     const float* __restrict__ gamma, const float* __restrict__ beta,
                                     float* __restrict__ y, int64_t slab_size, int64_t hw, int groups,
                                     int ch_per_group, float eps) {
    __shared__ float stats[2];
    const int64_t slab = blockIdx.x, part = blockIdx.y;
    if (threadIdx.x == 0) {
        double s = 0.0, ss = 0.0;
        for (int p = 0; p < SPLITS; ++p) {
            s += partial[(slab * SPLITS + p) * 2];
            ss += partial[(slab * SPLITS + p) * 2 + 1];
        }
        const double mean = s / (double)slab_size;
        double var = ss / (double)slab_size - mean * mean;
        var = var > 0.0 ? var : 0.0;
        stats[0] = (float)mean;
        stats[1] = (float)(1.0 / sqrt(var + (double)eps));
    }
    __syncthreads();
    const float mean = stats[0], rstd = stats[1];
    const int g = (int)(slab % groups);
    const int64_t chunk = (slab_size + SPLITS - 1) / SPLITS;
    const int64_t begin = part * chunk;
    const int64_t end = begin + chunk < slab_size ? begin + chunk : slab_size;
    const float* xs = x + slab * slab_size;
    float* ys = y + slab * slab_size;
    for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
        const int c = g * ch_per_group + (int)(i / hw);
        const float scale = rstd * gamma[c];
        ys[i] = tanhf((xs[i] - mean) * scale + beta[c]);
    }
}

torch::Tensor conv_gn_tanh(torch::Tensor x, torch::Tensor conv_w, torch::Tensor conv_b, torch::Tensor gamma,
                           torch::Tensor beta, int64_t groups, double eps) {
    for (const auto& t : {x, conv_w, conv_b, gamma, beta}) {
        TORCH_CHECK(t.is_cuda() && t.scalar_type() == torch::kFloat32, "inputs must be float32 CUDA tensors");
    }
    auto h = at::conv2d(x, conv_w, conv_b, /*stride=*/{1, 1}, /*padding=*/{1, 1}).contiguous();  // (N, C, H, W)
    auto gc = gamma.contiguous(), bc = beta.contiguous();
    const int64_t n = h.size(0), c = h.size(1), hw = h.size(2) * h.size(3);
    TORCH_CHECK(c % groups == 0, "channels must be divisible by groups");
    const int64_t slabs = n * groups;
    const int64_t slab_size = (c / groups) * hw;
    auto y = torch::empty_like(h);
    if (slabs == 0 || slab_size == 0) return y;
    auto partial = torch::empty({slabs, SPLITS, 2}, h.options().dtype(torch::kFloat64));
    auto stream = at::cuda::getCurrentCUDAStream();
    dim3 grid((unsigned)slabs, SPLITS);
    gn_stats_kernel<<<grid, THREADS, 0, stream>>>(h.data_ptr<float>(), partial.data_ptr<double>(), slab_size);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    gn_apply_tanh_kernel<<<grid, THREADS, 0, stream>>>(
        h.data_ptr<float>(), partial.data_ptr<double>(), gc.data_ptr<float>(), bc.data_ptr<float>(),
        y.data_ptr<float>(), slab_size, hw, (int)groups, (int)(c / groups), (float)eps);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}
"""

CPP_SRC = ("torch::Tensor conv_gn_tanh(torch::Tensor x, torch::Tensor conv_w, torch::Tensor conv_b, "
           "torch::Tensor gamma, torch::Tensor beta, int64_t groups, double eps);")

_ext = load_inline(
    name="cudal1_builtin_conv_groupnorm_tanh",
    cpp_sources=CPP_SRC,
    cuda_sources=CUDA_SRC,
    functions=["conv_gn_tanh"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, c_in, c_out, groups):
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, kernel_size=3, padding=1)
        self.norm = nn.GroupNorm(groups, c_out)

    def forward(self, x):
        return _ext.conv_gn_tanh(x, self.conv.weight, self.conv.bias, self.norm.weight, self.norm.bias,
                                 self.norm.num_groups, self.norm.eps)
