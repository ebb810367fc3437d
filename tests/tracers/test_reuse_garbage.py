"""A count leaves nothing for the garbage collector (issue #32): structural reuse's wrapped
forwards and its tracking classes used to hold the Reuse object, hence the recorder, every
event and the whole fake copy, in reference cycles; each count of a 70B model then left ~28,000
objects to the collector's next full pass, which walks the whole heap (hundreds of ms on
a process that has imported transformers). Oracle: the objects the collector can see, counted
with the collector off, before the count and after its result is dropped."""

from __future__ import annotations

import gc
from typing import Iterator

import pytest
import torch
from torch import nn

from flopcount import count_flops
from flopcount.types import OpEvent


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(8, 16)
        self.down = nn.Linear(16, 8)

    def forward(self, x):
        return self.down(torch.relu(self.up(x))) + x


class Stack(nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(n))

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


@pytest.fixture
def collector_off() -> Iterator[None]:
    was = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _alive(kind: type) -> int:
    return sum(1 for o in gc.get_objects() if type(o) is kind)


@pytest.mark.parametrize("reuse", ["1", "0"])
@pytest.mark.parametrize("meta", [False, True], ids=["real", "meta"])
def test_a_count_frees_its_copy_and_events_without_the_collector(monkeypatch, collector_off, reuse, meta):
    monkeypatch.setenv("FLOPCOUNT_REUSE", reuse)
    device = "meta" if meta else "cpu"
    model = Stack(6).to(device).eval()
    x = torch.randn(3, 8, device=device)
    count_flops(model, (x,))  # imports and first-use caches are made before counting objects
    blocks, events = _alive(Block), _alive(OpEvent)
    result = count_flops(model, (x,))
    # 6 blocks x (2 linear + relu + add) MACs: 3 rows x 6 x 2 x 8 x 16 (by hand)
    assert result.macs == 3 * 6 * 2 * 8 * 16
    del result
    assert _alive(Block) == blocks  # the fake copy's six blocks are gone
    assert _alive(OpEvent) == events


def test_a_gpt2_count_leaves_no_cycles(monkeypatch, collector_off):
    hf = pytest.importorskip("examples.hf")
    pytest.importorskip("transformers")
    monkeypatch.setenv("FLOPCOUNT_REUSE", "1")
    model = hf.gpt2(n_layer=4, n_embd=64, n_head=4, vocab_size=300, n_positions=64).eval()
    ids = hf.token_ids(2, 12, 300)
    count_flops(model, (ids,))
    kind = type(model.transformer.h[0])
    blocks, events = _alive(kind), _alive(OpEvent)
    count_flops(model, (ids,))
    assert (_alive(kind), _alive(OpEvent)) == (blocks, events)


class HooksItsChild(nn.Module):
    """Registers a forward hook on its first child during its own forward (on the copy
    flopcount runs, a new copy each count): the hook doubles that child's output."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 16)
        self.b = nn.Linear(16, 4)

    def forward(self, x):
        handle = self.a.register_forward_hook(lambda module, args, out: out * 2)
        try:
            return self.b(self.a(x))
        finally:
            handle.remove()


@pytest.mark.parametrize("meta", [False, True], ids=["real", "meta"])
@pytest.mark.parametrize("reuse", ["1", "0"])
def test_a_hook_registered_during_the_forward_runs_on_its_module_only(monkeypatch, reuse, meta):
    """The fake copy's modules share their empty hook dictionaries (fewer objects per count);
    a forward that registers a hook on one of them is run again on a copy whose modules have
    their own, so the hook runs on ``a`` only: one multiplication, not one per module."""
    monkeypatch.setenv("FLOPCOUNT_REUSE", reuse)
    device = "meta" if meta else "cpu"
    model = HooksItsChild().to(device)
    x = torch.randn(3, 8, device=device)
    result = count_flops(model, (x,))
    assert result.by_operator("count").get("aten::mul") == 1
    # module hooks run after the module has left the call stack: the mul is the caller's
    counts = result.by_module("count")
    assert (counts["a"], counts["b"], counts[""]) == (1, 1, 3)
    assert result.macs == 3 * (8 * 16 + 16 * 4)  # by hand: two linears on 3 rows
    assert not model.a._forward_hooks and not model._forward_hooks


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_a_hook_registered_during_the_forward_with_backward_matches_a_real_run(train):
    """backward=True runs on a fake copy too: the hook's multiplication and its gradient are
    counted once each, as the real run (dispatch, on the model's private twin) counts them."""
    model = HooksItsChild().train(train)
    x = torch.randn(3, 8)
    fake = count_flops(model, (x,), backward=True)
    real = count_flops(model, (x,), backward=True, tracer="dispatch")
    assert fake.by_operator("count") == real.by_operator("count")
    assert fake.by_module("flops") == real.by_module("flops")
    assert fake.by_operator("count")["aten::mul"] == 2  # the hook's, and its gradient's
