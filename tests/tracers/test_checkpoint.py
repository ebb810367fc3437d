"""Activation checkpointing under ``backward=True`` (issue #20, items 7 and 8).

``torch.utils.checkpoint(use_reentrant=True)`` refuses ``autograd.grad``: it is counted
with a plain backward, its ``.grad`` writes undone. Oracles: FlopCounterMode with a plain
``.backward()`` (contraction FLOPs, measured live) and the hand-derived MACs of each
phase and module. The recomputed forward is booked in the backward phase under the
forward's operator names (one vocabulary). Under ``tracer="jit"`` a reentrant checkpoint
(or any custom Function that calls a module) fails with one sentence naming the cause.
"""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import assert_same_state, snapshot
from torch import nn
from torch.utils.checkpoint import checkpoint
from torch.utils.flop_counter import FlopCounterMode

from flopcount import TraceError, count_flops

B = 3
STEM, FC1, FC2, HEAD = B * 8 * 8, B * 8 * 16, B * 16 * 8, B * 8 * 4  # each linear's forward MACs


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.act, self.drop, self.fc2 = nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.25), nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.drop(self.act(self.fc1(x))))


class Net(nn.Module):
    def __init__(self, mode: str) -> None:
        super().__init__()
        self.mode = mode  # "reentrant", "non_reentrant" or "plain" (no checkpoint)
        self.stem, self.block, self.head = nn.Linear(8, 8), Block(), nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        if self.mode == "plain":
            h = self.block(h)
        else:
            h = checkpoint(self.block, h, use_reentrant=self.mode == "reentrant")
        return self.head(h)


def fcm_flops(model: nn.Module, x: torch.Tensor) -> int:
    """FlopCounterMode's count of forward + a plain ``.backward()`` (on a copy)."""
    model = copy.deepcopy(model)
    counter = FlopCounterMode(display=False)
    with counter:
        model(x.clone()).sum().backward()
    return int(counter.get_total_flops())


# The recomputed forward: a reentrant checkpoint reruns the whole block; the
# non-reentrant one stops once the saved activations it needs exist (fc2's output is not
# one of them).
RECOMPUTE = {"reentrant": FC1 + FC2, "non_reentrant": FC1}


@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("tracer", ["auto", "dispatch"])
@pytest.mark.parametrize("mode", ["reentrant", "non_reentrant"])
def test_checkpointed_backward_is_counted_with_the_recompute_in_backward(mode, tracer, train):
    torch.manual_seed(0)
    model = Net(mode).train(train)
    x = torch.randn(B, 8)
    before = snapshot(model)
    r = count_flops(model, x, backward=True, tracer=tracer)
    assert_same_state(model, before)
    forward = STEM + FC1 + FC2 + HEAD
    # grad_input + grad_weight of every linear, but no grad_input for the stem (x needs none)
    backward = 2 * (FC1 + FC2 + HEAD) + STEM
    recompute = RECOMPUTE[mode]
    assert r.by_phase("macs") == {"forward": forward, "backward": backward + recompute}
    assert 2 * r.macs == fcm_flops(model, x)  # contraction FLOPs, live peer
    assert {k: v for k, v in r.by_module("macs").items() if v} == {
        "": forward + backward + recompute,
        "stem": 2 * STEM,
        "block": 3 * (FC1 + FC2) + recompute,
        "block.fc1": 3 * FC1 + FC1,  # recomputed in both modes
        "block.fc2": 3 * FC2 + recompute - FC1,
        "head": 3 * HEAD,
    }
    assert r.complete


@pytest.mark.parametrize("tracer", ["auto", "dispatch"])
@pytest.mark.parametrize("mode", ["reentrant", "non_reentrant"])
def test_recomputed_forward_keeps_the_forward_operator_names(mode, tracer):
    """One vocabulary: the recompute of ``nn.Linear`` is ``aten::linear``, as in forward
    (not the ``aten::addmm`` it runs as), and the checkpointed model lists exactly the
    operators of the same model without checkpointing."""
    torch.manual_seed(0)
    x = torch.randn(B, 8)
    checkpointed = count_flops(Net(mode).eval(), x, backward=True, tracer=tracer)
    plain = count_flops(Net("plain").eval(), x, backward=True, tracer=tracer)
    assert set(checkpointed.by_operator()) == set(plain.by_operator())
    assert "aten::addmm" not in checkpointed.by_operator()
    linear = checkpointed.by_operator("macs")["aten::linear"]
    assert linear == STEM + FC1 + FC2 + HEAD + RECOMPUTE[mode]
    assert plain.by_operator("macs")["aten::linear"] == STEM + FC1 + FC2 + HEAD


