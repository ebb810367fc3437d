"""``torch.export.export(...).module()`` (issue #20, item 10): its graph calls aten ops
directly (``torch.ops.aten.linear.default``...), and its class is made per instance. The
default tracer counts it on fake copies (no real run, no fallback note), and every
tracer gives the eager model's numbers under the eager model's operator names. Oracles:
FlopCounterMode on the eager model (contraction FLOPs, forward and a plain backward) and
the hand-derived MACs."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import assert_same_state, snapshot
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from flopcount import count_flops

B, T, D = 2, 5, 16


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln, self.qk = nn.LayerNorm(D), nn.Linear(D, 2 * D)
        self.mlp = nn.Sequential(nn.Linear(D, 32), nn.GELU(), nn.Dropout(0.1), nn.Linear(32, D))
        self.bn = nn.BatchNorm1d(D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k = self.qk(self.ln(x)).chunk(2, dim=-1)
        x = x + (q @ k.transpose(1, 2)).softmax(-1) @ x
        x = x + self.mlp(x)
        return self.bn(x.transpose(1, 2)).transpose(1, 2)


FORWARD_MACS = B * T * D * 2 * D + 2 * B * T * T * D + B * T * (D * 32 + 32 * D)  # qk, two bmm, mlp


def fcm_flops(model: nn.Module, x: torch.Tensor, backward: bool) -> int:
    model = copy.deepcopy(model)
    counter = FlopCounterMode(display=False)
    with counter:
        out = model(x.clone())
        if backward:
            out.sum().backward()
    return int(counter.get_total_flops())


def exported(model: nn.Module, x: torch.Tensor) -> nn.Module:
    return torch.export.export(copy.deepcopy(model), (x,)).module()


@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("tracer", ["auto", "dispatch", "jit"])
def test_exported_module_counts_as_the_eager_model(tracer, train):
    torch.manual_seed(0)
    model = Net().train(train)
    x = torch.randn(B, T, D)
    module = exported(model, x)
    before = snapshot(module)
    result = count_flops(module, x, tracer=tracer)
    assert_same_state(module, before)
    assert result.warnings == ()  # auto: counted on fake copies, no fallback to a real run
    assert result.macs == FORWARD_MACS
    assert 2 * result.macs == fcm_flops(model, x, backward=False)
    eager = count_flops(model, x, tracer=tracer)
    assert result.flops == eager.flops
    nonzero = {op: n for op, n in result.by_operator().items() if n}
    assert nonzero == {op: n for op, n in eager.by_operator().items() if n}
    assert "aten::linear" in nonzero and "aten::addmm" not in nonzero


@pytest.mark.parametrize("tracer", ["auto", "dispatch"])
def test_exported_module_backward_counts_as_the_eager_model(tracer):
    torch.manual_seed(0)
    model = Net().train()
    x = torch.randn(B, T, D)
    module = exported(model, x)
    result = count_flops(module, x, tracer=tracer, backward=True)
    assert 2 * result.macs == fcm_flops(model, x, backward=True)
    assert result.by_phase("macs")["forward"] == FORWARD_MACS
    eager = count_flops(model, x, tracer=tracer, backward=True)
    assert result.by_phase() == eager.by_phase()
    assert set(result.by_operator()) - {"aten::empty"} <= set(eager.by_operator())
