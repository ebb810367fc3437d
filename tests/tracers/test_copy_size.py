"""The fake copy's size per repeated layer (issue #32's memory target: the count's working set
must not grow with the number of layers beyond the per-module rows). Each copied module used to
hold an empty ``_parameters`` / ``_buffers`` / ``_modules`` dictionary and an empty
non-persistent buffer set of its own, a reuse key (a tuple of tuples) per parameter although the
layers' keys are equal, and a memo entry per parameter dictionary (the empty non-persistent
buffer set is still each module's own, in the memo: sharing it would name one more private torch
attribute, and a user's empty set two modules hold must stay one). The checks below are structural (which
objects are shared, which are not kept), so they do not depend on the interpreter's sizes; the
counts on the paths that change a shared container are checked against hand-derived MACs and
the same count with reuse off. The user's model is checked to be left as found."""

from __future__ import annotations

import copy
import sys

import pytest
import torch
from _toy_stack import B, D, H, Stack
from torch import nn

from flopcount import count_flops
from flopcount.tracers.fake import copies


def _copy(model: nn.Module) -> copies.FakeCopy:
    x = torch.randn(B, D)
    return copies.fake_copies(model, [x], lambda t: ((t[0],), {}), shared_hooks=copies.SharedHooks(), lazy=True)


def test_empty_containers_are_shared_by_the_copys_modules():
    copied = _copy(Stack(4)).model
    acts = [b.act for b in copied.blocks]  # ReLU: no parameter, buffer or child
    leaves = [m for b in copied.blocks for m in (b.up, b.down, b.act)]
    assert len({id(vars(m)["_modules"]) for m in leaves}) == 1
    assert len({id(vars(m)["_buffers"]) for m in leaves}) == 1
    assert len({id(vars(m)["_parameters"]) for m in acts}) == 1


def test_equal_parameters_share_one_reuse_key():
    copied = _copy(Stack(4)).model
    weights = [dict.__getitem__(vars(b.up)["_parameters"], "weight") for b in copied.blocks]
    assert all(type(w) is copies.Pending for w in weights)
    assert len({id(w.key) for w in weights}) == 1  # one key object for the four equal weights
    assert len({id(w) for w in weights}) == 4  # a Pending per parameter still (ties are by Pending)


def test_the_memo_holds_no_per_module_container():
    model = Stack(4)
    made = _copy(model)
    for module in model.modules():
        assert id(module) in made.copies  # names_on finds every module's copy
        assert id(vars(module)["_parameters"]) not in made.copies


def test_a_copied_modules_attribute_dictionary_is_no_larger_than_the_originals():
    # CPython keeps an instance's __dict__ as a split table (values only, keys shared by the
    # class's instances) when its attributes are set in the class's order, as torch's __init__
    # sets them; a dict filled by one update() is a combined table, about twice the size
    model = Stack(4)
    copied = _copy(model).model
    for original, made in zip(model.modules(), copied.modules()):
        assert sys.getsizeof(vars(made)) <= sys.getsizeof(vars(original)), type(original).__name__


def test_copies_of_a_shared_container_are_plain_and_their_own():
    copied = _copy(Stack(4)).model
    shared = vars(copied.blocks[0].act)["_buffers"]
    for made in (copy.copy(shared), copy.deepcopy(shared)):
        assert type(made) is dict and made is not shared


class RegistersInForward(Stack):
    """Each block's ReLU (no buffer) gets a non-persistent buffer ``scale`` (D ones) on its first
    call and the root multiplies by it: B * D multiplications per block more (a mul is one flop,
    no MAC). MACs: 2 * D * H per row per block, as Stack."""

    def forward(self, x):
        for block in self.blocks:
            if "scale" not in block.act._buffers:
                block.act.register_buffer("scale", torch.ones(D), persistent=False)
            x = block(x) * block.act.scale
        return x


class AddsAChild(Stack):
    """A child added to a ReLU (no children) in forward: nn.Identity, no cost; MACs as Stack."""

    def forward(self, x):
        for block in self.blocks:
            if "extra" not in block.act._modules:
                block.act.add_module("extra", nn.Identity())
            x = block.act.extra(block(x))
        return x


class AddsAParameter(Stack):
    """A parameter given to a ReLU (none before) in forward, added to x: B * D additions per block
    (one flop each, no MAC); MACs as Stack."""

    def forward(self, x):
        for block in self.blocks:
            if "bias" not in block.act._parameters:
                block.act.register_parameter("bias", nn.Parameter(torch.zeros(D)))
            x = block(x) + block.act.bias
        return x


@pytest.mark.parametrize("kind", [RegistersInForward, AddsAChild, AddsAParameter])
@pytest.mark.parametrize("train", [False, True])
def test_a_forward_that_fills_an_empty_container_counts_exactly_and_leaves_the_model(monkeypatch, kind, train):
    torch.manual_seed(0)
    model = kind(n=4).train(train)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randn(B, D)
    found = {}
    for reuse in ("1", "0"):
        monkeypatch.setenv("FLOPCOUNT_REUSE", reuse)
        found[reuse] = count_flops(model, (x,), tracer="auto")
    # four blocks of 2 * D * H MACs per row, B rows (hand-derived: tests/_toy_stack.py)
    assert found["1"].macs == found["0"].macs == 4 * 2 * D * H * B
    assert found["1"].to_dict() == found["0"].to_dict()  # every row, with reuse on and off
    for block in model.blocks:  # the user's model is left as found: nothing registered on a ReLU
        act = block.act
        assert not act._buffers and not act._parameters and not act._modules
        assert not act._non_persistent_buffers_set
    assert model.training is train
    assert model.state_dict().keys() == before.keys()
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
