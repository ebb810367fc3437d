"""Backward ops the profile zoo found without a handler (#21's zoo run): hardshrink,
softshrink, PReLU and weight norm, counted by the formulas of docs/conventions.md."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from flopcount import count_flops


@pytest.mark.parametrize("layer, per_element", [(nn.Hardshrink(0.5), 1), (nn.Softshrink(0.5), 1)])
@pytest.mark.parametrize("tracer", ["auto", "dispatch"])
def test_shrink_backward_is_one_select_per_element(layer, per_element, tracer):
    x = torch.randn(3, 4, 5, requires_grad=True)
    r = count_flops(layer, x, tracer=tracer, backward=True)
    name = f"aten::{type(layer).__name__.lower()}_backward"
    assert r.unsupported_ops() == {}
    assert r.by_operator()[name] == per_element * x.numel()


@pytest.mark.parametrize("tracer", ["auto", "dispatch"])
def test_prelu_backward_is_four_per_element(tracer):
    x = torch.randn(2, 3, 4, 4, requires_grad=True)
    r = count_flops(nn.PReLU(3), x, tracer=tracer, backward=True)
    assert r.unsupported_ops() == {}
    assert r.by_operator()["aten::_prelu_kernel_backward"] == 4 * x.numel()


@pytest.mark.parametrize("tracer", ["auto", "dispatch"])
def test_weight_norm_backward_is_5n_plus_4g(tracer):
    conv = nn.utils.parametrizations.weight_norm(nn.Conv1d(4, 6, 3), dim=0)
    x = torch.randn(2, 4, 10)
    r = count_flops(conv, x, tracer=tracer, backward=True)
    n, g = 6 * 4 * 3, 6  # v's elements, g's (one norm per output channel)
    assert r.unsupported_ops() == {}
    assert r.by_operator()["aten::_weight_norm_interface_backward"] == 5 * n + 4 * g
