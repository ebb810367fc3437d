"""A first (recorded) call of structural reuse answers its torch convolutions and batch norms from an
earlier call of their key, as a traced call does (``tracers/_leaf_calls.py``; branch resnet16). Before,
the subtree of a first call ran under its tracking classes (``tracers/_reuse.py``: its attribute reads
logged), which are not the exact classes a leaf is answered for: its leaves ran every count, their
tensors faked. The leaf's key reads its attributes through ``vars()``, which the tracking class logs
as a read of every plain attribute, so the first call's entry holds what the answer depended on
(a block whose convolution differs in an attribute the key holds is not booked from it).

Oracles: the convolutions' MACs by hand (``H_out W_out C_out C_in k^2`` per call, no bias), the same
count with reuse off (``FLOPCOUNT_REUSE=0``: every call traced) and on real weights
(``tracer="dispatch"``), row for row; the fakes made from the caller's tensors, counted by hand; the
caller's model left as found."""

from __future__ import annotations

import pytest
import torch
from _toy_stack import off_and_on, rows
from conftest import assert_same_state, snapshot
from torch import nn

from flopcount import count_flops
from flopcount.tracers import _leaf_calls
from flopcount.tracers.fake import copies

C, SIDE, K = 8, 8, 3  # channels, input height and width, kernel size


class ConvBlock(nn.Module):
    """Conv2d(C, C, 3, padding 1, no bias) -> BatchNorm2d(C) -> relu: 8 modules' worth of a ResNet block."""

    def __init__(self, stride: int = 1) -> None:
        super().__init__()
        self.conv = nn.Conv2d(C, C, K, stride=stride, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(C)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))


class Blocks(nn.Module):
    def __init__(self, strides) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(ConvBlock(s) for s in strides)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


def _conv_macs(side: int, stride: int) -> int:
    out = (side + 2 - K) // stride + 1
    return out * out * C * C * K * K


def _inputs():
    return (torch.randn(1, C, SIDE, SIDE, generator=torch.Generator().manual_seed(0)),)


@pytest.fixture
def fresh_answers(monkeypatch):
    """No leaf answer kept from an earlier test; the fakes made from a pending tensor, counted."""
    monkeypatch.setattr(_leaf_calls, "_ANSWERS", {})
    made = []
    fake_pending = copies._Faker.fake_pending

    def counted(self, pending):
        made.append(pending.real)
        return fake_pending(self, pending)

    monkeypatch.setattr(copies._Faker, "fake_pending", counted)
    return made


def test_a_first_call_answers_its_leaves_from_the_count_before(monkeypatch, reuse_always, fresh_answers):
    torch.manual_seed(0)
    model = Blocks([1, 1, 1]).eval()
    macs = 3 * _conv_macs(SIDE, 1)
    off, on = off_and_on(monkeypatch, model, _inputs())
    assert on.macs == off.macs == count_flops(model, _inputs(), tracer="dispatch").macs == macs
    assert rows(on) == rows(off)
    assert on.reused_calls == 2  # blocks 1 and 2 booked from block 0's first call
    fresh_answers.clear()
    before = snapshot(model)
    again = count_flops(model, _inputs())
    assert_same_state(model, before)
    assert rows(again) == rows(off) and again.reused_calls == 2
    # block 0's first call answers its convolution and batch norm from the count before: no tensor
    # faked (the parent: the convolution's weight and the norm's weight, bias and running statistics, 5)
    assert fresh_answers == []


def test_a_block_whose_convolution_differs_in_stride_is_not_booked_from_an_answered_first_call(
    monkeypatch, reuse_always, fresh_answers
):
    # blocks 0 and 1 stride 1, block 2 stride 2: one structural key (the stride is a plain attribute of a
    # tracked module, keyed where read), so only the first call's reads tell block 2 apart. In the second
    # count block 0's convolution is answered, its forward not run: the read of every attribute its key
    # makes is what keys the stride
    torch.manual_seed(0)
    model = Blocks([1, 1, 2]).eval()
    macs = 2 * _conv_macs(SIDE, 1) + _conv_macs(SIDE, 2)
    off, on = off_and_on(monkeypatch, model, _inputs())
    assert on.macs == off.macs == count_flops(model, _inputs(), tracer="dispatch").macs == macs
    assert rows(on) == rows(off) and on.reused_calls == 1
    fresh_answers.clear()
    before = snapshot(model)
    again = count_flops(model, _inputs())
    assert_same_state(model, before)
    assert again.macs == macs
    assert rows(again) == rows(off) and again.reused_calls == 1
    assert fresh_answers == []  # every leaf answered (block 2's from its own first call the count before)
