"""Softmax over the last dimension written out by hand, for x (BATCH, DIM):
m = max(x, -1); e = exp(x - m); y = e / sum(e, -1). Same result as softmax(x, dim=-1), computed in five passes.
"""
import torch
import torch.nn as nn

# 134M elements (537 MB). Eager: max (r), sub (r+w), exp (r+w), sum (r), div (r+w) = 8 full passes, ~4.3 GB,
# ~1.0-1.3 ms on an H100/H200; one fused pass moves ~1.07 GB (~0.25 ms).
BATCH = 16384
DIM = 8192
SMALL_SIZES = {"BATCH": 32, "DIM": 300}


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        m = x.max(dim=-1, keepdim=True).values
        e = torch.exp(x - m)
        return e / e.sum(dim=-1, keepdim=True)


def get_inputs():
    return [torch.randn(BATCH, DIM)]


def get_init_inputs():
    return []
