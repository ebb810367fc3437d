"""Issue #32 / #27 (replaymin): the repeated-layer replay (flopcount.step.replay) is taken from
``MIN_LAYERS`` identical layers, the depth from which it measured cheaper than tracing every
layer (benchmarks/replay_crossover.py); a shallower stack is traced in full, and the figures
are the same either way.

Oracles: the same reading with ``FLOPCOUNT_REUSE=0`` (every layer traced), compared as whole
values; torch's MemTracker on a real steady-state AdamW step of the same model; the shallow
models the issue measured the replay slower on (tiny GPT-2 at 6 layers, LLaMA at 7), which
the default now traces in full. The default threshold is used here (no fixture lowers it).
"""

from __future__ import annotations

import warnings

import pytest
import torch
from _layer_stacks import (
    assert_adamw_estimate_replayed_exactly,
    estimates_on_and_off,
    gpt2,
    ids,
    llama,
    spy_on_plan_replay,
)
from torch import nn

import flopcount
from flopcount.step import replay

pytest.importorskip("torch.distributed._tools.mem_tracker")


class Block(nn.Module):
    """A residual MLP block: the stack's repeated layer."""

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(32, 128)
        self.down = nn.Linear(128, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(x)))


class Stack(nn.Module):
    def __init__(self, layers: int):
        super().__init__()
        self.layers = nn.ModuleList(Block() for _ in range(layers))
        self.head = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


DEPTHS = {"below": replay.MIN_LAYERS - 1, "at": replay.MIN_LAYERS}


@pytest.mark.parametrize("where", list(DEPTHS))
def test_estimate_memory_replays_from_the_threshold_with_the_same_figures(monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    torch.manual_seed(0)
    layers = DEPTHS[where]
    model = Stack(layers)
    x = torch.randn(8, 32)
    # below the threshold traced in full with the switch on too
    assert_adamw_estimate_replayed_exactly(monkeypatch, model, x, replayed=layers >= replay.MIN_LAYERS)


@pytest.mark.parametrize("where", list(DEPTHS))
def test_plan_replays_from_the_threshold_with_the_same_figures(monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    layers = DEPTHS[where]
    used = spy_on_plan_replay(monkeypatch)
    x = torch.randn(8, 32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        monkeypatch.setenv("FLOPCOUNT_REUSE", "1")
        on = flopcount.plan(lambda: Stack(layers), (x,), on="h100", link="nvlink4")
        monkeypatch.setenv("FLOPCOUNT_REUSE", "0")
        off = flopcount.plan(lambda: Stack(layers), (x,), on="h100", link="nvlink4")
    replayed = layers >= replay.MIN_LAYERS
    assert used == [replayed, False]
    assert on == off  # peak, memory categories, state bytes, FLOPs, collectives, times


ISSUE_MODELS = {
    "gpt2-6-inference": (gpt2, {}),
    "llama-7-adamw": (lambda: llama(layers=7), {"backward": True, "optimizer": "adamw"}),
}


@pytest.mark.parametrize("case", list(ISSUE_MODELS))
def test_the_shallow_models_the_replay_slowed_are_traced_in_full(monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    torch.manual_seed(0)
    build, options = ISSUE_MODELS[case]
    on, off, used = estimates_on_and_off(monkeypatch, build(), (ids(),), {}, **options)
    assert used == [False, False]  # the default threshold is above their depth
    assert on == off
