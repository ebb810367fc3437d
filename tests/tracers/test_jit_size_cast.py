"""``F.interpolate(..., recompute_scale_factor=True)`` under ``tracer="jit"``: torch's trace-only
branch computes each output size as ``floor(size.float() * torch.tensor(scale))``, tensor ops on
a traced size that eager runs as Python numbers (``math.floor(float(size) * scale)``): the
dispatch tracer never sees them, and jit counted a multiply and a floor per spatial dim (+4 FLOPs
for a 2-D resize, 1,804 against 1,800). The ``.float()`` there is called on the size itself,
which eager cannot do (an int has no ``.float()``); a user's own conversion of a size
(``torch.tensor(n).float()``, ``torch.as_tensor``, ``new_tensor``) makes a real tensor whose ops
eager runs, and stays counted. Oracle: the hand counts of docs/conventions.md (bilinear 3 lerps
of 3 FLOPs per output element, trilinear 7), one FLOP per scalar op of the user's code."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from flopcount import count_flops

TRACERS = ["auto", "dispatch", "jit"]
LERP = 3


class Resize(nn.Module):
    def __init__(self, mode: str, scale: float) -> None:
        super().__init__()
        self.mode, self.scale = mode, scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.interpolate(x, scale_factor=self.scale, mode=self.mode, recompute_scale_factor=True)


@pytest.mark.parametrize("tracer", TRACERS)
def test_bilinear_recompute_scale_factor(tracer: str) -> None:
    x = torch.randn(1, 2, 6, 7)
    out = 1 * 2 * 10 * 11  # floor(6 * 1.7), floor(7 * 1.7)
    assert count_flops(Resize("bilinear", 1.7), (x,), tracer=tracer).flops == 3 * LERP * out


@pytest.mark.parametrize("tracer", TRACERS)
def test_trilinear_recompute_scale_factor(tracer: str) -> None:
    x = torch.randn(1, 1, 3, 4, 5)
    out = 4 * 6 * 7  # floor(3 * 1.5), floor(4 * 1.5), floor(5 * 1.5)
    assert count_flops(Resize("trilinear", 1.5), (x,), tracer=tracer).flops == 7 * LERP * out


class TensorOfSize(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # eager: torch.tensor(7) is a real tensor; float, multiply, floor, then x * it
        return x * (torch.tensor(x.size(-1)).float() * torch.tensor(1.5)).floor()


class AsTensorOfSize(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.as_tensor(x.size(-1)).float().sqrt()


class NewTensorOfSize(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * x.new_tensor(x.size(-1)).float().sqrt()


@pytest.mark.parametrize("tracer", TRACERS)
@pytest.mark.parametrize(
    ("model", "scalar_ops"),
    [(TensorOfSize(), 2), (AsTensorOfSize(), 1), (NewTensorOfSize(), 1)],
    ids=["tensor", "as_tensor", "new_tensor"],
)
def test_a_users_conversion_of_a_size_stays_counted(model: nn.Module, scalar_ops: int, tracer: str) -> None:
    x = torch.randn(2, 3, 7)
    assert count_flops(model, (x,), tracer=tracer).flops == x.numel() + scalar_ops
