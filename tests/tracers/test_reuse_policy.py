"""Structural reuse's default policy (branch resnet11): a twin group is keyed only where keying is
expected to cost less than tracing, by the group's calls and its blocks' size in modules
(``tracers._reuse._pays``: a block of 4 modules pays from 4 calls, one of 25 from 2), and a group
whose members all lie inside members of a keyed group counts only the calls inside one of those
(the others are inside calls booked from the first). ``FLOPCOUNT_REUSE=always`` keys every group,
as before. Oracles: MACs derived by hand (``B * 2 * D * h`` per toy block, ``B * D * D`` per
Linear(D, D)), the count with reuse off (every call traced: the same rows), and ``reused_calls``
as the policy's arithmetic says (each keyed group of n calls: n - 1 booked)."""

from __future__ import annotations

import pytest
import torch
from _toy_stack import B, Block, D, H, Stack, off_and_on, rows
from torch import nn

from flopcount import count_flops


class Wide(nn.Module):
    """A block of 12 Linear(D, D) + ReLU pairs: 25 modules, ``12 * B * D * D`` MACs on (B, D)."""

    def __init__(self) -> None:
        super().__init__()
        for k in range(12):  # leaves of its own (a twin group inside would be a group of its own)
            setattr(self, f"linear{k}", nn.Linear(D, D))
            setattr(self, f"act{k}", nn.ReLU())

    def forward(self, x):
        for k in range(12):
            x = getattr(self, f"act{k}")(getattr(self, f"linear{k}")(x))
        return x


class Pair(nn.Module):
    """Two toy blocks in a row (9 modules)."""

    def __init__(self) -> None:
        super().__init__()
        self.first = Block()
        self.second = Block()

    def forward(self, x):
        return self.second(self.first(x))


def _inputs():
    return (torch.randn(B, D, generator=torch.Generator().manual_seed(0)),)


def _counted(monkeypatch, model, macs):
    """The count with reuse on (the policy the test set) and off: MACs by hand, the same rows."""
    off, on = off_and_on(monkeypatch, model, _inputs())
    assert on.macs == off.macs == macs
    assert rows(on) == rows(off)
    assert off.reused_calls == 0
    return on


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_the_default_policy_traces_a_small_group_of_two_and_keys_a_big_one(monkeypatch, train):
    monkeypatch.delenv("FLOPCOUNT_REUSE", raising=False)
    torch.manual_seed(0)
    # 2 blocks of 4 modules: 2 x (60 x 4 - 100) = 280 us saved < 200 + 85 x 4 = 540 spent: traced
    small = _counted(monkeypatch, Stack(2).train(train), 2 * B * 2 * D * H)
    assert small.reused_calls == 0
    # 8 such blocks: 8 x 140 = 1,120 > 540: keyed, blocks 1..7 booked from block 0
    many = _counted(monkeypatch, Stack(8).train(train), 8 * B * 2 * D * H)
    assert many.reused_calls == 7
    # 2 blocks of 25 modules: 2 x 1,400 = 2,800 > 200 + 85 x 25 = 2,325: keyed, block 1 booked
    wide = _counted(monkeypatch, nn.Sequential(Wide(), Wide()).train(train), 2 * 12 * B * D * D)
    assert wide.reused_calls == 1


def test_always_keys_every_group_as_before(monkeypatch):
    monkeypatch.setenv("FLOPCOUNT_REUSE", "always")
    torch.manual_seed(0)
    on = _counted(monkeypatch, Stack(2), 2 * B * 2 * D * H)
    assert on.reused_calls == 1


def test_a_group_inside_a_keyed_group_counts_the_calls_of_one_member(monkeypatch):
    """6 pairs (9 modules: 6 x 440 > 965, keyed); their 12 toy blocks lie 2 in each pair, so the
    group is 2 calls (the pairs after the first are booked whole): traced by default, keyed with
    ``always`` (the first pair's second block booked from its first)."""
    torch.manual_seed(0)
    model = nn.Sequential(*[Pair() for _ in range(6)])
    macs = 12 * B * 2 * D * H
    monkeypatch.delenv("FLOPCOUNT_REUSE", raising=False)
    assert _counted(monkeypatch, model, macs).reused_calls == 5
    monkeypatch.setenv("FLOPCOUNT_REUSE", "always")
    assert _counted(monkeypatch, model, macs).reused_calls == 6


def test_a_traced_groups_block_called_again_is_keyed_from_its_second_call(monkeypatch):
    """A group the policy traces is run as a module without a twin: its first call unkeyed, its
    later calls keyed (the second recorded, the third booked from it)."""
    monkeypatch.delenv("FLOPCOUNT_REUSE", raising=False)
    torch.manual_seed(0)

    class Twice(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = Block(), Block()

        def forward(self, x):
            return self.b(self.a(self.a(self.a(x))))

    result = count_flops(Twice(), _inputs())
    assert result.macs == 4 * B * 2 * D * H
    assert result.reused_calls == 1  # a's third call; b's one call traced


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_one_shared_block_called_in_a_loop_keeps_its_replays_by_default(monkeypatch, train):
    """ALBERT's shape: one block object called ``n`` times and no twin group at all. Its repeats
    are seen only while the forward runs, so nothing decided before the run may take them away
    (branch resnet12's whole-model decision did: ALBERT-base 11.7 -> 20.4 ms, docs/performance.md).
    The first call unkeyed, the second keyed and traced, the other n - 2 booked from it."""
    monkeypatch.delenv("FLOPCOUNT_REUSE", raising=False)
    torch.manual_seed(0)

    class Looped(nn.Module):
        def __init__(self, n: int) -> None:
            super().__init__()
            self.n, self.block = n, Block()

        def forward(self, x):
            for _ in range(self.n):
                x = self.block(x)
            return x

    model = Looped(6).train(train)
    result = count_flops(model, _inputs())
    assert result.macs == 6 * B * 2 * D * H  # hand count: 6 calls of up and down
    assert [m.calls for m in result.modules if m.name == "block"] == [6]
    assert result.reused_calls == 4
    off, _ = off_and_on(monkeypatch, model, _inputs())
    assert rows(result) == rows(off)
