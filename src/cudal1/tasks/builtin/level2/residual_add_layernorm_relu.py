"""Residual add, layer normalization, ReLU: y = relu(LayerNorm(x + r)) for x, r (BATCH, DIM)."""
import torch
import torch.nn as nn

# 134M elements per tensor (537 MB). Eager: add (2r+w), layer_norm (r+w), relu (r+w) = 7 passes, ~3.8 GB,
# ~0.9-1.1 ms on an H100/H200; a fused kernel reads 2 and writes 1 (~1.6 GB, ~0.4 ms).
BATCH = 16384
DIM = 8192
SMALL_SIZES = {"BATCH": 32, "DIM": 256}


class Model(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        with torch.no_grad():  # non-trivial affine parameters, so a kernel that ignores them fails
            self.norm.weight.add_(0.1 * torch.randn(dim))
            self.norm.bias.add_(0.1 * torch.randn(dim))

    def forward(self, x, r):
        return torch.relu(self.norm(x + r))


def get_inputs():
    return [torch.randn(BATCH, DIM), torch.randn(BATCH, DIM)]


def get_init_inputs():
    return [DIM]
