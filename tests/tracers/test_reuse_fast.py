"""Structural reuse's own costs (issue #32's ResNet-50 speed target): the caller's tensors are read
once, before the run, where a read passes no torch-function mode; a convolution's tuples are shared
by the copy. Speed is not asserted here (no timed tests: benchmarks/bench_reuse.py); what is
asserted is that the count stays exact where those shortcuts could break it: MACs derived by hand
(the derivation beside each model), the same count with reuse off (``FLOPCOUNT_REUSE=0``: every
call traced), and the caller's model left as found."""

from __future__ import annotations

import types

import pytest
import torch
from _toy_stack import B, D, H, Stack
from _toy_stack import off_and_on as _both
from _toy_stack import rows as _rows
from torch import nn

from flopcount import count_flops
from flopcount.tracers import _reuse as reuse
from flopcount.tracers.fake import copies

# the reuse key on stacks of 2 or 3 small blocks: every twin group keyed (the default policy would trace
# them: tests/conftest.py, ``reuse_always``)
pytestmark = pytest.mark.usefixtures("reuse_always")


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_a_count_reads_the_callers_tensors_once_before_the_run(monkeypatch, train):
    # Inside the run a read of a tensor's metadata passes every torch-function mode; the lazy copy
    # read the caller's tensors there, once per keyed block, per copied subtree and per children
    # dictionary (ResNet-50: 25 reads through the modes per count). Now all of them are read in one
    # call before the run: the read function runs once per count (it ran 12 times here before).
    calls = []
    read = copies._read_keys

    def counted(faker, tensors, *rest):
        calls.append(len(tensors))
        return read(faker, tensors, *rest)

    monkeypatch.setattr(copies, "_read_keys", counted)
    torch.manual_seed(0)
    model, inputs = Stack(8).train(train), (torch.randn(B, D),)
    off, on = _both(monkeypatch, model, inputs)
    assert _rows(on) == _rows(off)
    # 8 blocks of Linear(D, H) -> ReLU -> Linear(H, D) + x on B rows: 8 * B * 2 * D * H MACs
    assert on.macs == 8 * B * 2 * D * H
    assert on.reused_calls == 7
    calls.clear()
    count_flops(model, inputs)
    assert calls == [4 * 8]  # one read: every block's two weights and two biases


class _TiedStack(Stack):
    """Blocks 2 and 5 share one ``up`` weight (a tie across two layers; each is keyed and booked
    on its own, so the tie's key is taken by the first and read again for the second)."""

    def __init__(self) -> None:
        super().__init__(8)
        self.blocks[5].up.weight = self.blocks[2].up.weight


@pytest.mark.parametrize("tracer", ["auto", "dispatch", "jit"])
@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_a_weight_tied_across_two_booked_layers_counts_exactly(monkeypatch, tracer, train):
    torch.manual_seed(0)
    model, inputs = _TiedStack().train(train), (torch.randn(B, D),)
    off, on = _both(monkeypatch, model, inputs, tracer=tracer)
    assert _rows(on) == _rows(off)
    assert on.macs == 8 * B * 2 * D * H  # as the untied stack: a tie changes no shape
    assert model.blocks[5].up.weight is model.blocks[2].up.weight


class _ConvBlock(nn.Module):
    def __init__(self, stride: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 3, stride=stride, padding=1, bias=False)
        self.act = nn.ReLU()

    def forward(self, x):
        return self.act(self.conv(x))


class _ConvStack(nn.Module):
    """Four 3x3 convolutions 4 -> 4 channels, padding 1; block 2 has stride 2 (its tuple attribute
    differs, nothing else): on an 8x8 input blocks 0-2 see 8x8, block 2 makes 4x4, block 3 sees 4x4."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(_ConvBlock(2 if i == 2 else 1) for i in range(4))

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


@pytest.mark.parametrize("tracer", ["auto", "dispatch", "jit"])
@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_layers_differing_only_in_a_tuple_attribute_count_each_their_own(monkeypatch, tracer, train):
    torch.manual_seed(0)
    model, inputs = _ConvStack().train(train), (torch.randn(2, 4, 8, 8),)
    off, on = _both(monkeypatch, model, inputs, tracer=tracer)
    assert _rows(on) == _rows(off)
    # a 3x3 conv 4 -> 4 makes out_h * out_w * 4 outputs of 4 * 9 MACs each, batch 2:
    # blocks 0, 1: 8 * 8; block 2 (stride 2): 4 * 4; block 3: 4 * 4
    per_position = 4 * 4 * 9
    assert on.macs == 2 * per_position * (64 + 64 + 16 + 16)
    assert on.by_module("macs")["blocks.2.conv"] == 2 * per_position * 16
    assert on.by_module("macs")["blocks.3.conv"] == 2 * per_position * 16
    assert model.blocks[2].conv.stride == (2, 2) and model.blocks[1].conv.stride == (1, 1)
    if tracer == "auto":
        assert on.reused_calls == 1  # block 1 booked from block 0; block 2 (read stride) and block 3 (input) traced


class _NormBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(D, D)
        self.norm = nn.BatchNorm1d(D)  # buffers of its own: only its set of non-persistent names is empty

    def forward(self, x):
        y = self.norm(self.lin(x))
        if "scale" in self.norm._non_persistent_buffers_set:
            y = y * 2.0  # B * D multiplications, where the name was registered
        return y


class _RegistersOnOne(nn.Module):
    """Four blocks Linear(D, D) -> BatchNorm1d(D); the forward registers a non-persistent buffer on
    block 0's norm only, and a block doubles its output where its norm's set names it."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(_NormBlock() for _ in range(4))

    def forward(self, x):
        first = self.blocks[0].norm
        if "scale" not in first._buffers:
            first.register_buffer("scale", torch.ones(D), persistent=False)
        for block in self.blocks:
            x = block(x)
        return x


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_a_name_added_to_one_modules_empty_set_stays_that_modules(monkeypatch, train):
    # The copy's modules share one empty set of non-persistent buffer names while it stays empty;
    # registering a name on one module must not name it on the others (the run is made again with
    # sets of their own): only block 0 multiplies
    torch.manual_seed(0)
    model, inputs = _RegistersOnOne().train(train), (torch.randn(B, D),)
    off, on = _both(monkeypatch, model, inputs)
    assert _rows(on) == _rows(off)
    assert on.macs == 4 * B * D * D  # four Linear(D, D) on B rows
    muls = {k: v for k, v in on.by_operator("flops").items() if "mul" in k}
    assert sum(muls.values()) == B * D, muls  # one block's y * 2, B * D products
    assert not any("scale" in block.norm._buffers for block in model.blocks)
    assert not any(block.norm._non_persistent_buffers_set for block in model.blocks)


