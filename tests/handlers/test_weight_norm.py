"""Weight normalisation (nn.utils.weight_norm, parametrizations.weight_norm): 3N + 2G FLOPs for
w = v * (g / ||v||), derived by hand (N elements of v, G of g), the same under every tracer."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from flopcount import count_flops


@pytest.mark.parametrize("tracer", ["auto", "jit", "dispatch"])
@pytest.mark.parametrize("parametrized", [False, True])
def test_weight_norm_linear(tracer: str, parametrized: bool) -> None:
    layer = nn.Linear(6, 4)
    if parametrized:
        layer = nn.utils.parametrizations.weight_norm(layer)
    else:
        layer = nn.utils.weight_norm(layer)  # the older hook-based form
    x = torch.randn(3, 5, 6).transpose(0, 1)  # batch > 1, 3-D, non-contiguous
    r = count_flops(layer, x, tracer=tracer)
    n, g = 4 * 6, 4
    assert r.unsupported_ops() == {}
    assert r.macs == 5 * 3 * 6 * 4
    assert r.by_operator()["aten::_weight_norm"] == 3 * n + 2 * g
