"""3x3 convolution, 2x2 max pooling, then sigmoid: x (BATCH, C_IN, HEIGHT, WIDTH) ->
y (BATCH, C_OUT, HEIGHT/2, WIDTH/2).
"""
import torch
import torch.nn as nn

# Conv: 2 * 64*128*128 * 64 * 16*9 = 19.3 GFLOP (~0.5-1.5 ms); conv output 268 MB, pooled 67 MB.
BATCH = 64
C_IN = 16
C_OUT = 64
HEIGHT = 128
WIDTH = 128
SMALL_SIZES = {"BATCH": 2, "C_IN": 3, "C_OUT": 6, "HEIGHT": 12, "WIDTH": 16}


class Model(nn.Module):
    def __init__(self, c_in, c_out):
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, kernel_size=3, padding=1)
        self.pool = nn.MaxPool2d(kernel_size=2)

    def forward(self, x):
        return torch.sigmoid(self.pool(self.conv(x)))


def get_inputs():
    return [torch.randn(BATCH, C_IN, HEIGHT, WIDTH)]


def get_init_inputs():
    return [C_IN, C_OUT]
