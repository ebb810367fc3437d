"""A custom ``autograd.Function`` under the jit tracer (issue #9, the nn zoo's CrossMapLRN2d).

jit records the Function as one ``prim::PythonOp`` node and keeps the ops its forward ran
in the node's ``Subgraph``; the jit tracer counts those, so jit, dispatch and auto agree.
The oracles are formulas written out here from the Functions' own code.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from flopcount import count_flops

TRACERS = ("jit", "dispatch", "auto")


def _lrn_flops(n: int, c: int, h: int, w: int, size: int) -> int:
    """torch.nn.modules._functions.CrossMapLRN2d.forward, op by op."""
    numel, plane = n * c * h * w, n * h * w
    pre_pad = int((size - 1) / 2 + 1)
    first = min(pre_pad, c)  # scale_first.add_ per channel of the first window
    slide = sum(1 for ch in range(1, c) if ch < c - pre_pad + 1) + sum(1 for ch in range(1, c) if ch > pre_pad)
    # pow(x, 2); the window adds; scale.mul_ and add_(k); pow(scale, -beta); mul_(input)
    return numel + plane * (first + slide) + 2 * numel + numel + numel


@pytest.mark.parametrize("tracer", TRACERS)
@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("size,channels", [(3, 4), (5, 7)])
def test_cross_map_lrn2d(tracer: str, train: bool, size: int, channels: int) -> None:
    x = torch.randn(3, channels, 5, 4).transpose(2, 3)  # batch 3, non-contiguous
    model = nn.Sequential(nn.Conv2d(channels, channels, 1), nn.CrossMapLRN2d(size)).train(train)
    result = count_flops(model, (x,), tracer=tracer)
    conv = 3 * channels * 20 * channels
    assert result.macs == conv
    assert result.unsupported_ops() == {}
    assert result.by_module()["1"] == _lrn_flops(3, channels, 4, 5, size)


class _Scaled(torch.autograd.Function):
    """y = exp(x @ w) * 2: the MACs and FLOPs of its forward are known by hand."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return (x @ w).exp() * 2

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        return grad, None


class _UsesFunction(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(6, 5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _Scaled.apply(x, self.w)


@pytest.mark.parametrize("tracer", TRACERS)
def test_function_body_counted_under_every_tracer(tracer: str) -> None:
    x = torch.randn(2, 6, 4).transpose(1, 2)  # (2, 4, 6), non-contiguous
    result = count_flops(_UsesFunction(), (x,), tracer=tracer)
    out = 2 * 4 * 5
    assert result.macs == out * 6
    assert result.flops == 2 * out * 6 + out + out  # matmul, exp, mul
    assert result.unsupported_ops() == {}
