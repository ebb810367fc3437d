"""Lazy fakes on the reuse path (issue #32, the count's ratio): a forward-only count fakes a
module's parameters and buffers on first use, so the blocks booked from an earlier one never
have theirs faked. Oracles: hand-derived MACs (the derivation beside each), ``FlopCounterMode``
run live, the same count with reuse off (``FLOPCOUNT_REUSE=0``: every parameter faked up front,
every call traced, as before #32), and the number of fakes the faker makes, counted by hand."""

from __future__ import annotations

import copy

import pytest
import torch
from _toy_stack import B, D, H, Stack
from _toy_stack import off_and_on as _both
from _toy_stack import rows as _rows
from conftest import torch_contraction_flops
from torch import nn

from flopcount import count_flops
from flopcount.tracers.fake import copies


class ReadsInside(Stack):
    """The root reads a reused block's weight after the loop: x @ W^T of blocks.5.up (D -> H),
    B x D x H MACs more."""

    def forward(self, x):
        return super().forward(x) @ self.blocks[5].up.weight.t()


class TiedHead(Stack):
    """A head whose weight is blocks.3.down's (the same Parameter): D x D MACs per row more."""

    def __init__(self) -> None:
        super().__init__(n=6, hidden=D)
        self.head = nn.Linear(D, D, bias=False)
        self.head.weight = self.blocks[3].down.weight

    def forward(self, x):
        return self.head(super().forward(x))


def _stack_macs(n: int, hidden: int = H, rows: int = B) -> int:
    return n * rows * 2 * D * hidden




@pytest.fixture
def faked(monkeypatch):
    """The real tensors the faker is asked for, in order (one call per fake made)."""
    made = []
    original, pending = copies._Faker.fake, copies._Faker.fake_pending

    def fake(self, tensor, what="a tensor"):
        if id(tensor) not in self.memo:
            made.append(tensor)
        return original(self, tensor, what)

    def fake_pending(self, waiting):  # a parameter faked on first use
        if id(waiting.real) not in self.memo:
            made.append(waiting.real)
        return pending(self, waiting)

    monkeypatch.setattr(copies._Faker, "fake", fake)
    monkeypatch.setattr(copies._Faker, "fake_pending", fake_pending)
    return made


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_blocks_booked_from_an_earlier_one_never_fake_their_parameters(monkeypatch, faked, train):
    torch.manual_seed(0)
    model, inputs = Stack().train(train), (torch.randn(B, D),)
    monkeypatch.setenv("FLOPCOUNT_REUSE", "1")
    result = count_flops(model, inputs)
    assert result.macs == _stack_macs(8)
    assert 2 * result.macs == torch_contraction_flops(copy.deepcopy(model), inputs)
    # blocks.0 is traced (its 2 weights and 2 biases faked), blocks.1-7 are booked from it;
    # and the input: 5 fakes (before #32's lazy fakes: all 32 parameters and the input)
    block0 = {id(p) for p in model.blocks[0].parameters()}
    assert len(faked) == 5
    assert {id(t) for t in faked[1:]} | {id(faked[0])} >= block0
    assert faked[0] is inputs[0]
    faked.clear()
    monkeypatch.setenv("FLOPCOUNT_REUSE", "0")
    assert count_flops(model, inputs).macs == result.macs
    assert len(faked) == 33  # every parameter, up front, and the input


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_a_reused_blocks_parameter_read_outside_its_call_is_faked_then(monkeypatch, train):
    torch.manual_seed(0)
    model, inputs = ReadsInside().train(train), (torch.randn(B, D),)
    off, on = _both(monkeypatch, model, inputs)
    assert _rows(on) == _rows(off)
    assert on.macs == _stack_macs(8) + B * D * H
    assert 2 * on.macs == torch_contraction_flops(copy.deepcopy(model), inputs)


def test_a_weight_tied_to_a_reused_block_is_one_fake(monkeypatch, faked):
    torch.manual_seed(0)
    model, inputs = TiedHead(), (torch.randn(B, D),)
    off, on = _both(monkeypatch, model, inputs)
    assert _rows(on) == _rows(off)
    assert on.macs == _stack_macs(6, hidden=D) + B * D * D
    # the head's weight and blocks.3.down's are one tensor, faked once per count
    tied = model.head.weight
    assert sum(1 for t in faked if t is tied) == 2  # reuse off, reuse on: once each


def test_a_count_in_inference_mode_fakes_as_before(monkeypatch):
    torch.manual_seed(0)
    model, inputs = ReadsInside(), (torch.randn(B, D),)
    with torch.inference_mode():
        off, on = _both(monkeypatch, model, inputs)
    assert _rows(on) == _rows(off)
    assert on.macs == _stack_macs(8) + B * D * H


