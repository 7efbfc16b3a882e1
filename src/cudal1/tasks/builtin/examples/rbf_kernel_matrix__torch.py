"""PyTorch candidate for builtin/level2/rbf_kernel_matrix: squared distances through one GEMM.

||x_i - y_j||^2 = ||x_i||^2 + ||y_j||^2 - 2 x_i . y_j, so one addmm (beta = 1, alpha = -2) over the
(N_X, N_Y) matrix of squared norms replaces the (N_X, N_Y, DIM) difference tensor and its square. Rounding can
make tiny distances slightly negative, so they are clamped at 0 before exp(-gamma * d), computed in place.
At full size (|x|^2 ~ 64, d ~ 128) the cancellation error is ~1e-5 in d, ~1e-8 in the kernel value.
"""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, gamma):
        super().__init__()
        self.gamma = gamma

    def forward(self, x, y):
        x_sq = (x * x).sum(dim=-1, keepdim=True)  # (N_X, 1)
        y_sq = (y * y).sum(dim=-1).unsqueeze(0)  # (1, N_Y)
        sq_dist = torch.addmm(x_sq + y_sq, x, y.t(), beta=1.0, alpha=-2.0)  # (N_X, N_Y)
        return sq_dist.clamp_min_(0.0).mul_(-self.gamma).exp_()
