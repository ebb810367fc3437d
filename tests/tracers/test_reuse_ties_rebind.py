"""Structural reuse's key and what a block's work depends on besides its tensors' metadata (issue
#32 item 4, branch ``exact3``): which of a subtree's parameters are one tensor (``b.weight =
a.weight``, before the count or made by the parent in its forward) and the code a block runs
(``Block.forward``, a method it calls, a helper function of its Python module, rebound by the
parent between two blocks). Before, such blocks were booked from block 0. Oracles: MACs derived by
hand, ``FlopCounterMode`` live on a copy of the model, and the count with reuse off
(``FLOPCOUNT_REUSE=0``: every call traced)."""

from __future__ import annotations

import copy

import pytest
import torch
from _toy_stack import B, D, off_and_on, rows
from conftest import torch_contraction_flops
from torch import nn

from flopcount.core import state

# the reuse key on stacks of 2 or 3 small blocks: every twin group keyed (the default policy would trace
# them: tests/conftest.py, ``reuse_always``)
pytestmark = pytest.mark.usefixtures("reuse_always")

LAYERS = 4
MATMUL = B * D * D  # one Linear(D, D) on a (B, D) activation


def _inputs():
    return (torch.randn(B, D, generator=torch.Generator().manual_seed(0)),)


def _check(monkeypatch, model, matmuls, reused):
    """The count with reuse on and off equals the hand count (``matmuls`` Linear(D, D)s) and
    ``FlopCounterMode``'s, and reuse booked ``reused`` calls."""
    hand = matmuls * MATMUL
    assert torch_contraction_flops(copy.deepcopy(model), _inputs()) == 2 * hand
    off, on = off_and_on(monkeypatch, model, _inputs())
    assert on.macs == off.macs == hand
    assert rows(on) == rows(off)
    assert on.reused_calls == reused


class Tied(nn.Module):
    """Runs ``b`` after ``a`` only where the two do not share their weight: 1 matmul tied, 2 not."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(D, D, bias=False)
        self.b = nn.Linear(D, D, bias=False)

    def forward(self, x):
        y = self.a(x)
        if self.a.weight is not self.b.weight:
            y = self.b(y)
        return y


class TiedStack(nn.Module):
    """Blocks 1 and 3 tied: before the count (``inside=False``) or by this forward, just before each runs."""

    def __init__(self, inside: bool) -> None:
        super().__init__()
        self.inside = inside
        torch.manual_seed(0)
        self.blocks = nn.ModuleList(Tied() for _ in range(LAYERS))
        if not inside:
            for i in (1, 3):
                self.blocks[i].b.weight = self.blocks[i].a.weight

    def forward(self, x):
        for i, block in enumerate(self.blocks):
            if self.inside and i in (1, 3):
                block.b.weight = block.a.weight
            x = block(x)
        return x


@pytest.mark.parametrize("inside", [False, True], ids=["before the count", "in the forward"])
def test_ties_between_a_blocks_parameters_split_the_key(monkeypatch, inside):
    # before: 1,536 MACs with reuse on (blocks 1-3 booked from block 0, 2 matmuls each), 1,152 off
    model = TiedStack(inside)
    _check(monkeypatch, model, matmuls=2 + 1 + 2 + 1, reused=2)  # block 2 from 0, 3 from 1
    if inside:  # the caller's model is left as found: no block of its is tied
        assert all(block.a.weight is not block.b.weight for block in model.blocks)


def test_untied_blocks_are_still_reused(monkeypatch):
    model = TiedStack(inside=False)
    for i in (1, 3):
        model.blocks[i].b.weight = nn.Parameter(model.blocks[i].a.weight.detach().clone())
    _check(monkeypatch, model, matmuls=2 * LAYERS, reused=LAYERS - 1)


def _one(module, y):
    return module.b(y)


def _two(module, y):
    return module.b(module.b(y))


def _helper(module, y):  # rebound to ``_two`` by RebindingStack("global")
    return _one(module, y)


class Rebound(nn.Module):
    """``a``, then ``self.extra`` (one ``b``), then the module function ``_helper`` (one ``b``): 3 matmuls."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(D, D, bias=False)
        self.b = nn.Linear(D, D, bias=False)

    def forward(self, x):
        return _helper(self, self.extra(self.a(x)))

    def extra(self, y):
        return self.b(y)


def _forward_a_only(self, x):  # 1 matmul
    return self.a(x)