def test_reentrant_checkpoint_leaves_grads_hooks_and_inputs_as_found():
    """The plain backward a reentrant checkpoint needs writes ``.grad`` and would fire
    post-accumulate-grad hooks (an optimizer stepping in backward): neither is seen."""
    torch.manual_seed(0)
    model = Net("reentrant")
    x = torch.randn(B, 8, requires_grad=True)
    old = torch.full_like(model.block.fc1.weight, 7.0)
    model.block.fc1.weight.grad = old
    fired = []
    model.head.weight.register_post_accumulate_grad_hook(lambda p: fired.append(p))
    before = snapshot(model)
    r = count_flops(model, x, backward=True, tracer="dispatch")
    assert_same_state(model, before)
    assert model.block.fc1.weight.grad is old and x.grad is None and fired == []
    # x now requires grad: the stem's grad_input is computed too
    assert r.by_phase("macs")["backward"] == 2 * (STEM + FC1 + FC2 + HEAD) + FC1 + FC2
    assert 2 * r.macs == fcm_flops(model, x)


def test_jit_names_the_reentrant_checkpoint_and_the_dispatch_tracer():
    x = torch.randn(B, 8)
    with pytest.raises(TraceError, match=r"use_reentrant=True.*CheckpointFunction.*tracer='dispatch'"):
        count_flops(Net("reentrant").eval(), x, tracer="jit")
    # the non-reentrant checkpoint is plain forward code under jit: counted
    assert count_flops(Net("non_reentrant").eval(), x, tracer="jit").macs == STEM + FC1 + FC2 + HEAD


class CallsModule(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, module):  # type: ignore[override]
        return module(x)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        return grad, None


class FunctionNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return CallsModule.apply(x, self.inner)


def test_jit_names_a_custom_function_that_calls_a_module():
    x = torch.randn(B, 8)
    with pytest.raises(TraceError, match=r"autograd.Function 'CallsModule'.*calls a module.*tracer='dispatch'"):
        count_flops(FunctionNet(), x, tracer="jit")
    assert count_flops(FunctionNet(), x, tracer="auto").macs == STEM  # what the Function ran


@pytest.mark.parametrize("reentrant", [True, False], ids=["reentrant", "non_reentrant"])
def test_transformers_gradient_checkpointing_matches_flop_counter_mode(reentrant):
    """A real model's own switch: GPT-2's ``gradient_checkpointing_enable``, batch 2."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=100, attn_implementation="eager")
    plain = transformers.GPT2LMHeadModel(config).train()
    model = copy.deepcopy(plain)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    ids = torch.randint(0, 100, (2, 16))
    counter = FlopCounterMode(display=False)
    with counter:
        copy.deepcopy(model)(ids).logits.sum().backward()
    before = snapshot(model)
    r = count_flops(model, ids, backward=True)
    assert_same_state(model, before)
    assert 2 * r.macs == counter.get_total_flops()
    # the model builds its masks differently with checkpointing on; its contractions do not change
    contractions = {op for op, n in r.by_operator("macs").items() if n}
    plain_result = count_flops(plain, ids, backward=True)
    assert contractions == {op for op, n in plain_result.by_operator("macs").items() if n}
    assert r.by_phase("macs")["forward"] == plain_result.by_phase("macs")["forward"]
    assert r.complete


@pytest.mark.parametrize("mode", ["reentrant", "non_reentrant"])
def test_checkpointing_does_not_change_the_optimizer_step(mode):
    """Every parameter gets its gradient through the checkpointed region too (the plain
    backward a reentrant checkpoint needs included), so the step updates all of them."""
    x = torch.randn(B, 8)
    checkpointed = count_flops(Net(mode), x, backward=True, optimizer="adam").by_phase()
    plain = count_flops(Net("plain"), x, backward=True, optimizer="adam").by_phase()
    assert checkpointed["optimizer"] == plain["optimizer"] > 0
    assert checkpointed["forward"] == plain["forward"]
