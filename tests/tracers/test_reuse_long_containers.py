"""Structural reuse's key for long containers (issue #32; branch ``leftover``): a global the blocks
read that holds a tuple, list, dict or set of more than 64 items. Before, a dict or set that long
was keyed by identity, so a parent that changed it between two blocks had the second block booked
from the first; a list or tuple was keyed item by item on every keyed call (a global list of
100,000 floats: 100,000 reads per block). Now a long container is keyed by content once per count
and given the same key again while it holds the same objects (compared by identity, in C).
Oracles: MACs and FLOPs derived by hand (beside each model), the count with reuse off
(``FLOPCOUNT_REUSE=0``: every call traced), ``FlopCounterMode`` live, and the key's own reads
counted by a counter around its reader (no timing)."""

from __future__ import annotations

import collections
import copy
import sys

import pytest
import torch
from _toy_stack import B, Block, D, H, off_and_on, rows
from conftest import torch_contraction_flops
from torch import nn

from flopcount import count_flops
from flopcount.tracers import _reuse

LAYERS = 6
N = 1_000  # a long container's items (above the 64 of the rule)
BLOCK_MACS = B * 2 * D * H  # Linear(D, H) and Linear(H, D) on B rows
STEP_MACS = B * D * D  # one ``@ eye(D)`` on a (B, D) activation

ITEMS: object = None  # the global the blocks below read; each test binds it


class ScaledByTheLast(Block):
    """The block's output times the last item of ``ITEMS`` (a float or a (D,) tensor): B * D
    FLOPs of ``aten::mul`` per block, no MACs."""

    def forward(self, x):
        return super().forward(x) * ITEMS[-1]


class StepsFromAList(Block):
    """``int(ITEMS[-1])`` extra matmuls with ``eye(D)``: the list gives the loop count."""

    def forward(self, x):
        y = super().forward(x)
        for _ in range(int(ITEMS[-1])):
            y = y @ torch.eye(D)
        return y


class StepsFromADict(Block):
    """As :class:`StepsFromAList`, the count read from the dict's entry at its last int key."""

    def forward(self, x):
        y = super().forward(x)
        for _ in range(int(ITEMS[len(ITEMS) - 1])):
            y = y @ torch.eye(D)
        return y


class StepsFromASet(Block):
    """As :class:`StepsFromAList`, the count read from the set's largest item: ``max - (N - 2)``."""

    def forward(self, x):
        y = super().forward(x)
        for _ in range(int(max(ITEMS)) - (N - 2)):
            y = y @ torch.eye(D)
        return y


class StepsFromPairs(Block):
    """As :class:`StepsFromAList`, the count read from a short set of 1-tuples: ``max[0] - 1``."""

    def forward(self, x):
        y = super().forward(x)
        for _ in range(max(ITEMS)[0] - 1):
            y = y @ torch.eye(D)
        return y


class Stack(nn.Module):
    def __init__(self, block: type, between=None) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList(block() for _ in range(LAYERS))
        self.between = between  # called with the block's index after it ran (a parent changing the global)

    def forward(self, x):
        for i, block in enumerate(self.blocks):
            x = block(x)
            if self.between is not None:
                self.between(i)
        return x


def _inputs():
    return (torch.randn(B, D, generator=torch.Generator().manual_seed(0)),)


@pytest.fixture
def items(monkeypatch):
    def bind(value):
        monkeypatch.setattr(sys.modules[__name__], "ITEMS", value)
        return value

    return bind


@pytest.fixture
def reads(monkeypatch):
    """The key's reads: how many values ``Reuse._attribute`` keyed inside each ``_globals_key``
    (one per keyed call, and one after each first call)."""
    counted = [0]
    per_call: list = []
    attribute, globals_key = _reuse.Reuse._attribute, _reuse.Reuse._globals_key

    def counting_attribute(self, value, original=False):
        counted[0] += 1
        return attribute(self, value, original)

    def counting_globals_key(self, order, *structure):
        start = counted[0]
        try:
            return globals_key(self, order, *structure)
        finally:
            per_call.append(counted[0] - start)

    monkeypatch.setattr(_reuse.Reuse, "_attribute", counting_attribute)
    monkeypatch.setattr(_reuse.Reuse, "_globals_key", counting_globals_key)
    return per_call


