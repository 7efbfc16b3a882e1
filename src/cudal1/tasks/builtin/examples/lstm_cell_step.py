"""CUDA candidate for builtin/level3/lstm_cell_step: two torch GEMMs chained through addmm, then one gate kernel.

The hidden-to-hidden product with its bias is computed by at::addmm, and the input product is accumulated
onto it by a second at::addmm (beta = 1), so the eager "ih(x) + hh(h)" add pass disappears. One kernel then
adds b_ih, applies the four gate nonlinearities, and writes c' and h' (eager runs ~10 separate elementwise
kernels over the 64 MB gate tensor and its chunks). FP32 throughout; cuBLAS runs without TF32 as in eager.
"""
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CUDA_SRC = r"""
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>

__device__ __forceinline__ float sigmoidf(float v) { return 1.0f / (1.0f + expf(-v)); }

// gates (B, 4H) without b_ih; c (B, H). Gate order i, f, g, o as in the reference's chunk(4).
__global__ void lstm_gates_kernel(const float* __restrict__ gates, const float* __restrict__ b_ih,
                                  const float* __restrict__ c, float* __restrict__ h_out,
                                  float* __restrict__ c_out, int64_t batch, int64_t hidden) {
    const int64_t total = batch * hidden;
    const int64_t stride = (int64_t)blockDim.x * gridDim.x;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += stride) {
        const int64_t b = idx / hidden, j = idx - b * hidden;
        const float* g = gates + b * 4 * hidden;
        const float gi = g[j] + b_ih[j];
        const float gf = g[hidden + j] + b_ih[hidden + j];
        const float gg = g[2 * hidden + j] + b_ih[2 * hidden + j];
        const float go = g[3 * hidden + j] + b_ih[3 * hidden + j];
        const float cn = sigmoidf(gf) * c[idx] + sigmoidf(gi) * tanhf(gg);
        c_out[idx] = cn;
        h_out[idx] = sigmoidf(go) * tanhf(cn);
    }
}

std::vector<torch::Tensor> lstm_step(torch::Tensor x, torch::Tensor h, torch::Tensor c, torch::Tensor w_ih,
                                     torch::Tensor b_ih, torch::Tensor w_hh, torch::Tensor b_hh) {
    for (const auto& t : {x, h, c, w_ih, b_ih, w_hh, b_hh}) {
        TORCH_CHECK(t.is_cuda() && t.scalar_type() == torch::kFloat32, "inputs must be float32 CUDA tensors");
    }
    auto gates = at::addmm(b_hh, h, w_hh.t());              // (B, 4H) = h W_hh^T + b_hh, fresh
    gates = at::addmm(gates, x, w_ih.t()).contiguous();     // += x W_ih^T
    auto cc = c.contiguous(), bc = b_ih.contiguous();
    const int64_t batch = cc.size(0), hidden = cc.size(1);
    TORCH_CHECK(gates.size(1) == 4 * hidden, "gate width must be 4 * hidden");
    auto h_out = torch::empty_like(cc);
    auto c_out = torch::empty_like(cc);
    const int64_t total = batch * hidden;
    if (total == 0) return {h_out, c_out};
    const int threads = 256;
    const int64_t max_blocks = (int64_t)at::cuda::getCurrentDeviceProperties()->multiProcessorCount * 16;
    const int blocks = (int)std::min<int64_t>((total + threads - 1) / threads, max_blocks);
    lstm_gates_kernel<<<blocks, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
        gates.data_ptr<float>(), bc.data_ptr<float>(), cc.data_ptr<float>(), h_out.data_ptr<float>(),
        c_out.data_ptr<float>(), batch, hidden);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return {h_out, c_out};
}
"""

CPP_SRC = ("std::vector<torch::Tensor> lstm_step(torch::Tensor x, torch::Tensor h, torch::Tensor c, "
           "torch::Tensor w_ih, torch::Tensor b_ih, torch::Tensor w_hh, torch::Tensor b_hh);")

_ext = load_inline(
    name="cudal1_builtin_lstm_cell_step",
    cpp_sources=CPP_SRC,
    cuda_sources=CUDA_SRC,
    functions=["lstm_step"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, input_size, hidden):
        super().__init__()
        self.ih = nn.Linear(input_size, 4 * hidden)
        self.hh = nn.Linear(hidden, 4 * hidden)

    def forward(self, x, h, c):
        h_next, c_next = _ext.lstm_step(x, h, c, self.ih.weight, self.ih.bias, self.hh.weight, self.hh.bias)
        return h_next, c_next
