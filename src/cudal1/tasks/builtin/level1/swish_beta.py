"""Swish with a fixed slope: y = x * sigmoid(beta * x) for x (BATCH, DIM), beta a constructor float."""
import torch
import torch.nn as nn

# 268M elements, 1.07 GB in + 1.07 GB out. Eager runs 3 kernels (mul, sigmoid, mul): ~7.5 GB moved, ~1.8 ms
# on an H100/H200; the ideal fused pass moves 2.15 GB (~0.5 ms).
BATCH = 16384
DIM = 16384
BETA = 1.702
SMALL_SIZES = {"BATCH": 64, "DIM": 128}


class Model(nn.Module):
    def __init__(self, beta):
        super().__init__()
        self.beta = beta

    def forward(self, x):
        return x * torch.sigmoid(self.beta * x)


def get_inputs():
    return [torch.randn(BATCH, DIM)]


def get_init_inputs():
    return [BETA]