@pytest.mark.parametrize("make", [
    lambda n: [0.5] * n,
    lambda n: tuple([0.5] * n),
    lambda n: [torch.full((D,), 0.5)] * n,
], ids=["floats", "tuple", "tensors"])
def test_a_long_global_is_read_once_per_count_not_once_per_call(monkeypatch, items, reads, make):
    counts = {}
    for n in (N, 20 * N):
        items(make(n))
        reads.clear()
        off, on = off_and_on(monkeypatch, Stack(ScaledByTheLast), _inputs())
        assert on.macs == off.macs == LAYERS * BLOCK_MACS
        assert on.by_operator("flops")["aten::mul"] == LAYERS * B * D  # the scale, per block
        assert rows(on) == rows(off)
        assert on.reused_calls == LAYERS - 1
        counts[n] = list(reads)
        assert reads[0] == n + 1  # the first keyed call keys the container and each of its items once
    # every later keyed call reads the container itself, not its items; before, a list or tuple was
    # read item by item on each (n + 1 reads each: 1,001 and 20,001)
    assert counts[N][1:] == counts[20 * N][1:] == [1] * (len(counts[N]) - 1)


def _mutated_list(i: int) -> None:
    if i == 1:
        ITEMS[-1] = 2.0  # an item changed: blocks 2 and 3 do 2 steps
    elif i == 3:
        ITEMS.append(3.0)  # appended: blocks 4 and 5 do 3


def _mutated_dict(i: int) -> None:
    if i == 1:
        ITEMS[N - 1] = 2.0
    elif i == 3:
        ITEMS[N] = 3.0


def _mutated_set(i: int) -> None:
    if i == 1:
        ITEMS.discard(float(N - 1))
        ITEMS.add(float(N))
    elif i == 3:
        ITEMS.add(float(N + 1))


def _mutated_pairs(i: int) -> None:
    if i == 1:
        ITEMS.discard((2,))
        ITEMS.add((3,))
    elif i == 3:
        ITEMS.add((4,))


@pytest.mark.parametrize("block, make, between", [
    (StepsFromAList, lambda: [1.0] * N, _mutated_list),
    (StepsFromADict, lambda: {i: 1.0 for i in range(N)}, _mutated_dict),
    (StepsFromASet, lambda: {float(i) for i in range(N)}, _mutated_set),
    # a set of tuples, short: before, a set of anything but scalars was keyed by identity too
    (StepsFromPairs, lambda: {(0,), (1,), (2,)}, _mutated_pairs),
], ids=["list", "dict", "set", "set-of-tuples"])
def test_a_long_global_changed_between_two_blocks_splits_the_key(monkeypatch, items, block, make, between):
    # blocks 0-1 do 1 step, 2-3 do 2, 4-5 do 3: 12 steps
    hand = LAYERS * BLOCK_MACS + 12 * STEP_MACS
    items(make())
    model = Stack(block, between)
    monkeypatch.setenv("FLOPCOUNT_REUSE", "0")
    off = count_flops(model, _inputs())
    items(make())  # each run changes the global: made anew before each
    monkeypatch.setenv("FLOPCOUNT_REUSE", "1")
    on = count_flops(model, _inputs())
    assert on.macs == off.macs == hand
    assert rows(on) == rows(off)
    items(make())
    assert torch_contraction_flops(model, _inputs()) == 2 * hand
    # block 1 booked from block 0, 3 from 2, 5 from 4; before, a dict or set of more than 64 items
    # (or a set of tuples) was keyed by identity: blocks 1-5 were booked from block 0 (6 steps, reused 5)
    assert on.reused_calls == 3


