"""Structural reuse against models built to break it (issue #32 item 2: "a reuse that cannot be
proven exact is not taken"; branch ``advreuse``). Each model is a stack of identical blocks whose
calls differ only in state outside the blocks' parameters, buffers and arguments: Python's or
numpy's random generator, a class attribute, a flag of another Python module, a global object's
attribute. Oracles: the count with reuse off (every call traced), the MACs derived by hand from
which blocks do the extra work, and ``FlopCounterMode`` live on the real model."""

from __future__ import annotations

import copy
import random
import sys
import types

import numpy as np
import pytest
import torch
from _toy_stack import B, D, off_and_on, rows
from conftest import torch_contraction_flops
from torch import nn

from flopcount import count_flops

LAYERS = 6
BLOCK_MACS = 2 * B * D * D  # two D x D Linears on a (B, D) input
EXTRA_MACS = B * D * D  # the extra ``@ eye(D)`` a block does when its branch says so


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(D, D)
        self.b = nn.Linear(D, D)

    def forward(self, x):
        return self.b(torch.relu(self.a(x))) + x


class Stack(nn.Module):
    def __init__(self, block: type) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList(block() for _ in range(LAYERS))

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


def _inputs():
    return (torch.randn(B, D, generator=torch.Generator().manual_seed(0)),)


def _off_and_on(monkeypatch, model, inputs):
    # ``off_and_on`` without its check that the model is left as found (it compares values: none on meta)
    if inputs[0].device.type != "meta":
        return off_and_on(monkeypatch, model, inputs)
    monkeypatch.setenv("FLOPCOUNT_REUSE", "0")
    off = count_flops(model, inputs)
    monkeypatch.setenv("FLOPCOUNT_REUSE", "1")
    return off, count_flops(model, inputs)


def _macs(extra_blocks: int, skipped: int = 0) -> int:
    return (LAYERS - skipped) * BLOCK_MACS + extra_blocks * EXTRA_MACS


@pytest.fixture(autouse=True)
def _reuse_on(monkeypatch):
    monkeypatch.setenv("FLOPCOUNT_REUSE", "1")


# ---------------------------------------------------------------- Python's and numpy's generators


class PythonLayerDrop(Block):
    """LayerDrop as fairseq writes it: in train mode a block is skipped when a Python draw says so."""

    def forward(self, x):
        if self.training and random.random() < 0.5:
            return x
        return super().forward(x)


class NumpyLayerDrop(Block):
    def forward(self, x):
        if self.training and np.random.rand() < 0.5:
            return x
        return super().forward(x)


def _states():
    numpy_state = np.random.get_state()
    return random.getstate(), numpy_state[0], numpy_state[1].tolist(), numpy_state[2:]


@pytest.mark.parametrize("meta", [False, True], ids=["real", "meta"])
@pytest.mark.parametrize("block", [PythonLayerDrop, NumpyLayerDrop], ids=["random", "numpy"])
def test_a_block_that_draws_from_python_or_numpy_is_traced_and_the_generators_are_left_as_found(monkeypatch, block, meta):
    model = Stack(block).train()
    inputs = _inputs()
    if meta:
        model, inputs = copy.deepcopy(model).to("meta"), tuple(t.to("meta") for t in inputs)
    random.seed(6)
    np.random.seed(6)
    before = _states()
    # the blocks the caller's next forward would skip, drawn here from the same states
    draws = [random.random() if block is PythonLayerDrop else np.random.rand() for _ in range(LAYERS)]
    skipped = sum(draw < 0.5 for draw in draws)
    random.setstate(before[0])
    np.random.seed(6)
    assert skipped == 3 and draws[0] >= 0.5  # seed 6: block 0 runs, 3 of the 6 are skipped
    off, on = _off_and_on(monkeypatch, model, inputs)
    # before: blocks 1-5 were booked from block 0 (all 6 counted), and each count advanced the
    # caller's generators (the count with reuse on drew after the one with it off)
    assert _states() == before
    assert on.macs == off.macs == _macs(0, skipped)
    assert rows(on) == rows(off)
    assert on.reused_calls == 0
