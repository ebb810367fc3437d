"""Selective activation checkpointing (torch.utils.checkpoint's ``context_fn=
create_selective_checkpoint_contexts(policy)``, torchtitan's op-level SAC) under ``backward=True``.

In the recompute, the ops the policy saves are served from SAC's cache by a dispatch mode above
flopcount's: they do not run, and a composite (``aten::linear``) whose contraction was served is
not booked from its shapes; the ops that did reach flopcount are booked instead. Oracles:
FlopCounterMode run live (it sits below SAC's mode as well) and hand-derived MACs per phase.
"""

from __future__ import annotations

import copy
import functools

import pytest
import torch
from conftest import assert_same_state, snapshot
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts
from torch.utils.flop_counter import FlopCounterMode

from flopcount import count_flops

aten = torch.ops.aten
B = 3
FC1, FC2, HEAD = B * 8 * 16, B * 16 * 8, B * 8 * 4  # each linear's forward MACs
FORWARD = FC1 + FC2 + HEAD
# grad_input and grad_weight of every linear but fc1's grad_input (x needs no gradient)
BACKWARD = 2 * (FC2 + HEAD) + FC1


def saving(*ops):
    """A SAC context_fn saving ``ops`` and recomputing every other op (MUST_RECOMPUTE)."""

    def policy(ctx, op, *args, **kwargs):
        return CheckpointPolicy.MUST_SAVE if op in ops else CheckpointPolicy.MUST_RECOMPUTE

    return functools.partial(create_selective_checkpoint_contexts, policy)