class CountsInASharedDict(Block):
    """Every block holds one dict of N entries, shared, and adds an entry per call, then does one
    step per entry beyond N: block i does i + 1 steps."""

    def __init__(self, seen=None) -> None:
        super().__init__()
        self.seen = seen

    def forward(self, x):
        self.seen[len(self.seen)] = 1.0
        y = super().forward(x)
        for _ in range(len(self.seen) - N):
            y = y @ torch.eye(D)
        return y


def test_a_long_dict_a_first_call_writes_is_not_booked_again(monkeypatch):
    model = Stack(Block)
    seen = {i: 1.0 for i in range(N)}
    torch.manual_seed(0)
    model.blocks = nn.ModuleList(CountsInASharedDict(seen) for _ in range(LAYERS))
    hand = LAYERS * BLOCK_MACS + sum(range(1, LAYERS + 1)) * STEP_MACS  # 1 + 2 + ... + 6 steps
    off, on = off_and_on(monkeypatch, model, _inputs())  # the caller's dict left as found by both
    assert len(seen) == N
    assert on.macs == off.macs == hand
    assert rows(on) == rows(off)
    assert torch_contraction_flops(copy.deepcopy(model), _inputs()) == 2 * hand
    # before: the dict was keyed by identity, the first call's write unseen: blocks 1-5 booked from
    # block 0 (1 step each)
    assert on.reused_calls == 0


class AList(list):
    """A user's list type (no method of its own): keyed, before, as a plain object (its empty
    ``__dict__``), so its items were not in the key."""


Steps = collections.namedtuple("Steps", "counts label")


class StepsFromANamedTuple(Block):
    """As :class:`StepsFromAList`, the count read from ``ITEMS.counts[-1]`` (a namedtuple holding a
    list: keyed, before, by the namedtuple's identity)."""

    def forward(self, x):
        y = super().forward(x)
        for _ in range(int(ITEMS.counts[-1])):
            y = y @ torch.eye(D)
        return y


def _mutated_named(i: int) -> None:
    _mutated_list_of(ITEMS.counts, i)


def _mutated_list_of(items: list, i: int) -> None:
    if i == 1:
        items[-1] = 2.0
    elif i == 3:
        items.append(3.0)


@pytest.mark.parametrize("block, make, between", [
    (StepsFromAList, lambda: AList([1.0] * 3), _mutated_list),
    (StepsFromAList, lambda: AList([1.0] * N), _mutated_list),
    (StepsFromANamedTuple, lambda: Steps([1.0] * 3, "steps"), _mutated_named),
], ids=["list-subclass", "long-list-subclass", "namedtuple-of-a-list"])
def test_a_subclassed_global_changed_between_two_blocks_splits_the_key(monkeypatch, items, block, make, between):
    hand = LAYERS * BLOCK_MACS + 12 * STEP_MACS  # blocks 0-1 do 1 step, 2-3 do 2, 4-5 do 3
    items(make())
    model = Stack(block, between)
    monkeypatch.setenv("FLOPCOUNT_REUSE", "0")
    off = count_flops(model, _inputs())
    items(make())
    monkeypatch.setenv("FLOPCOUNT_REUSE", "1")
    on = count_flops(model, _inputs())
    items(make())
    assert torch_contraction_flops(model, _inputs()) == 2 * hand
    # before: 5,760 MACs with reuse on (blocks 1-5 booked from block 0, 1 step each), 6,912 off
    assert on.macs == off.macs == hand
    assert rows(on) == rows(off)
    assert on.reused_calls == 3
    # unchanged, the same value keys alike: every later block booked from the first
    items(make())
    still = count_flops(Stack(block), _inputs())
    assert still.macs == LAYERS * (BLOCK_MACS + STEP_MACS)
    assert still.reused_calls == LAYERS - 1
