"""Small models the API tests count by hand."""

import torch
from torch import nn


class Mlp(nn.Module):
    """Linear 16 -> 32, ReLU, Linear 32 -> 8: 16*32 + 32*8 = 768 MACs per row."""

    def __init__(self):
        super().__init__()
        self.l1 = nn.Linear(16, 32)
        self.l2 = nn.Linear(32, 8)

    def forward(self, x):
        return self.l2(torch.relu(self.l1(x)))
