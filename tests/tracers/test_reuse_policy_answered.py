"""Structural reuse's default policy weighs a block's leaves that a traced call answers from an earlier
call of their key (torch's own convolutions and batch norms, ``tracers/_leaf_calls.py``) apart from
other modules (branch resnet14, ``tracers._reuse._pays``): such a leaf saves less when its block is
booked (traced, it is a key and a fresh result) and costs more in the group's first call (which runs
it). A ResNet-50 bottleneck (8 modules, 6 of them answered leaves in eval) pays from 5 calls, where
it paid from 3 before; a batch norm that tracks its statistics in training runs every call, so in
training the same bottleneck (3 answered) pays from 4; a subclass of ``nn.Conv2d`` is not answered
(only the exact classes are), so it weighs as any module.

Oracles: the convolutions' MACs by hand (``H W C_out C_in/groups k^2`` per call), the count with reuse
off (every call traced: the same rows), and ``reused_calls`` as the policy's arithmetic says (a keyed
group of n calls: n - 1 booked)."""

from __future__ import annotations

import pytest
import torch
from _toy_stack import off_and_on, rows
from torch import nn

from examples.resnet import Bottleneck

CIN, WIDTH, SIDE = 16, 4, 5  # a bottleneck 16 -> 4 -> 4 -> 16 (no shortcut module: 8 modules), on 5 x 5


def _block_macs() -> int:
    """conv1 1x1 16->4, conv2 3x3 4->4 (padding 1), conv3 1x1 4->16, each on 5 x 5 outputs."""
    hw = SIDE * SIDE
    return hw * WIDTH * CIN + hw * WIDTH * WIDTH * 9 + hw * CIN * WIDTH


class OwnConv(nn.Conv2d):
    """A convolution of the user's own class: not answered from an earlier call (not exactly Conv2d)."""


def _stack(n: int, own_convs: bool = False) -> nn.Sequential:
    blocks = []
    for _ in range(n):
        block = Bottleneck(CIN, WIDTH)
        if own_convs:
            for name in ("conv1", "conv2", "conv3"):
                conv = getattr(block, name)
                mine = OwnConv(conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride, conv.padding, bias=False)
                mine.load_state_dict(conv.state_dict())
                setattr(block, name, mine)
        blocks.append(block)
    return nn.Sequential(*blocks)


def _counted(monkeypatch, model, n):
    inputs = (torch.randn(1, CIN, SIDE, SIDE, generator=torch.Generator().manual_seed(0)),)
    off, on = off_and_on(monkeypatch, model, inputs)
    assert on.macs == off.macs == n * _block_macs()
    assert rows(on) == rows(off)
    assert off.reused_calls == 0
    return on


@pytest.mark.parametrize("n, booked", [(3, 0), (4, 0), (5, 4)])
def test_bottlenecks_of_answered_leaves_are_keyed_from_five_calls(monkeypatch, n, booked):
    # 6 answered of 8: n x (-100 + 60 x 2 + 35 x 6) = n x 230 against 200 + 85 x 8 + 25 x 6 = 1,030;
    # the parent's rule, n x (60 x 8 - 100) = n x 380 > 200 + 85 x 8 = 880, keyed 3 and 4 (2 and 3 booked)
    monkeypatch.delenv("FLOPCOUNT_REUSE", raising=False)
    torch.manual_seed(0)
    assert _counted(monkeypatch, _stack(n).eval(), n).reused_calls == booked


def test_batch_norms_tracking_statistics_in_training_weigh_as_modules(monkeypatch):
    # in training the 3 batch norms run every call (their statistics are written): 3 answered of 8,
    # 4 x (-100 + 60 x 5 + 35 x 3) = 1,220 > 200 + 85 x 8 + 25 x 3 = 955: keyed, 3 booked
    monkeypatch.delenv("FLOPCOUNT_REUSE", raising=False)
    torch.manual_seed(0)
    assert _counted(monkeypatch, _stack(4).train(), 4).reused_calls == 3


def test_a_subclass_of_an_answered_class_weighs_as_any_module(monkeypatch):
    # OwnConv is not answered: 3 answered (the batch norms) of 8, keyed from 4 calls as above
    monkeypatch.delenv("FLOPCOUNT_REUSE", raising=False)
    torch.manual_seed(0)
    assert _counted(monkeypatch, _stack(4, own_convs=True).eval(), 4).reused_calls == 3


def test_always_keys_them_whatever_their_leaves(monkeypatch):
    monkeypatch.setenv("FLOPCOUNT_REUSE", "always")
    torch.manual_seed(0)
    assert _counted(monkeypatch, _stack(3).eval(), 3).reused_calls == 2
