"""Raw-form CUDA candidate for builtin/level1/leaky_relu_clamp: clamp(leaky_relu(x, slope), lo, hi) in one pass.

The raw-CUDA twin of `examples/leaky_relu_clamp.py` (same kernel, same launch shape): plain CUDA C compiled
by NVRTC through `cudal1.raw_cuda.load_kernels` instead of `load_inline`, launched on torch's current
stream. Each element is read and written once with float4 accesses (eager: two kernels and a full-size
intermediate). The functor of the load_inline version becomes three float parameters (a struct cannot be
passed by value from Python). NaN propagates as in PyTorch (a NaN input yields NaN).
"""
import torch
import torch.nn as nn

from cudal1.raw_cuda import load_kernels

SOURCE = r"""
struct LeakyClamp {
    float slope, lo, hi;
    __device__ __forceinline__ float operator()(float v) const {
        float a = v > 0.0f ? v : v * slope;
        return a < lo ? lo : (a > hi ? hi : a);
    }
};

extern "C" __global__ void leaky_clamp_kernel(const float* __restrict__ x, float* __restrict__ y, float slope,
                                              float lo, float hi, long long n, bool vec) {
    const LeakyClamp op{slope, lo, hi};
    const long long stride = (long long)blockDim.x * gridDim.x;
    const long long start = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long done = 0;
    if (vec) {
        const long long n4 = n / 4;
        const float4* x4 = reinterpret_cast<const float4*>(x);
        float4* y4 = reinterpret_cast<float4*>(y);
        for (long long i = start; i < n4; i += stride) {
            float4 v = x4[i];
            v.x = op(v.x);
            v.y = op(v.y);
            v.z = op(v.z);
            v.w = op(v.w);
            y4[i] = v;
        }
        done = n4 * 4;
    }
    for (long long i = done + start; i < n; i += stride) {
        y[i] = op(x[i]);
    }
}
"""

kernels = load_kernels(SOURCE)
THREADS = 256


class ModelNew(nn.Module):
    def __init__(self, negative_slope, clamp_min, clamp_max):
        super().__init__()
        self.negative_slope = negative_slope
        self.clamp_min = clamp_min
        self.clamp_max = clamp_max

    def forward(self, x):
        if not (x.is_cuda and x.dtype == torch.float32):
            raise ValueError("x must be a float32 CUDA tensor")
        x = x.contiguous()
        y = torch.empty_like(x)
        n = x.numel()
        if n == 0:
            return y
        vec = x.data_ptr() % 16 == 0 and y.data_ptr() % 16 == 0
        work = (n + 3) // 4 if vec else n
        max_blocks = torch.cuda.get_device_properties(x.device).multi_processor_count * 16
        blocks = min((work + THREADS - 1) // THREADS, max_blocks)
        kernels.leaky_clamp_kernel(
            grid=(blocks,), block=(THREADS,),
            args=(x, y, float(self.negative_slope), float(self.clamp_min), float(self.clamp_max), n, vec))
        return y