def test_the_up_front_read_keys_each_tensor_as_the_fake_it_will_have():
    # One pass over each tensor's metadata (Faker.deferred_key) must give what reuse_key gives where
    # the tensor is faked from its metadata (a strided, unquantized plain tensor or parameter, set
    # by hand below), None where it is faked another way (sparse, uninitialized); and reuse_key is
    # the fake's own tensor_key (the oracle: the fake made, then read)
    from torch.nn.parameter import UninitializedParameter

    faker = copies._Faker()
    tensors = [
        nn.Parameter(torch.randn(4, 3)), nn.Parameter(torch.randn(4, 3), requires_grad=False),
        torch.zeros(5, dtype=torch.long), torch.randn(6)[2:], torch.randn(2, 3, device="meta").t(),
        nn.Parameter(torch.empty(3, 2, device="meta")), torch.randn(4, 4).to_sparse(), UninitializedParameter(),
    ]
    from_metadata = [True] * 6 + [False] * 2
    for tensor, deferrable in zip(tensors, from_metadata):
        expected = copies.reuse_key(tensor, faker.fake_type) if deferrable else None
        assert faker.deferred_key(tensor) == expected, tensor.__class__.__name__
        if expected is not None:
            with torch._C._DisableTorchDispatch():
                fake = faker.fake(tensor)
            assert copies.tensor_key(fake) == expected


class _HoldingBlock(nn.Module):
    """The toy block with plain attributes of every kind a first call's state check meets: scalars
    and tuples (which cannot hold state a call changes in place) beside a list and a plain object
    (which can: the check keys their contents). The forward reads them and does the same work
    whatever they hold. The config is one object all blocks share (as a transformers config is):
    such an object is keyed by identity and by its own attributes."""

    def __init__(self, config: types.SimpleNamespace) -> None:
        super().__init__()
        self.up = nn.Linear(D, H)
        self.act = nn.ReLU()
        self.down = nn.Linear(H, D)
        self.scale, self.steps, self.name, self.flag, self.dims = 1.0, 3, "block", True, (D, H)
        self.seen = []  # appended to by no call: the blocks stay clean
        self.config = config

    def forward(self, x):
        # (no ``assert`` here: pytest rewrites a test module's asserts into calls of its own helpers,
        # which the reuse key follows as the forward's code)
        if self.dims != (D, H) or self.steps != 3 or not self.flag or self.seen or self.name != "block":
            raise ValueError("a block's attributes were not copied as they are")
        return self.down(self.act(self.up(x))) * self.scale + x * self.config.depth


class _HoldingStack(nn.Module):
    def __init__(self, n: int = 8) -> None:
        super().__init__()
        config = types.SimpleNamespace(depth=2)
        self.blocks = nn.ModuleList(_HoldingBlock(config) for _ in range(n))

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_a_first_calls_state_check_asks_no_scalar_or_tuple_whether_it_is_a_plain_object(monkeypatch, train):
    # Before and after a first call, structural reuse keys the contents of every attribute of its
    # subtree that can change without being rebound (a list, a dict, a plain object, a generator):
    # which attributes those are it asked ``plain_object`` of each one, and for an int, a float, a
    # tuple ``plain_object`` raises and catches an error (~1 us each; a ResNet-50 count asked ~300,
    # ~2-3 % of the count). A scalar's or a tuple's type says it is none of them: asked of nothing
    # now (branch resnet10; the parent asked every int, float, str, bool and tuple here).
    asked = []
    plain_object = reuse.plain_object

    def counted(value):
        asked.append(type(value))
        return plain_object(value)

    monkeypatch.setattr(reuse, "plain_object", counted)
    torch.manual_seed(0)
    model, inputs = _HoldingStack(8).train(train), (torch.randn(B, D),)
    off, on = _both(monkeypatch, model, inputs)
    assert _rows(on) == _rows(off)
    # per block Linear(D, H) and Linear(H, D) on B rows: 2 * D * H MACs a row (the scaling and
    # the residual are no MACs)
    assert on.macs == 8 * B * 2 * D * H
    assert on.reused_calls == 7  # the blocks booked from the first: the check found each clean
    assert not {int, float, str, bool, tuple} & set(asked)
    assert types.SimpleNamespace in asked  # the config is still asked (and keyed by its attributes)
