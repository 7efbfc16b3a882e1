"""Depthwise 3x3 convolution (groups = channels), stride 1, padding 1, with bias, for
x (BATCH, CHANNELS, HEIGHT, WIDTH) -> y of the same shape.
"""
import torch
import torch.nn as nn

# 134M elements: 537 MB in + 537 MB out (~0.25 ms of traffic), 2.4 GFLOP; depthwise kernels rarely reach
# bandwidth, so ~0.5-1.5 ms eager on an H100/H200.
BATCH = 32
CHANNELS = 256
HEIGHT = 128
WIDTH = 128
SMALL_SIZES = {"BATCH": 2, "CHANNELS": 8, "HEIGHT": 12, "WIDTH": 14}


class Model(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, kernel_size=3, padding=1, groups=channels)

    def forward(self, x):
        return self.conv(x)


def get_inputs():
    return [torch.randn(BATCH, CHANNELS, HEIGHT, WIDTH)]


def get_init_inputs():
    return [CHANNELS]
