"""Bad input gets a clear error that names what is wrong and where."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import flopcount
from flopcount import Cost, HandlerError, TraceError, UnsupportedOpError, UsageError, count_flops


class Inner(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return self.fc(x)


class Outer(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.Sequential(Inner(), Inner())
        self.blocks[1].fc = nn.Linear(5, 4)  # wrong in_features: fails in blocks.1.fc

    def forward(self, x):
        return self.blocks(x)


def test_forward_failure_names_module_path_and_inputs():
    with pytest.raises(TraceError) as info:
        count_flops(Outer(), torch.randn(2, 4))
    message = str(info.value)
    assert "blocks.1.fc" in message
    assert "Tensor[2, 4] float32" in message
    assert info.value.module_path == "blocks.1.fc"
    assert isinstance(info.value.__cause__, RuntimeError)


def test_not_a_module():
    with pytest.raises(UsageError, match="nn.Module"):
        count_flops(lambda x: x, torch.randn(2))  # type: ignore[arg-type]


def test_unknown_tracer():
    with pytest.raises(UsageError, match="tracer must be one of"):
        count_flops(nn.Linear(2, 2), torch.randn(1, 2), tracer="fx")


def test_kwargs_must_be_mapping():
    with pytest.raises(UsageError, match="kwargs"):
        count_flops(nn.Linear(2, 2), torch.randn(1, 2), kwargs=[1, 2])  # type: ignore[arg-type]


class UsesUnknownOp(nn.Module):
    def forward(self, x):
        return torch.special.zeta(x, torch.full_like(x, 2.0))


def test_unsupported_op_is_reported_not_zero():
    r = count_flops(UsesUnknownOp(), torch.rand(3, 3) + 1)
    assert r.unsupported_ops() == {"aten::special_zeta": 1}
    assert "NOT counted" in r.table()
    assert "aten::special_zeta" in r.table()
    with pytest.raises(UnsupportedOpError, match="aten::special_zeta"):
        count_flops(UsesUnknownOp(), torch.rand(3, 3) + 1, strict=True)


def test_per_call_handler_override_and_known_zero():
    r = count_flops(UsesUnknownOp(), torch.rand(3, 3) + 1, handlers={"aten::special_zeta": lambda c: Cost.from_flops(7 * c.out().numel)})
    assert r.flops == 7 * 9
    assert r.unsupported_ops() == {}
    r0 = count_flops(UsesUnknownOp(), torch.rand(3, 3) + 1, handlers={"aten::special_zeta": None})
    assert r0.flops == 0 and r0.unsupported_ops() == {}
    # the default registry is untouched by per-call overrides
    assert flopcount.default_registry().resolve("aten::special_zeta") is None


def test_handler_failure_names_op_and_module():
    def broken(call):
        raise ValueError("bad shape")

    with pytest.raises(HandlerError) as info:
        count_flops(Outer().blocks[0], torch.randn(2, 4), tracer="jit", handlers={"aten::linear": broken})
    assert "aten::linear" in str(info.value) and "fc" in str(info.value)


def test_register_handler_duplicate_is_an_error():
    registry = flopcount.default_registry().copy()
    with pytest.raises(flopcount.errors.DuplicateHandlerError):
        registry.register("aten::mm", lambda c: Cost())
    registry.register("aten::mm", lambda c: Cost(1, 2), replace=True)
    assert registry.resolve("aten::mm")(None) == Cost(1, 2)  # type: ignore[misc]
    assert flopcount.default_registry().resolve("aten::mm") is not registry.resolve("aten::mm")


def test_bad_op_name():
    with pytest.raises(UsageError, match="aten::addmm"):
        flopcount.default_registry().copy().register("addmm", lambda c: Cost())
