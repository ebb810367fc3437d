"""``torch.linalg.multi_dot`` and ``torch.chain_matmul`` under every tracer.

The dispatch tracer sees the ``mm`` calls torch makes; ``tracer="jit"`` records the one
``aten::linalg_multi_dot`` (``aten::chain_matmul``), which had no handler: reported
unsupported and counted 0. torch multiplies the chain in the order of fewest multiply-adds,
so the handler prices the matrix-chain minimum. Oracles: the hand count of that order, and
``torch.utils.flop_counter.FlopCounterMode`` run live (it counts the ``mm`` calls)."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from flopcount import count_flops


class Chain(nn.Module):
    def __init__(self, fn: Callable[..., torch.Tensor]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *tensors: torch.Tensor) -> Any:
        return self.fn(*tensors)


def _multi_dot(*tensors: torch.Tensor) -> torch.Tensor:
    return torch.linalg.multi_dot(list(tensors))


CASES = {
    # (10, 3) (3, 20) (20, 2): A(BC) = 3*20*2 + 10*3*2 = 180 beats (AB)C = 10*3*20 + 10*20*2 = 1,000
    "three": (_multi_dot, [(10, 3), (3, 20), (20, 2)], 3 * 20 * 2 + 10 * 3 * 2),
    # (2, 20) (20, 3) (3, 10): (AB)C = 2*20*3 + 2*3*10 = 180 beats A(BC) = 20*3*10 + 2*20*10 = 1,000
    "three, other side": (_multi_dot, [(2, 20), (20, 3), (3, 10)], 2 * 20 * 3 + 2 * 3 * 10),
    # a row (30,) and a column (40,) at the ends: (vA)(Bw) = 30*5 + 5*40 + 5 = 355
    "vector ends": (_multi_dot, [(30,), (30, 5), (5, 40), (40,)], 30 * 5 + 5 * 40 + 5),
    # (7,30) (30,5) (5,40) (40,3): A(B(CD)) = 5*40*3 + 30*5*3 + 7*30*3 = 1,680, the least of the
    # five orders ((AB)(CD) 1,755; ((AB)C)D 3,290; (A(BC))D 15,240; A((BC)D) 10,230)
    "four": (torch.chain_matmul, [(7, 30), (30, 5), (5, 40), (40, 3)], 5 * 40 * 3 + 30 * 5 * 3 + 7 * 30 * 3),
}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("tracer", ["auto", "dispatch", "jit"])
def test_chain_priced_in_torch_order(tracer: str, name: str) -> None:
    fn, shapes, by_hand = CASES[name]
    tensors: Sequence[torch.Tensor] = [torch.randn(*s) for s in shapes]
    with FlopCounterMode(display=False) as counter:
        fn(*tensors)
    assert counter.get_total_flops() == 2 * by_hand
    r = count_flops(Chain(fn), tuple(tensors), tracer=tracer)
    assert r.macs == by_hand
    assert r.complete
