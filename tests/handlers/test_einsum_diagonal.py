"""``torch.einsum`` with a letter repeated in one operand and summed away: the trace ``"ii"``,
a batch of traces ``"bii->b"`` (Gaussian-process and Hutchinson-estimator code), a diagonal
weighting ``"bii,bj->bj"``. torch takes the diagonal (a view) and sums its elements; the
handler priced the sum over every element of the operand (n^2 for a trace of n). Oracle: the
hand count of what torch runs (``diagonal`` then ``sum`` over the diagonal's n elements: n
FLOPs by docs/conventions.md, "sum N") and FlopCounterMode live for the contraction."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from flopcount import count_flops

TRACERS = ["auto", "dispatch", "jit"]


class Einsum(nn.Module):
    def __init__(self, equation: str) -> None:
        super().__init__()
        self.equation = equation

    def forward(self, *operands: torch.Tensor) -> torch.Tensor:
        return torch.einsum(self.equation, *operands)


@pytest.mark.parametrize("tracer", TRACERS)
@pytest.mark.parametrize(
    "equation, shapes, flops",
    [
        ("ii", [(7, 7)], 7),  # the trace: the diagonal's 7 elements summed
        ("bii->b", [(3, 6, 6)], 3 * 6),
        ("...ii->...", [(2, 3, 5, 5)], 2 * 3 * 5),
        ("iij->j", [(4, 4, 5)], 4 * 5),
        ("ii->i", [(5, 5)], 0),  # the diagonal alone is a view
    ],
)
def test_one_operand(tracer: str, equation: str, shapes: list, flops: int) -> None:
    operands = tuple(torch.randn(*s) for s in shapes)
    r = count_flops(Einsum(equation), operands, tracer=tracer)
    assert (r.flops, r.macs) == (flops, 0)


@pytest.mark.parametrize("tracer", TRACERS)
def test_a_diagonal_summed_before_a_contraction(tracer: str) -> None:
    a, w = torch.randn(3, 5, 5), torch.randn(3, 4)
    model = Einsum("bii,bj->bj")
    with FlopCounterMode(display=False) as counter:
        model(a, w)
    r = count_flops(model, (a, w), tracer=tracer)
    # the diagonal's 3 x 5 elements summed, then 3 x 4 products (torch runs them as a mul,
    # which FlopCounterMode does not count: see conventions.md, an einsum over a size-1 letter)
    assert counter.get_total_flops() == 0
    assert r.flops == 3 * 5 + 2 * 3 * 4
    assert r.macs == 3 * 4
