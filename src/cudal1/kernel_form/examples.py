"""Complete kernel-form candidates, used by docs/kernel_form.md, the tests and scripts/kernel_form_check.py.

- `RELU_SPEC`: y = relu(x) for a float32 x of any shape, one kernel, sizes from `x_numel`.
- `SCALE_ADD_SPEC`: y = 2 * x + bias for the test task tests/fixtures/tasks/tiny_scale_add.py (x (BATCH, DIM),
  bias (DIM,) a weight of the model), sizes from the task's constants BATCH and DIM.
"""

from __future__ import annotations

RELU_SOURCE = r"""extern "C" __global__ void relu(const float* __restrict__ x, float* __restrict__ y, long long n) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = fmaxf(x[i], 0.0f);
}
"""

RELU_SPEC = {
    "format": 1,
    "source": RELU_SOURCE,
    "options": [],
    "buffers": {"x": {"input": 0}, "y": {"output": 0}},
    "steps": [
        {"kernel": "relu", "grid": "ceil_div(x_numel, 256)", "block": 256, "dyn_smem": 0,
         "args": [{"buf": "x"}, {"buf": "y"}, {"scalar": "x_numel", "type": "int64"}]},
    ],
}

SCALE_ADD_SOURCE = r"""extern "C" __global__ void scale_add(const float* x, const float* bias, float* y, int rows,
                                  int cols, float scale) {
    int r = blockIdx.y, c = blockIdx.x * blockDim.x + threadIdx.x;
    if (r < rows && c < cols) y[r * cols + c] = scale * x[r * cols + c] + bias[c];
}
"""

SCALE_ADD_SPEC = {
    "format": 1,
    "source": SCALE_ADD_SOURCE,
    "buffers": {"x": {"input": 0}, "bias": {"weight": "bias"}, "y": {"output": 0}},
    "steps": [
        {"kernel": "scale_add", "grid": ["ceil_div(DIM, 128)", "BATCH"], "block": [128],
         "args": [{"buf": "x"}, {"buf": "bias"}, {"buf": "y"}, {"scalar": "BATCH", "type": "int32"},
                  {"scalar": "DIM", "type": "int32"}, {"scalar": 2.0, "type": "float32"}]},
    ],
}
