"""Linear layer computed through an explicit broadcast, then ReLU:
y = relu(sum_k x[:, k, None] * W^T[None, k, :] + b) for x (BATCH, IN_FEATURES), y (BATCH, OUT_FEATURES).
The reference materializes the (BATCH, IN_FEATURES, OUT_FEATURES) product tensor before reducing it.
"""
import torch
import torch.nn as nn

# The broadcast product is 2048*512*512 = 537M elements (2.15 GB) written then read: ~1-1.5 ms eager on an
# H100/H200, while the same math as a GEMM is 1.07 GFLOP (~0.03 ms).
BATCH = 2048
IN_FEATURES = 512
OUT_FEATURES = 512
SMALL_SIZES = {"BATCH": 16, "IN_FEATURES": 24, "OUT_FEATURES": 20}


class Model(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        w_t = self.linear.weight.t()  # (IN, OUT)
        prod = x.unsqueeze(2) * w_t.unsqueeze(0)  # (BATCH, IN, OUT)
        return torch.relu(prod.sum(dim=1) + self.linear.bias)


def get_inputs():
    return [torch.randn(BATCH, IN_FEATURES)]


def get_init_inputs():
    return [IN_FEATURES, OUT_FEATURES]
