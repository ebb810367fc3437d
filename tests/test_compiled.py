"""A torch.compile'd module counts like the module it wraps: same numbers, original module
names (no ``_orig_mod.`` prefix), no compilation and no torch warning reaching the user."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from flopcount import count_flops


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))


@pytest.mark.parametrize("tracer", ["auto", "jit", "dispatch"])
def test_compiled_module_counts_like_its_original(tracer):
    torch.manual_seed(0)
    model = _mlp().eval()
    x = torch.randn(3, 16)
    compiled = torch.compile(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no torch warning about global hooks may reach the user
        r = count_flops(compiled, x, tracer=tracer)
    assert r.macs == 3 * (16 * 32 + 32 * 4)  # hand formula: batch x (in x out) per Linear
    assert set(r.by_module()) == {"", "0", "1", "2"}
    assert r.by_module("macs")["0"] == 3 * 16 * 32
