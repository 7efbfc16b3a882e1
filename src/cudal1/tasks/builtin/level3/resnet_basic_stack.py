"""A stack of ResNet basic blocks at constant width: each block is y = relu(x + BN(conv3x3(relu(BN(conv3x3(x))))))
with batch normalization in training mode; x (BATCH, CHANNELS, SIZE, SIZE) -> same shape.
"""
import torch
import torch.nn as nn

# Each conv: 2 * 64*56*56 * 64 * 64*9 = 14.8 GFLOP; 3 blocks = 6 convs = 89 GFLOP, ~20 BN/ReLU/add passes over
# 51 MB activations: ~2 ms eager on an H200 with cuDNN's default TF32-allowed path (0.97 ms at BATCH = 32).
BATCH = 64
CHANNELS = 64
SIZE = 56
NUM_BLOCKS = 3
SMALL_SIZES = {"BATCH": 2, "CHANNELS": 4, "SIZE": 8, "NUM_BLOCKS": 2}


class BasicBlock(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, kernel_size=3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, kernel_size=3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(x + self.bn2(self.conv2(y)))


class Model(nn.Module):
    def __init__(self, channels, num_blocks):
        super().__init__()
        self.blocks = nn.Sequential(*[BasicBlock(channels) for _ in range(num_blocks)])

    def forward(self, x):
        return self.blocks(x)


def get_inputs():
    return [torch.randn(BATCH, CHANNELS, SIZE, SIZE)]


def get_init_inputs():
    return [CHANNELS, NUM_BLOCKS]
