"""A ViT-B/16-shaped encoder (Dosovitskiy et al., 2020): patch conv, class token,
pre-norm blocks with nn.MultiheadAttention, GELU MLP. ``vit_tiny`` is a small one."""

from __future__ import annotations

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, mlp: int):
        super().__init__()
        self.ln_1 = nn.LayerNorm(dim, eps=1e-6)
        self.self_attention = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.ln_2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp), nn.GELU(), nn.Linear(mlp, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.ln_1(x)
        x = x + self.self_attention(y, y, y, need_weights=False)[0]
        return x + self.mlp(self.ln_2(x))


class VisionTransformer(nn.Module):
    def __init__(self, image: int = 224, patch: int = 16, dim: int = 768, depth: int = 12, heads: int = 12, mlp: int = 3072, num_classes: int = 1000):
        super().__init__()
        self.conv_proj = nn.Conv2d(3, dim, patch, patch)
        tokens = (image // patch) ** 2 + 1
        self.class_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embedding = nn.Parameter(torch.randn(1, tokens, dim) * 0.02)
        self.layers = nn.Sequential(*(Block(dim, heads, mlp) for _ in range(depth)))
        self.ln = nn.LayerNorm(dim, eps=1e-6)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv_proj(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.class_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embedding
        return self.head(self.ln(self.layers(x))[:, 0])


def vit_b_16() -> VisionTransformer:
    return VisionTransformer()


def vit_tiny() -> VisionTransformer:
    return VisionTransformer(image=32, patch=8, dim=64, depth=2, heads=4, mlp=128, num_classes=10)


__all__ = ["Block", "VisionTransformer", "vit_b_16", "vit_tiny"]
