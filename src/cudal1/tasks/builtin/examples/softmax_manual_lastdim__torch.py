"""PyTorch candidate for builtin/level1/softmax_manual_lastdim: call the library softmax instead of five passes.

The reference computes max, x - max, exp, sum and a division as separate ops with three full-size
intermediates. torch.softmax computes the same max-shifted exponentials in a fused kernel (one or two reads,
one write) on both CPU and GPU, so it is several times faster and equal within FP32 rounding.
"""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.softmax(x, dim=-1)
