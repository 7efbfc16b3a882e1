"""Square matrix product: C = A @ B for A (N, N), B (N, N)."""
import torch
import torch.nn as nn

# 2 N^3 = 137 GFLOP: ~2.7 ms at ~50 TFLOP/s FP32 (no TF32) on an H100/H200; 201 MB moved.
N = 4096
SMALL_SIZES = {"N": 64}


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return torch.matmul(a, b)


def get_inputs():
    return [torch.randn(N, N), torch.randn(N, N)]


def get_init_inputs():
    return []
