"""RMS normalization over the last dimension with a learned scale, written as plain tensor ops:
y = x * rsqrt(mean(x^2, -1) + eps) * weight for x (BATCH, DIM), weight (DIM,).
"""
import torch
import torch.nn as nn

# 268M elements. Eager: pow (r+w), mean (r), add/rsqrt (tiny), mul (r+w), mul (r+w) = 7 full passes, ~7.5 GB,
# ~1.8 ms on an H100/H200; a fused kernel reads the row once or twice and writes once (~0.5-0.75 ms).
BATCH = 32768
DIM = 8192
EPS = 1e-6
SMALL_SIZES = {"BATCH": 32, "DIM": 256}


class Model(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim) + 0.1 * torch.randn(dim))

    def forward(self, x):
        inv_rms = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return x * inv_rms * self.weight


def get_inputs():
    return [torch.randn(BATCH, DIM)]


def get_init_inputs():
    return [DIM, EPS]
