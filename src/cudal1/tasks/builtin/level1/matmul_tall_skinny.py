"""Tall-skinny matrix product: C = A @ B for A (M, K), B (K, N) with M much larger than K and N."""
import torch
import torch.nn as nn

# 2 M K N = 69 GFLOP (~1.4 ms at 50 TFLOP/s); A is 537 MB, C 268 MB (~0.2 ms of traffic): ~1.5 ms
# (measured 0.78 ms at M = 131072 on an H200).
M = 262144
K = 512
N = 256
SMALL_SIZES = {"M": 256, "K": 32, "N": 16}


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return torch.matmul(a, b)


def get_inputs():
    return [torch.randn(M, K), torch.randn(K, N)]


def get_init_inputs():
    return []
