"""Linear layer, layer normalization over the features, then swish: h = LayerNorm(x @ W^T + b);
y = h * sigmoid(h) for x (BATCH, IN_FEATURES), y (BATCH, OUT_FEATURES).
"""
import torch
import torch.nn as nn

# GEMM: 2 * 65536 * 256 * 1024 = 34 GFLOP (~0.7 ms); output 268 MB. Eager epilogue: layer_norm (r+w),
# sigmoid (r+w), mul (2r+w) = 7 passes, ~1.9 GB (~0.45 ms). ~1.5 ms eager on an H200 (0.75 ms at half the
# batch); a fused LN+swish pass saves ~0.3 ms.
BATCH = 65536
IN_FEATURES = 256
OUT_FEATURES = 1024
SMALL_SIZES = {"BATCH": 32, "IN_FEATURES": 40, "OUT_FEATURES": 64}


class Model(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.norm = nn.LayerNorm(out_features)

    def forward(self, x):
        h = self.norm(self.linear(x))
        return h * torch.sigmoid(h)


def get_inputs():
    return [torch.randn(BATCH, IN_FEATURES)]


def get_init_inputs():
    return [IN_FEATURES, OUT_FEATURES]
