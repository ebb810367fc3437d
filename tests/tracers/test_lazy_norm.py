"""Lazy norm layers (uninitialised parameters *and* buffers) count under every tracer and stay
lazy; FLOPs by the norm formula of docs/conventions.md, derived by hand: with batch statistics
4N + 2C + 2N + 2C + 2N (affine), with running statistics 2N + 2C + 2N."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn.parameter import UninitializedBuffer, UninitializedParameter

from flopcount import count_flops


@pytest.mark.parametrize("tracer", ["auto", "jit", "dispatch"])
@pytest.mark.parametrize("train", [True, False])
def test_lazy_batch_norm_counts_and_stays_lazy(tracer: str, train: bool) -> None:
    model = nn.LazyBatchNorm2d().train(train)
    x = torch.randn(4, 5, 5, 3).permute(0, 3, 1, 2)  # batch 4, C = 3, non-contiguous
    n, c = x.numel(), 3
    r = count_flops(model, x, tracer=tracer)
    expected = (4 * n + 2 * c) + (2 * n + 2 * c) + 2 * n if train else (2 * n + 2 * c) + 2 * n
    assert r.flops == expected and r.complete
    assert type(model) is nn.LazyBatchNorm2d
    assert isinstance(model.weight, UninitializedParameter) and isinstance(model.running_mean, UninitializedBuffer)
