"""The layer replay of estimate_memory and plan takes stacks whose layers each hold their own
``functools.partial`` activation or a method of their own (transformers' ``GELUTanh``:
``partial(gelu, approximate="tanh")`` made per layer; Gemma, Starcoder2). Before, each layer's
partial was a different object, so ``replay._unequal`` and the parent walk's layer state
refused the stack and every layer was traced.

Oracles: the same reading with the replay off (``FLOPCOUNT_REUSE=0``: every layer traced),
compared whole; torch's MemTracker on a real Adam step of the same model; and partials that
really differ between layers (another keyword), which must be traced in full.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any, Callable, List, Optional

import pytest
import torch
from _layer_stacks import estimates_on_and_off, spy_on_plan_replay
from _live_oracles import warmed_step_peak
from conftest import assert_same_state, snapshot
from torch import nn

import flopcount

pytestmark = pytest.mark.usefixtures("replay_from_six_layers")


class PartialGelu(nn.Module):
    """transformers' GELUTanh: a partial of gelu per instance."""

    def __init__(self, approximate: str = "tanh"):
        super().__init__()
        self.act = functools.partial(nn.functional.gelu, approximate=approximate)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(x)


class MethodGelu(nn.Module):
    """GELUTanh's other form: a method of its own held as an attribute."""

    def __init__(self) -> None:
        super().__init__()
        self.act = self._gelu

    def _gelu(self, x: torch.Tensor) -> torch.Tensor:
        return x * 0.5 * (1.0 + torch.tanh(0.7978845608 * (x + 0.044715 * torch.pow(x, 3.0))))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(x)


class Block(nn.Module):
    def __init__(self, activation: Callable[[], nn.Module], width: int = 32):
        super().__init__()
        self.up = nn.Linear(width, width * 4)
        self.act = activation()
        self.down = nn.Linear(width * 4, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(self.act(self.up(x)))


class Blocks(nn.Module):
    def __init__(self, activation: Callable[[], nn.Module] = PartialGelu, n: int = 8, odd: Optional[int] = None):
        super().__init__()
        self.blocks = nn.ModuleList(Block(activation) for _ in range(n))
        if odd is not None:  # one layer's partial really differs: another keyword
            self.blocks[odd].act.act = functools.partial(nn.functional.gelu, approximate="none")
        self.head = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def _x() -> torch.Tensor:
    return torch.randn(8, 32, generator=torch.Generator().manual_seed(3))


@pytest.mark.parametrize("activation", [PartialGelu, MethodGelu], ids=["partial", "own-method"])
def test_layers_holding_their_own_partial_or_method_are_replayed_exactly(
    monkeypatch: pytest.MonkeyPatch, activation: Callable[[], nn.Module]
) -> None:
    torch.manual_seed(0)
    model = Blocks(activation)
    before = snapshot(model)
    on, off, used = estimates_on_and_off(monkeypatch, model, (_x(),), {}, backward=True, optimizer="adam")
    assert used == [True, False]  # replayed with reuse on (traced in full before), in full with it off
    assert on == off
    assert on.peak_bytes == warmed_step_peak(model, _x(), torch.optim.Adam)  # torch's MemTracker, a real step
    assert_same_state(model, before)


def test_a_layer_whose_partial_differs_is_traced_in_full(monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    model = Blocks(odd=5)
    on, off, used = estimates_on_and_off(monkeypatch, model, (_x(),), {}, backward=True, optimizer="adam")
    assert used == [False, False]
    assert on == off
    assert on.peak_bytes == warmed_step_peak(model, _x(), torch.optim.Adam)


@pytest.mark.parametrize("odd", [None, 5], ids=["same", "one-differs"])
def test_the_plan_replays_partial_activations_and_not_differing_ones(monkeypatch: pytest.MonkeyPatch, odd: Optional[int]) -> None:
    used: List[bool] = spy_on_plan_replay(monkeypatch)
    plans: List[Any] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for switch in ("1", "0"):
            monkeypatch.setenv("FLOPCOUNT_REUSE", switch)
            torch.manual_seed(0)
            plans.append(flopcount.plan(lambda: Blocks(odd=odd), (_x(),), on="h100", fsdp=2, optimizer="adam"))
    assert used == [odd is None, False]
    assert plans[0].to_dict() == plans[1].to_dict()
    # the forward's MACs by hand: per layer up (32 x 128) and down (128 x 32), the head 32 x 10, 8 rows
    assert plans[0].macs["forward"] == 8 * (8 * (32 * 128 + 128 * 32) + 32 * 10)
