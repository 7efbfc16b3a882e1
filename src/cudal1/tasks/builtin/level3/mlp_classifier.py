"""Three-layer MLP classifier: y = L3(relu(L2(relu(L1(x))))) for x (BATCH, IN_FEATURES),
y (BATCH, NUM_CLASSES), with hidden width HIDDEN.
"""
import torch
import torch.nn as nn

# 2 * 8192 * (1024*4096 + 4096*4096 + 4096*1000) = 412 GFLOP: ~8 ms at 50 TFLOP/s FP32 on an H100/H200.
BATCH = 8192
IN_FEATURES = 1024
HIDDEN = 4096
NUM_CLASSES = 1000
SMALL_SIZES = {"BATCH": 16, "IN_FEATURES": 32, "HIDDEN": 64, "NUM_CLASSES": 10}


class Model(nn.Module):
    def __init__(self, in_features, hidden, num_classes):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(in_features, hidden),
            nn.ReLU(),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Linear(hidden, num_classes),
        )

    def forward(self, x):
        return self.net(x)


def get_inputs():
    return [torch.randn(BATCH, IN_FEATURES)]


def get_init_inputs():
    return [IN_FEATURES, HIDDEN, NUM_CLASSES]
