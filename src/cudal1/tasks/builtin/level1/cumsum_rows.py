"""Inclusive prefix sum along each row: y = cumsum(x, dim=1) for x (BATCH, DIM)."""
import torch
import torch.nn as nn

# 268M elements, 1.07 GB in + 1.07 GB out: ~0.5-1 ms on an H100/H200.
BATCH = 32768
DIM = 8192
SMALL_SIZES = {"BATCH": 16, "DIM": 100}


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.cumsum(x, dim=1)


def get_inputs():
    return [torch.randn(BATCH, DIM)]


def get_init_inputs():
    return []
