"""Pre-norm transformer block with causal multi-head self-attention and a GELU MLP:
h = x + proj(attn(LN1(x))); y = h + W2 gelu(W1 LN2(h)) for x (BATCH, SEQ, D_MODEL), N_HEADS heads.
The reference builds an explicit (SEQ, SEQ) boolean mask on every call and runs softmax over full
(BATCH, N_HEADS, SEQ, SEQ) score tensors.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

# Linears: 2 * 8192 * 512 * (1536 + 512 + 2048 + 2048) = 51.5 GFLOP; attention: 4 * 8 * 8 * 1024^2 * 64 =
# 17.2 GFLOP; score tensors 268 MB each, ~6 passes (~1.6 GB). ~2.5-4 ms eager on an H100/H200.
BATCH = 8
SEQ = 1024
D_MODEL = 512
N_HEADS = 8
MLP_RATIO = 4
SMALL_SIZES = {"BATCH": 2, "SEQ": 16, "D_MODEL": 32, "N_HEADS": 4}


class Model(nn.Module):
    def __init__(self, d_model, n_heads, mlp_ratio):
        super().__init__()
        self.n_heads = n_heads
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc1 = nn.Linear(d_model, mlp_ratio * d_model)
        self.fc2 = nn.Linear(mlp_ratio * d_model, d_model)

    def attention(self, x):
        b, t, d = x.shape
        hd = d // self.n_heads
        q, k, v = self.qkv(x).split(d, dim=-1)
        q = q.view(b, t, self.n_heads, hd).transpose(1, 2)  # (B, H, T, hd)
        k = k.view(b, t, self.n_heads, hd).transpose(1, 2)
        v = v.view(b, t, self.n_heads, hd).transpose(1, 2)
        scores = q @ k.transpose(-2, -1) / math.sqrt(hd)  # (B, H, T, T)
        mask = torch.triu(torch.ones(t, t, device=x.device), diagonal=1).bool()
        scores = scores.masked_fill(mask, float("-inf"))
        out = torch.softmax(scores, dim=-1) @ v  # (B, H, T, hd)
        return self.proj(out.transpose(1, 2).reshape(b, t, d))

    def forward(self, x):
        h = x + self.attention(self.ln1(x))
        return h + self.fc2(F.gelu(self.fc1(self.ln2(h))))


def get_inputs():
    return [torch.randn(BATCH, SEQ, D_MODEL)]


def get_init_inputs():
    return [D_MODEL, N_HEADS, MLP_RATIO]
