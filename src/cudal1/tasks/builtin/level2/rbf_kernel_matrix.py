"""Gaussian (RBF) kernel matrix between two point sets: K[i, j] = exp(-gamma * ||x_i - y_j||^2) for
x (N_X, DIM), y (N_Y, DIM), K (N_X, N_Y). The reference materializes all pairwise differences (N_X, N_Y, DIM).
"""
import torch
import torch.nn as nn

# Pairwise differences: 2048*2048*64 = 268M elements (1.07 GB), squared into another 1.07 GB and reduced:
# ~4.3 GB moved, ~1-1.5 ms eager on an H100/H200. Via x.y^T it is a 0.5 GFLOP GEMM plus a 16 MB epilogue.
N_X = 2048
N_Y = 2048
DIM = 64
GAMMA = 1.0 / 64
SMALL_SIZES = {"N_X": 24, "N_Y": 20, "DIM": 8}


class Model(nn.Module):
    def __init__(self, gamma):
        super().__init__()
        self.gamma = gamma

    def forward(self, x, y):
        diff = x.unsqueeze(1) - y.unsqueeze(0)  # (N_X, N_Y, DIM)
        sq_dist = (diff * diff).sum(dim=-1)  # (N_X, N_Y)
        return torch.exp(-self.gamma * sq_dist)


def get_inputs():
    return [torch.randn(N_X, DIM), torch.randn(N_Y, DIM)]


def get_init_inputs():
    return [GAMMA]
