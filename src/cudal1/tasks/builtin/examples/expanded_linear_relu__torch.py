"""PyTorch candidate for builtin/level2/expanded_linear_relu: the broadcast-and-sum is a matrix product.

sum_k x[b, k] * W[o, k] is exactly (x @ W^T)[b, o], so F.linear (one GEMM with the bias fused) replaces the
(BATCH, IN, OUT) intermediate (2.15 GB at full size) and its reduction; relu is applied in place on the fresh
GEMM output. Orders of magnitude less memory traffic on CPU and GPU; FP32 GEMM (PyTorch's default, no TF32).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        return torch.relu_(F.linear(x, self.linear.weight, self.linear.bias))
