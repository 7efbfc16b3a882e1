"""Linear layer, exact GELU, then a constant scale: y = gelu(x @ W^T + b) * scale for x (BATCH, IN_FEATURES),
W (OUT_FEATURES, IN_FEATURES), y (BATCH, OUT_FEATURES).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

# GEMM: 2 * 8192 * 1024 * 4096 = 68.7 GFLOP (~1.4 ms at 50 TFLOP/s FP32); epilogue: 2 passes over a 134 MB
# output (~0.1 ms). ~1.5 ms eager on an H100/H200.
BATCH = 8192
IN_FEATURES = 1024
OUT_FEATURES = 4096
SCALE = 0.5
SMALL_SIZES = {"BATCH": 32, "IN_FEATURES": 64, "OUT_FEATURES": 48}


class Model(nn.Module):
    def __init__(self, in_features, out_features, scale):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.scale = scale

    def forward(self, x):
        return F.gelu(self.linear(x)) * self.scale


def get_inputs():
    return [torch.randn(BATCH, IN_FEATURES)]


def get_init_inputs():
    return [IN_FEATURES, OUT_FEATURES, SCALE]
