"""A backward op computes only the gradients its ``output_mask`` asks for. The CPU kernel of
``native_batch_norm_backward`` returns an undefined grad_input when the norm's input needs no
gradient (a tabular net's input BatchNorm, as TabNet's ``initial_bn``; a BatchNorm after a
frozen backbone; an InstanceNorm on the raw input), but its meta kernel allocates all three
outputs, so the default tracer (fake tensors) booked grad_input's 9N (+N with a weight) + 2G
FLOPs and its bytes, which the real kernel never computes. Oracle: the formulas of
docs/conventions.md ("Backward": grad_weight 2N, grad_bias N), and the real kernel's outputs."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_same_state, snapshot
from torch import nn

from flopcount import count_flops

BN_BACKWARD = "aten::native_batch_norm_backward"


class Tabular(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.bn, self.fc = nn.BatchNorm1d(16), nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.bn(x))


class FrozenStem(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem, self.bn = nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8)
        self.stem.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.stem(x))


def _norm_backward(n: int, groups: int, grad_input: bool) -> int:
    """conventions.md, Backward: grad_input 9N + N (weight) + 2G; grad_weight 2N; grad_bias N."""
    return (10 * n + 2 * groups if grad_input else 0) + 2 * n + n


def test_the_real_kernel_skips_grad_input() -> None:
    # the fact the count follows: the CPU kernel returns no grad_input when the mask says so
    x, g = torch.randn(8, 16), torch.randn(8, 16)
    w, mean, invstd = torch.ones(16), torch.zeros(16), torch.ones(16)
    outs = torch.ops.aten.native_batch_norm_backward(g, x, w, None, None, mean, invstd, True, 1e-5, [False, True, True])
    assert outs[0] is None and outs[1] is not None and outs[2] is not None


@pytest.mark.parametrize("tracer", ["auto", "dispatch"])
@pytest.mark.parametrize(
    "model, x, n, groups",
    [
        (Tabular(), torch.randn(8, 16), 8 * 16, 16),
        (FrozenStem(), torch.randn(2, 3, 10, 10), 2 * 8 * 8 * 8, 8),
        (nn.InstanceNorm2d(6, affine=True), torch.randn(2, 6, 5, 7), 2 * 6 * 5 * 7, 2 * 6),
    ],
    ids=["tabular", "frozen-stem", "instance-norm"],
)
def test_no_grad_input_when_the_input_needs_none(tracer: str, model: nn.Module, x: torch.Tensor, n: int, groups: int) -> None:
    before = snapshot(model)
    r = count_flops(model, x, tracer=tracer, backward=True)
    assert r.by_operator("flops")[BN_BACKWARD] == _norm_backward(n, groups, grad_input=False)
    assert_same_state(model, before)


def test_bytes_are_those_of_the_gradients_computed() -> None:
    model, x = Tabular(), torch.randn(8, 16)
    fake = count_flops(model, x, tracer="auto", backward=True).by_operator("bytes")[BN_BACKWARD]
    real = count_flops(model, x, tracer="dispatch", backward=True).by_operator("bytes")[BN_BACKWARD]
    # reads: grad_out, input (8 x 16 fp32 each), weight, save_mean, save_invstd, running stats
    # (16 fp32 each); writes grad_weight and grad_bias only -- the real kernel's outputs
    assert fake == real == 2 * 8 * 16 * 4 + 5 * 16 * 4 + 2 * 16 * 4


@pytest.mark.parametrize("tracer", ["auto", "dispatch"])
def test_grad_input_still_counted_when_wanted(tracer: str) -> None:
    model, x = Tabular(), torch.randn(8, 16, requires_grad=True)
    r = count_flops(model, x, tracer=tracer, backward=True)
    assert r.by_operator("flops")[BN_BACKWARD] == _norm_backward(8 * 16, 16, grad_input=True)