def _extra_twice(self, y):  # 2 matmuls where ``extra`` did 1
    return self.b(self.b(y))


class RebindingStack(nn.Module):
    """From block 2 on, the parent rebinds code: the class's ``forward`` (1 matmul), the method
    ``extra`` its forward calls (4), or the module function ``_helper`` it calls (4); set back after."""

    def __init__(self, what: str) -> None:
        super().__init__()
        self.what = what
        torch.manual_seed(0)
        self.blocks = nn.ModuleList(Rebound() for _ in range(LAYERS))

    def forward(self, x):
        global _helper
        saved = (Rebound.forward, Rebound.extra, _helper)
        try:
            for i, block in enumerate(self.blocks):
                if i == 2:
                    if self.what == "forward":
                        Rebound.forward = _forward_a_only
                    elif self.what == "method":
                        Rebound.extra = _extra_twice
                    elif self.what == "global":
                        _helper = _two
                x = block(x)
        finally:
            Rebound.forward, Rebound.extra, _helper = saved
        return x


@pytest.mark.parametrize("what, later", [("forward", 1), ("method", 4), ("global", 4)])
def test_code_rebound_between_two_blocks_splits_the_key(monkeypatch, what, later):
    # before: 2,304 MACs with reuse on (blocks 1-3 booked from block 0, 3 matmuls each); off
    # 1,536 (forward), 2,688 (method and global)
    _check(monkeypatch, RebindingStack(what), matmuls=2 * 3 + 2 * later, reused=2)  # block 1 from 0, 3 from 2
    assert Rebound.forward.__name__ == "forward" and Rebound.extra.__name__ == "extra" and _helper is not _two


def test_code_left_alone_is_still_reused(monkeypatch):
    _check(monkeypatch, RebindingStack("none"), matmuls=3 * LAYERS, reused=LAYERS - 1)


def test_code_bound_sees_a_subclass_shadowing_a_method():
    # the places a method is bound are each class of the MRO up to the one defining it
    class Base(nn.Module):
        def forward(self, x):
            return self.extra(x)

        def extra(self, x):
            return x

    class Sub(Base):
        pass

    bound = state.code_bound(Sub)
    assert state.still_bound(bound)
    Sub.extra = lambda self, x: x + 1
    assert not state.still_bound(bound)
    del Sub.extra
    assert state.still_bound(bound)
    Sub.forward = lambda self, x: x
    assert not state.still_bound(bound)


class GradReading(Tied):
    """Runs ``b`` after ``a`` only where ``b``'s weight requires a gradient: 2 matmuls, 1 frozen."""

    def forward(self, x):
        y = self.a(x)
        if self.b.weight.requires_grad:
            y = self.b(y)
        return y


class FreezingStack(nn.Module):
    """The parent freezes blocks 2 and 3 in its forward, just before each runs."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList(GradReading() for _ in range(LAYERS))

    def forward(self, x):
        for i, block in enumerate(self.blocks):
            if i >= 2:
                block.requires_grad_(False)
            x = block(x)
        return x


def test_weights_frozen_by_the_parent_between_two_blocks_split_the_key(monkeypatch):
    # before: 1,536 MACs with reuse on (blocks 1-3 booked from block 0: their keys read requires_grad
    # once per count), 1,152 off
    model = FreezingStack()
    _check(monkeypatch, model, matmuls=2 + 2 + 1 + 1, reused=2)  # block 1 from 0, 3 from 2
    assert all(p.requires_grad for p in model.parameters())  # the caller's left as found


class FreezesItself(GradReading):
    """Freezes its own ``b`` after running it: a replay would leave it trainable."""

    def forward(self, x):
        y = super().forward(x)
        self.b.weight.requires_grad_(False)
        return y


class AskingStack(nn.Module):
    """After the blocks, one more matmul where block 1's ``b`` still requires a gradient."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList(FreezesItself() for _ in range(LAYERS))
        self.extra = nn.Linear(D, D, bias=False)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        if self.blocks[1].b.weight.requires_grad:
            x = self.extra(x)
        return x


def test_a_first_call_freezing_its_own_weights_is_not_booked_again(monkeypatch):
    # before: 1,728 MACs with reuse on (blocks 1-3 booked from block 0, block 1's ``b`` left
    # trainable, so the parent ran ``extra``), 1,536 off
    _check(monkeypatch, AskingStack(), matmuls=2 * LAYERS, reused=0)
