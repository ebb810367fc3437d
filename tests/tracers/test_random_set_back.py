"""A count leaves Python's ``random`` and numpy's global generator as found, and sets them back only
where that changes something (branch resnet9): the fake run with booked calls reads the
generators once after it ran (a draw there means the forward is traced again, watched), and when
that read finds them as they were, the set back on the way out (numpy's ``set_state``, ~70 us a
count) is skipped. Oracles: the generators' states compared with those read before the count, the
MACs of the toy stack derived by hand (``n * B * 2 * D * H``), and the calls of numpy's
``set_state`` counted."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from _toy_stack import B, D, H, Stack

from flopcount import count_flops

LAYERS = 8
STACK_MACS = LAYERS * B * 2 * D * H


def _states():
    numpy_state = np.random.get_state()
    return random.getstate(), numpy_state[0], numpy_state[1].tolist(), numpy_state[2:]


class DrawingRoot(Stack):
    """The toy stack whose own forward, outside every block, draws from ``draw`` and does the
    same work whatever it draws: the blocks are booked from the first, and the draw is the root's."""

    def __init__(self, draw) -> None:
        super().__init__(LAYERS)
        self.draw = draw

    def forward(self, x):
        self.draw()
        return super().forward(x)


def _count_set_state_calls(monkeypatch):
    calls = []
    set_state = np.random.set_state

    def counted(state, *args, **kwargs):
        calls.append(1)
        return set_state(state, *args, **kwargs)

    monkeypatch.setattr(np.random, "set_state", counted)
    return calls


def test_a_count_that_draws_nothing_does_not_set_numpy_s_generator_back(monkeypatch):
    monkeypatch.setenv("FLOPCOUNT_REUSE", "1")
    model = Stack(LAYERS)
    x = torch.randn(B, D)
    count_flops(model, (x,))  # a first count imports what it imports (numpy.random among them)
    random.seed(3)
    np.random.seed(3)
    before = _states()
    calls = _count_set_state_calls(monkeypatch)
    result = count_flops(model, (x,))
    assert result.macs == STACK_MACS
    assert result.reused_calls == LAYERS - 1  # the read that allows the skip is made for booked calls
    assert _states() == before
    # the parent set the generators back after every count: one call here
    assert calls == []


@pytest.mark.parametrize("generator", ["random", "numpy"])
def test_a_forward_that_draws_outside_the_booked_blocks_leaves_the_generators_as_found(monkeypatch, generator):
    monkeypatch.setenv("FLOPCOUNT_REUSE", "1")
    model = DrawingRoot(random.random if generator == "random" else np.random.rand)
    x = torch.randn(B, D)
    count_flops(model, (x,))
    random.seed(3)
    np.random.seed(3)
    before = _states()
    result = count_flops(model, (x,))
    assert result.macs == STACK_MACS
    assert result.reused_calls == LAYERS - 1  # the root drew, not a block: the blocks are booked
    assert _states() == before


def test_a_count_of_a_model_without_booked_calls_still_sets_the_generators_back(monkeypatch):
    # no booked call (one Linear, no block to book): no read after the run, the set back is made
    monkeypatch.setenv("FLOPCOUNT_REUSE", "1")

    class Drawing(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(D, H)

        def forward(self, x):
            random.random()
            np.random.rand()
            return self.linear(x)

    model = Drawing()
    x = torch.randn(B, D)
    random.seed(3)
    np.random.seed(3)
    before = _states()
    result = count_flops(model, (x,))
    assert result.macs == B * D * H
    assert result.reused_calls == 0
    assert _states() == before
