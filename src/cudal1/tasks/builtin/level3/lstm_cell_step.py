"""One LSTM cell time step written with two linear layers: gates = x W_ih^T + b_ih + h W_hh^T + b_hh, split into
(i, f, g, o); c' = sigmoid(f) * c + sigmoid(i) * tanh(g); h' = sigmoid(o) * tanh(c'). Inputs x (BATCH, INPUT),
h and c (BATCH, HIDDEN); returns the tuple (h', c').
"""
import torch
import torch.nn as nn

# GEMMs: 2 * 4096 * (1024 + 1024) * 4096 = 68.7 GFLOP (~1.4 ms at 50 TFLOP/s FP32); gate math: ~10 eager
# kernels over 16-64 MB tensors (~0.2 ms). ~1.6-2 ms eager on an H100/H200.
BATCH = 4096
INPUT_SIZE = 1024
HIDDEN = 1024
SMALL_SIZES = {"BATCH": 8, "INPUT_SIZE": 16, "HIDDEN": 12}


class Model(nn.Module):
    def __init__(self, input_size, hidden):
        super().__init__()
        self.ih = nn.Linear(input_size, 4 * hidden)
        self.hh = nn.Linear(hidden, 4 * hidden)

    def forward(self, x, h, c):
        gates = self.ih(x) + self.hh(h)  # (BATCH, 4*HIDDEN)
        i, f, g, o = gates.chunk(4, dim=1)
        c_next = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h_next = torch.sigmoid(o) * torch.tanh(c_next)
        return h_next, c_next


def get_inputs():
    return [torch.randn(BATCH, INPUT_SIZE), torch.randn(BATCH, HIDDEN), torch.randn(BATCH, HIDDEN)]


def get_init_inputs():
    return [INPUT_SIZE, HIDDEN]