class Block(nn.Module):
    def __init__(self, bias: bool = True) -> None:
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(8, 16, bias=bias), nn.ReLU(), nn.Linear(16, 8, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class Net(nn.Module):
    """Block (checkpointed under SAC) + head; ``nested``: fc1 checkpointed once more inside."""

    def __init__(self, context_fn, bias: bool = True, nested: bool = False) -> None:
        super().__init__()
        self.context_fn, self.nested = context_fn, nested
        self.block, self.head = Block(bias), nn.Linear(8, 4, bias=bias)

    def run_block(self, x: torch.Tensor) -> torch.Tensor:
        block = self.block
        if self.nested:
            h = checkpoint(block.fc1, x, use_reentrant=False, context_fn=self.context_fn)
        else:
            h = block.fc1(x)
        return block.fc2(block.act(h))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(checkpoint(self.run_block, x, use_reentrant=False, context_fn=self.context_fn))


def fcm_flops(model: nn.Module, x: torch.Tensor) -> int:
    """FlopCounterMode's count of forward + a plain ``.backward()`` of the sum (on copies)."""
    model = copy.deepcopy(model)
    counter = FlopCounterMode(display=False)
    with counter:
        model(x.clone()).sum().backward()
    return int(counter.get_total_flops())


def counted(model: nn.Module, x: torch.Tensor, tracer: str):
    before = snapshot(model)
    r = count_flops(model, x, backward=True, tracer=tracer)
    assert_same_state(model, before)
    return r


TRACERS = ["auto", "dispatch"]
# the non-reentrant recompute stops once the saved activations it needs exist: only fc1 reruns
RECOMPUTE = {"mm_addmm": 0, "relu": FC1, "nothing": FC1}
POLICIES = {"mm_addmm": (aten.mm.default, aten.addmm.default), "relu": (aten.relu.default,), "nothing": ()}


@pytest.mark.parametrize("tracer", TRACERS)
@pytest.mark.parametrize("saved", list(POLICIES))
def test_recompute_counts_only_the_ops_sac_did_not_save(saved, tracer):
    """Saving mm/addmm: the recomputed fc1 is served from the cache (5,184 FLOPs before the fix
    against FlopCounterMode's 4,416); saving only the ReLU or nothing: fc1 reruns, as a plain
    checkpoint's recompute, booked as ``aten::linear``."""
    torch.manual_seed(0)
    model, x = Net(saving(*POLICIES[saved])), torch.randn(B, 8)
    r = counted(model, x, tracer)
    recompute = RECOMPUTE[saved]
    assert r.by_phase("macs") == {"forward": FORWARD, "backward": BACKWARD + recompute}
    assert 2 * r.macs == fcm_flops(model, x) == 2 * (FORWARD + BACKWARD + recompute)
    assert r.by_operator("macs")["aten::linear"] == FORWARD + recompute
    assert r.by_module("macs")["block.fc1"] == 2 * FC1 + recompute
    assert r.complete


@pytest.mark.parametrize("tracer", TRACERS)
def test_nested_selective_checkpoints(tracer):
    """fc1 checkpointed under SAC inside the SAC-checkpointed block, both saving mm/addmm:
    nothing is recomputed; saving nothing, fc1 reruns once per enclosing recompute."""
    torch.manual_seed(0)
    x = torch.randn(B, 8)
    saved = counted(Net(saving(aten.mm.default, aten.addmm.default), nested=True), x, tracer)
    assert saved.by_phase("macs") == {"forward": FORWARD, "backward": BACKWARD}
    assert 2 * saved.macs == fcm_flops(Net(saving(aten.mm.default, aten.addmm.default), nested=True), x)
    model = Net(saving(), nested=True)
    recomputed = counted(model, x, tracer)
    assert 2 * recomputed.macs == fcm_flops(model, x)
    assert recomputed.by_phase("macs")["forward"] == FORWARD


@pytest.mark.parametrize("tracer", TRACERS)
def test_linear_without_bias_on_3d_input_saving_mm(tracer):
    """A 3-D input without bias runs ``linear`` as view, ``mm``, view: with ``mm`` saved only the
    views reach flopcount in the recompute (no MACs); with nothing saved, the whole linear."""
    torch.manual_seed(0)
    x = torch.randn(2, B, 8)  # 6 rows: every MAC count doubles
    model = Net(saving(aten.mm.default), bias=False)
    r = counted(model, x, tracer)
    assert r.by_phase("macs") == {"forward": 2 * FORWARD, "backward": 2 * BACKWARD}
    assert 2 * r.macs == fcm_flops(model, x)
    model = Net(saving(), bias=False)
    r = counted(model, x, tracer)
    assert r.by_phase("macs") == {"forward": 2 * FORWARD, "backward": 2 * (BACKWARD + FC1)}
    assert 2 * r.macs == fcm_flops(model, x)


class ConvNet(nn.Module):
    def __init__(self, context_fn) -> None:
        super().__init__()
        self.context_fn = context_fn
        self.conv1, self.conv2 = nn.Conv2d(3, 4, 3, padding=1), nn.Conv2d(4, 2, 3, padding=1)

    def run(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv2(torch.relu(self.conv1(x)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return checkpoint(self.run, x, use_reentrant=False, context_fn=self.context_fn)


@pytest.mark.parametrize("tracer", TRACERS)
@pytest.mark.parametrize("saved", ["convolution", "nothing"])
def test_conv2d_under_sac(saved, tracer):
    torch.manual_seed(0)
    x = torch.randn(2, 3, 5, 5)
    model = ConvNet(saving(aten.convolution.default) if saved == "convolution" else saving())
    r = counted(model, x, tracer)
    conv1, conv2 = 2 * 25 * 4 * 3 * 9, 2 * 25 * 2 * 4 * 9  # output elements x (C_in x k x k)
    # conv1: grad_weight only (x needs none); conv2: grad_input and grad_weight
    backward = conv1 + 2 * conv2 + (0 if saved == "convolution" else conv1)
    assert r.by_phase("macs") == {"forward": conv1 + conv2, "backward": backward}
    assert 2 * r.macs == fcm_flops(model, x)


def test_plan_books_the_recompute_sac_runs():
    """flopcount.plan's step recorder (the same interceptor): saving nothing, the backward runs
    fc1's addmm once more (2·FC1 FLOPs) than saving mm/addmm."""
    import flopcount

    torch.manual_seed(0)
    x = torch.randn(B, 8)
    runs = {
        saved: flopcount.plan(lambda saved=saved: Net(saving(*POLICIES[saved])), (x,), optimizer=None, on="h100").flops
        for saved in ("mm_addmm", "nothing")
    }
    assert runs["mm_addmm"]["forward"] == runs["nothing"]["forward"]
    assert runs["nothing"]["backward"] - runs["mm_addmm"]["backward"] == 2 * FC1


class Attention(nn.Module):
    """One attention layer (qkv, causal SDPA, out) checkpointed under SAC, as torchtitan's
    policy saves it: the matmuls and the SDPA kernel."""

    def __init__(self, context_fn) -> None:
        super().__init__()
        self.context_fn = context_fn
        self.qkv, self.out = nn.Linear(16, 48), nn.Linear(16, 16)

    def body(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = (t.transpose(1, 2) for t in self.qkv(x).view(2, 5, 3, 2, 8).unbind(2))
        attended = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(attended.transpose(1, 2).reshape(2, 5, 16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return checkpoint(self.body, x, use_reentrant=False, context_fn=self.context_fn)


@pytest.mark.parametrize("tracer", TRACERS)
def test_attention_saving_matmuls_and_sdpa_recomputes_nothing(tracer):
    """Batch 2, 5 tokens, 2 heads of 8: the recompute's qkv/out linears and SDPA are all served
    from SAC's cache, so each composite is booked once (its forward). FlopCounterMode does not
    price the CPU flash kernel; its matmuls (forward and backward) agree with flopcount's."""
    torch.manual_seed(0)
    sdpa = [aten._scaled_dot_product_flash_attention_for_cpu.default, aten._scaled_dot_product_efficient_attention.default]
    model, x = Attention(saving(aten.mm.default, aten.addmm.default, *sdpa)), torch.randn(2, 5, 16)
    r = counted(model, x, tracer)
    macs = r.by_operator("macs")
    assert macs["aten::linear"] == 10 * 16 * 48 + 10 * 16 * 16  # 10 rows through qkv and out, once
    assert macs["aten::scaled_dot_product_attention"] == 2 * (2 * 2 * 5 * 5 * 8)  # QK^T and PV, once
    assert 2 * (macs["aten::linear"] + macs["aten::mm"]) == fcm_flops(model, x)