def test_a_parameter_reshaped_in_place_between_two_counts(monkeypatch):
    torch.manual_seed(0)
    model, inputs = Stack(n=4), (torch.randn(B, D),)
    monkeypatch.setenv("FLOPCOUNT_REUSE", "1")
    assert count_flops(model, inputs).macs == _stack_macs(4)
    params = {id(p) for p in model.parameters()}
    with torch.no_grad():  # the same Parameter objects, twice as wide inside
        for block in model.blocks:
            block.up.weight.data = torch.randn(2 * H, D)
            block.up.bias.data = torch.randn(2 * H)
            block.down.weight.data = torch.randn(D, 2 * H)
    assert {id(p) for p in model.parameters()} == params
    off, on = _both(monkeypatch, model, inputs)
    assert _rows(on) == _rows(off)
    assert on.macs == _stack_macs(4, hidden=2 * H)


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_backward_counts_as_before(monkeypatch, train):
    torch.manual_seed(0)
    model, inputs = ReadsInside().train(train), (torch.randn(B, D),)
    off, on = _both(monkeypatch, model, inputs, backward=True)
    assert _rows(on) == _rows(off)
    # forward: the hand count above; backward of each x @ W^T with W a leaf: the gradients of
    # x and W, two products of the forward's size each (the input needs none: 2x the forward)
    forward = _stack_macs(8) + B * D * H
    assert on.by_phase("macs") == {"forward": forward, "backward": 2 * forward - B * D * H}


@pytest.mark.parametrize(
    "tensor",
    [
        nn.Parameter(torch.randn(3, 4)),
        nn.Parameter(torch.randn(4), requires_grad=False),
        torch.zeros(5, dtype=torch.long),  # a buffer: no gradient
        torch.randn(2, 3, device="meta").t(),  # a meta view: stands for a CPU tensor, at offset 0
        torch.randn(6)[2:],  # an offset view: the fast fake starts at offset 0
    ],
    ids=["param", "frozen", "long-buffer", "meta-transposed", "offset-view"],
)
def test_a_pending_tensors_key_is_its_fakes_key(tensor):
    # the key structural reuse gives a parameter not faked yet (read from the real tensor) is
    # the one it reads from the fake once made: a block keyed before and after agrees
    faker = copies._Faker()
    key = copies.reuse_key(tensor, faker.fake_type)
    assert copies.tensor_key(faker.fake(tensor)) == key
    # and the fake made on first use from that key is the fake made up front, metadata and kind
    eager = faker.fake(tensor)
    lazy = copies._Faker().fake_pending(copies.Pending(tensor, key))
    assert copies.tensor_key(lazy) == key
    assert (isinstance(lazy, nn.Parameter), lazy.is_leaf, lazy.fake_device) == (
        isinstance(eager, nn.Parameter), eager.is_leaf, eager.fake_device)


class CachedBias(nn.Module):
    """A layer that keeps, in eval mode, a tensor made from its parameter in a plain dictionary
    (timm LeViT's ``Attention.attention_bias_cache``): Linear(D, D) + that bias, B x D x D MACs."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(D, D, bias=False)
        self.table = nn.Parameter(torch.randn(D))
        self.cache = {}

    def forward(self, x):
        if self.training:
            return self.linear(x) + self.table
        if "bias" not in self.cache:
            self.cache["bias"] = self.table * 2
        return self.linear(x) + self.cache["bias"]


class CachedBlock(nn.Module):
    """The layer one level down (LeViT's block holding its attention): a call of a block is keyed
    with the layer's cache read, from the caller's layer when its copy is not made yet."""

    def __init__(self) -> None:
        super().__init__()
        self.attn = CachedBias()

    def forward(self, x):
        return self.attn(x)


class CachedStack(nn.Module):
    def __init__(self, n: int = 4) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(CachedBlock() for _ in range(n))

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


def test_blocks_holding_a_cached_tensor_after_a_forward_are_counted_on_fakes(monkeypatch):
    """After an eval forward each layer's cache holds a real tensor. Reuse keys a layer not copied
    yet as its copy will be, which a tensor attribute cannot be without copying it: the call is
    traced (before, that refusal escaped the forward, and the count fell back to a real run with a
    warning the reuse-off count does not have)."""
    model, x = CachedStack().eval(), torch.randn(B, D)
    with torch.no_grad():
        model(x)  # fills every layer's cache
    cached = [block.attn.cache["bias"] for block in model.blocks]
    off, on = _both(monkeypatch, model, x)
    assert off.warnings == on.warnings == ()
    assert _rows(off) == _rows(on)
    # hand-derived: four Linear(D, D) without bias on B rows, and one add per element per layer
    assert on.macs == 4 * B * D * D
    assert on.by_operator("flops")["aten::add"] == 4 * B * D
    assert all(block.attn.cache["bias"] is t for block, t in zip(model.blocks, cached))  # left as found
