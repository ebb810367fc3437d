"""A module whose forward is one function: how the handler sweeps' tests hand a bare op to every tracer."""

from __future__ import annotations

from torch import nn

TRACERS = ["auto", "dispatch", "jit"]


class Fn(nn.Module):
    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)
