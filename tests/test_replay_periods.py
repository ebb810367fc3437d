"""Issue #32 (periodreplay): a stack whose layers alternate between kinds (Gemma-2's sliding and
full attention in turn, GPT-OSS's likewise, a 2 : 1 pattern) is replayed by units of one
period's layers (flopcount.step.replay: the template 3 units, the check 4), with the same
exactness check as a stack of identical layers; a stack whose period breaks is traced in full.

How the replay is observed: ``estimate_memory``'s ``_layered`` and ``plan``'s ``_layered_step``
give figures only when the replay was taken (tests/_layer_stacks.py's spies), and
``find_stack``'s period. Oracles: the same reading with ``FLOPCOUNT_REUSE=0`` (every layer
traced), compared as whole values; torch's MemTracker on a real steady-state AdamW step of the
toy stacks (tests/_live_oracles.py).
"""

from __future__ import annotations

from typing import Optional

import pytest
import torch
from _layer_stacks import LayerList as Net
from _layer_stacks import assert_adamw_estimate_replayed_exactly, estimates_on_and_off, plans_on_and_off
from conftest import assert_same_state, snapshot
from torch import nn

from flopcount.step import replay

pytest.importorskip("torch.distributed._tools.mem_tracker")

WIDTH = 32


class Windowed(nn.Module):
    """A residual MLP block that, where it has a ``window`` (an int in one layer, None in the
    next, as Gemma-2's ``sliding_window``), gates its hidden units by their first ``window``
    ones: the two kinds run different ops on parameters of one shape."""

    def __init__(self, layer_idx: int, window: Optional[int], hidden: int = 64):
        super().__init__()
        self.layer_idx = layer_idx  # differs in every layer: hidden from the cut runs
        self.window = window
        self.up = nn.Linear(WIDTH, hidden)
        self.down = nn.Linear(hidden, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.up(x))
        if self.window is not None:
            h = h * torch.sigmoid(h[..., : self.window].sum(-1, keepdim=True))
        return x + self.down(h)


def alternating() -> Net:
    """Period 2, 12 layers: windowed, full, windowed, ..."""
    return Net([Windowed(i, 4 if i % 2 == 0 else None) for i in range(12)])


def two_to_one() -> Net:
    """Period 3, 18 layers: two windowed layers and a wider full one (parameters of another shape)."""
    return Net([Windowed(i, 4) if i % 3 < 2 else Windowed(i, None, hidden=96) for i in range(18)])


def broken() -> Net:
    """Period 2 but for layers 6 and 7, which come the other way round."""
    windows = [4 if i % 2 == 0 else None for i in range(12)]
    windows[6], windows[7] = None, 4
    return Net([Windowed(i, w) for i, w in enumerate(windows)])


STACKS = {"period-2": (alternating, 2), "period-3": (two_to_one, 3), "broken": (broken, None)}


@pytest.mark.usefixtures("replay_from_six_layers")
@pytest.mark.parametrize("case", list(STACKS))
def test_estimate_memory_replays_alternating_layers_by_units_with_the_same_figures(monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    build, period = STACKS[case]
    torch.manual_seed(0)
    model = build()
    stack = replay.find_stack(model)
    assert (stack.period if stack is not None else None) == period
    x = torch.randn(8, WIDTH)
    # the broken stack: traced in full with the reuse on too
    assert_adamw_estimate_replayed_exactly(monkeypatch, model, x, replayed=period is not None)


@pytest.mark.usefixtures("replay_from_six_layers")
@pytest.mark.parametrize("case", list(STACKS))
def test_plan_replays_alternating_layers_by_units_with_the_same_figures(monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    build, period = STACKS[case]
    x = torch.randn(8, WIDTH)
    on, off, used = plans_on_and_off(monkeypatch, build, (x,), fsdp=2, on="h100", link="nvlink4")
    assert used == [period is not None, False]
    assert on == off  # peak, memory categories, state bytes, FLOPs, collectives, times


def test_a_period_is_taken_only_where_the_stack_holds_enough_units() -> None:
    """At the default floor a 12-layer alternating stack is 6 units: traced in full (the cost of
    3 + 4 units of 2 layers is not paid back), a 24-layer one is replayed."""
    assert replay.find_stack(alternating()) is None
    deep = Net([Windowed(i, 4 if i % 2 == 0 else None) for i in range(2 * replay.MIN_LAYERS)])
    stack = replay.find_stack(deep)
    assert stack is not None and (stack.period, stack.units) == (2, replay.MIN_LAYERS)


def _hf(model_type: str, **values: object) -> nn.Module:
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(
        model_type, num_hidden_layers=12, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        intermediate_size=128, vocab_size=128, max_position_embeddings=64, sliding_window=8, use_cache=False, **values,
    )
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).train()


HF = {
    "gemma2": lambda: _hf("gemma2"),
    "gpt_oss": lambda: _hf("gpt_oss", num_local_experts=4, num_experts_per_tok=2),
}


@pytest.mark.usefixtures("replay_from_six_layers")
@pytest.mark.parametrize("name", list(HF))
def test_gemma2_and_gpt_oss_replayed_by_pairs_of_layers_with_the_same_figures(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """12 layers of sliding and full attention in turn: 6 units of 2 layers at the tests' floor
    (the default floor's 12 units would take 24 layers; the floor itself is
    test_a_period_is_taken_only_where_the_stack_holds_enough_units's), so 2 units are replayed
    beyond the template's 3 and the check's 4."""
    build = HF[name]
    model = build()
    stack = replay.find_stack(model)
    assert stack is not None and (len(stack), stack.period) == (12, 2)
    assert stack.units > replay.Template.UNITS + 1  # units the replay materializes, traced by neither
    ids = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(1))
    before = snapshot(model)
    on, off, used = estimates_on_and_off(monkeypatch, model, (ids,), {}, backward=True, optimizer="adamw")
    assert used == [True, False]
    assert on == off
    assert_same_state(model, before)
    plan_on, plan_off, planned = plans_on_and_off(monkeypatch, build, (ids,), fsdp=2)
    assert planned == [True, False]
    assert plan_on == plan_off
