"""The toy stack of identical blocks the reuse and fake-copy tests count: ``Stack(n)`` runs ``n``
``Block``s in a ``ModuleList``, one after another. Each block is Linear(D, h) -> ReLU ->
Linear(h, D) + x: ``2 * D * h`` MACs per row (bias adds and the residual are not MACs), so a
stack of ``n`` blocks on a (B, D) input is ``n * B * 2 * D * h`` MACs."""

from __future__ import annotations

from torch import nn

B, D, H = 3, 8, 16  # batch (rows, > 1), width, inner width


class Block(nn.Module):
    def __init__(self, hidden: int = H) -> None:
        super().__init__()
        self.up = nn.Linear(D, hidden)
        self.act = nn.ReLU()
        self.down = nn.Linear(hidden, D)

    def forward(self, x):
        return self.down(self.act(self.up(x))) + x


class Stack(nn.Module):
    def __init__(self, n: int = 8, hidden: int = H) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(hidden) for _ in range(n))

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x
