"""Batched matrix product: C = bmm(A, B) for A (BATCH, M, K), B (BATCH, K, N)."""
import torch
import torch.nn as nn

# 2 BATCH M K N = 68.7 GFLOP: ~1.4 ms at 50 TFLOP/s FP32; 671 MB moved.
BATCH = 128
M = 512
K = 1024
N = 512
SMALL_SIZES = {"BATCH": 4, "M": 16, "K": 32, "N": 24}


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return torch.bmm(a, b)


def get_inputs():
    return [torch.randn(BATCH, M, K), torch.randn(BATCH, K, N)]


def get_init_inputs():
    return []
