"""The operator vocabulary's contract: renames land on handled names, a split cost is
booked under the ops it names, and the interceptor leaves no mode behind."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.overrides import _get_current_function_mode_stack

from flopcount import Cost, count_flops
from flopcount.core.registry import KNOWN_ZERO
from flopcount.errors import TraceError
from flopcount.handlers import attention, default_registry
from flopcount.tracers import _vocabulary

# renamed for agreement before their handler exists (issue #9.8 adds it): reported as
# unsupported under one name by both tracers
PENDING = {"aten::cdist"}


def test_every_canonical_name_has_a_handler() -> None:
    registry = default_registry()
    for name, _ in _vocabulary.CANONICAL.values():
        if name not in PENDING:
            assert registry.resolve(name) not in (None, KNOWN_ZERO), name


def test_the_dispatch_mha_op_name_is_the_one_its_handler_is_registered_for() -> None:
    assert _vocabulary.MHA_OP == attention.MHA_OP
    assert default_registry().resolve(attention.MHA_OP) is not None


def test_a_split_cost_is_booked_under_the_ops_it_names_one_call_each() -> None:
    class Fused(nn.Module):
        def forward(self, x):
            return torch.ops.aten.hardshrink(x)  # stands in for a fused kernel

    def split(call):
        rows, n = call.tensor("self").shape
        return Cost.split(("aten::linear", Cost.from_macs(rows * n * n)), ("aten::gelu", Cost.from_flops(5 * rows * n)))

    x = torch.randn(3, 4)
    r = count_flops(Fused(), x, tracer="dispatch", handlers={"aten::hardshrink": split})
    assert r.by_operator("macs") == {"aten::linear": 48, "aten::gelu": 0}
    assert r.by_operator("flops") == {"aten::linear": 96, "aten::gelu": 60}
    assert r.by_operator("count") == {"aten::linear": 1, "aten::gelu": 1}
    assert (r.macs, r.flops) == (48, 156)


def test_split_costs_add_up_and_refuse_an_unnamed_addend() -> None:
    a = Cost.split(("aten::linear", Cost.from_macs(3)))
    b = Cost.split(("aten::relu", Cost.from_flops(2)), ("aten::linear", Cost.from_macs(1)))
    total = a + b
    assert (total.macs, total.flops) == (4, 10) and [op for op, _ in total.parts] == ["aten::linear", "aten::relu", "aten::linear"]
    assert a + Cost() == a
    with pytest.raises(ValueError, match="split"):
        a + Cost.from_flops(1)


def test_no_function_mode_is_left_behind_also_when_the_forward_raises() -> None:
    class Boom(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            return self.lin(x).view(-1, 7)

    count_flops(nn.Linear(4, 2), torch.randn(3, 4), tracer="dispatch")
    assert _get_current_function_mode_stack() == []
    with pytest.raises(TraceError):
        count_flops(Boom(), torch.randn(3, 4), tracer="dispatch")
    assert _get_current_function_mode_stack() == []
