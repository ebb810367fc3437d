"""Structural reuse's key for a plain object the layers share (a config, a holder) whose list,
dict or sub-object the parent changes in place between two blocks (issue #32; branch
``heldlists``). Before, such an object was keyed by its identity and the identities of its own
attributes (``_Held``): the list stayed bound, so the later blocks were booked from the first.
Oracles: MACs derived by hand, the count with reuse off (``FLOPCOUNT_REUSE=0``: every call
traced) and ``FlopCounterMode`` live."""

from __future__ import annotations

import copy

import pytest
import torch
from _toy_stack import B, Block, D, H, off_and_on, rows
from conftest import torch_contraction_flops
from torch import nn

LAYERS = 6
BLOCK_MACS = B * 2 * D * H  # Linear(D, H) and Linear(H, D) on B rows
STEP_MACS = B * D * D  # one ``@ eye(D)`` on a (B, D) activation


class Holder:
    """A plain object: ``steps`` a list, ``sub`` another holder (or None), ``back`` a cycle."""

    def __init__(self, sub=None) -> None:
        self.steps = [1]
        self.table = {"steps": 1}
        self.sub = sub
        self.back = self


def _steps(holder: Holder, where: str) -> int:
    if where == "list":
        return holder.steps[0]
    if where == "dict":
        return holder.table["steps"]
    return holder.sub.steps[0]  # "nested"


def _set(holder: Holder, where: str, value: int) -> None:
    if where == "list":
        holder.steps[0] = value
    elif where == "dict":
        holder.table["steps"] = value
    else:
        holder.sub.steps[0] = value


class Stepped(Block):
    """``steps`` extra matmuls with ``eye(D)``, read from the shared holder."""

    def __init__(self, holder: Holder, where: str) -> None:
        super().__init__()
        self.holder = holder
        self.where = where

    def forward(self, x):
        y = super().forward(x)
        for _ in range(_steps(self.holder, self.where)):
            y = y @ torch.eye(D)
        return y


class Stack(nn.Module):
    """Blocks 0-1 do 1 step, 2-3 do 2, 4-5 do 3: the parent changes the holder in place after
    blocks 1 and 3 (and sets it back at the start: a forward that runs twice does the same)."""

    def __init__(self, where: str, change: bool = True) -> None:
        super().__init__()
        self.holder = Holder(Holder())
        self.where, self.change = where, change
        torch.manual_seed(0)
        self.blocks = nn.ModuleList(Stepped(self.holder, where) for _ in range(LAYERS))

    def forward(self, x):
        _set(self.holder, self.where, 1)
        for i, block in enumerate(self.blocks):
            x = block(x)
            if self.change and i in (1, 3):
                _set(self.holder, self.where, 2 if i == 1 else 3)
        return x


def _inputs():
    return (torch.randn(B, D, generator=torch.Generator().manual_seed(0)),)


@pytest.mark.parametrize("where", ["list", "dict", "nested"])
def test_a_shared_holder_changed_in_place_between_two_blocks_splits_the_key(monkeypatch, where):
    hand = LAYERS * BLOCK_MACS + (1 + 1 + 2 + 2 + 3 + 3) * STEP_MACS
    model = Stack(where)
    off, on = off_and_on(monkeypatch, model, _inputs())
    assert torch_contraction_flops(copy.deepcopy(model), _inputs()) == 2 * hand
    # before: 5,760 MACs with reuse on (blocks 1-5 booked from block 0, 1 step each), 6,912 off
    assert on.macs == off.macs == hand
    assert rows(on) == rows(off)
    assert on.reused_calls == 3  # block 1 from 0, 3 from 2, 5 from 4


@pytest.mark.parametrize("where", ["list", "dict", "nested"])
def test_a_shared_holder_left_alone_is_still_reused(monkeypatch, where):
    # the holder holds itself (``back``): keyed once, not without end
    off, on = off_and_on(monkeypatch, Stack(where, change=False), _inputs())
    assert on.macs == off.macs == LAYERS * (BLOCK_MACS + STEP_MACS)
    assert rows(on) == rows(off)
    assert on.reused_calls == LAYERS - 1


class Link:
    """A plain object holding the next (a linked list of objects, each block holding its head)."""

    def __init__(self, after=None) -> None:
        self.after = after


class Linked(Block):
    def __init__(self, head: Link) -> None:
        super().__init__()
        self.head = head


class LinkedStack(nn.Module):
    def __init__(self, links: int) -> None:
        super().__init__()
        head = None
        for _ in range(links):
            head = Link(head)
        torch.manual_seed(0)
        self.blocks = nn.ModuleList(Linked(head) for _ in range(LAYERS))

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


@pytest.mark.parametrize("links, reused", [(8, LAYERS - 1), (200, 0)])
def test_objects_nested_deeper_than_the_key_goes_are_traced(monkeypatch, links, reused):
    # up to 16 plain objects deep the key holds their state; deeper, the call is traced (before the
    # depth's cap, keying 200 links ran out of Python's recursion and the count fell back to a real run)
    off, on = off_and_on(monkeypatch, LinkedStack(links), _inputs())
    assert on.macs == off.macs == LAYERS * BLOCK_MACS
    assert rows(on) == rows(off)
    assert on.warnings == off.warnings == ()
    assert on.reused_calls == reused


class AppendsTwoDown(Stepped):
    """Appends to ``self.holder.sub.steps`` (a list two objects down), then does one step per entry
    appended so far: block i does i + 1 steps."""

    def forward(self, x):
        self.holder.sub.steps.append(1)
        y = Block.forward(self, x)
        for _ in range(len(self.holder.sub.steps) - 1):
            y = y @ torch.eye(D)
        return y


class AppendingStack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.holder = Holder(Holder())
        torch.manual_seed(0)
        self.blocks = nn.ModuleList(AppendsTwoDown(self.holder, "nested") for _ in range(LAYERS))

    def forward(self, x):
        del self.holder.sub.steps[1:]  # as found at each run
        for block in self.blocks:
            x = block(x)
        return x


def test_a_first_call_writing_two_objects_down_is_not_booked_again(monkeypatch):
    hand = LAYERS * BLOCK_MACS + sum(range(1, LAYERS + 1)) * STEP_MACS  # 1 + 2 + ... + 6 steps
    model = AppendingStack()
    off, on = off_and_on(monkeypatch, model, _inputs())
    assert torch_contraction_flops(copy.deepcopy(model), _inputs()) == 2 * hand
    # before: the holder's own attributes were compared by identity, so the sub-holder's list grown
    # by the first call was not seen: 5,760 MACs with reuse on (blocks 1-5 booked from block 0), 8,640 off
    assert on.macs == off.macs == hand
    assert rows(on) == rows(off)
    assert on.reused_calls == 0
