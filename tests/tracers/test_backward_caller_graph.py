"""``backward=True`` on a model whose input the caller computed with grad (a head given a
backbone's features, a loss module given ``x.log_softmax(-1)``): the model's backward ends at
that input. The leaves walk added for leaves made in the forward (branch wild3) went on
through the input's ``grad_fn`` into the caller's graph, so ``tracer="dispatch"`` (real
tensors; the default tracer's fake copies are leaves) also counted the backbone's backward:
a Linear(64, 4) head on a Linear(64, 64) backbone's features, 78,368 FLOPs for the head's
12,320, and the caller's graph was freed (its own ``backward()`` then failed). Oracle: FlopCounterMode live on the head alone, its input a leaf copy of the features."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_same_state, snapshot
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from flopcount import count_flops


def _head_oracle(head: nn.Module, feats: torch.Tensor) -> int:
    x = feats.detach().clone().requires_grad_()
    with FlopCounterMode(display=False) as counter:
        head(x).sum().backward()
    head.zero_grad(set_to_none=True)
    return counter.get_total_flops()


@pytest.mark.parametrize("tracer", ["auto", "dispatch"])
def test_a_head_on_a_backbones_features(tracer: str) -> None:
    torch.manual_seed(0)
    backbone, head = nn.Linear(64, 64), nn.Linear(64, 4)
    feats = backbone(torch.randn(8, 64))  # not a leaf: the caller's graph is behind it
    before, before_backbone = snapshot(head), snapshot(backbone)
    r = count_flops(head, (feats,), tracer=tracer, backward=True)
    # forward, weight gradient and input gradient: 3 x 8 x 64 x 4 MACs
    assert 2 * r.macs == _head_oracle(head, feats) == 2 * 3 * 8 * 64 * 4
    assert backbone.weight.grad is None
    assert_same_state(head, before)
    assert_same_state(backbone, before_backbone)
    # the caller's graph is left as found: its own backward still runs (it was freed by the count)
    feats.sum().backward()
    assert backbone.weight.grad is not None


@pytest.mark.parametrize("tracer", ["auto", "dispatch"])
def test_a_loss_module_on_a_computed_input(tracer: str) -> None:
    logits = torch.randn(6, 10, requires_grad=True)
    loss = nn.KLDivLoss(reduction="batchmean")
    r = count_flops(loss, (logits.log_softmax(-1), torch.rand(6, 10)), tracer=tracer, backward=True)
    # the caller's log_softmax and its backward are not the loss module's
    assert "aten::_log_softmax_backward_data" not in r.by_operator("flops")
    assert "aten::log_softmax" not in r.by_operator("flops")


class CheckpointedHead(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(64, 16), nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.utils.checkpoint.checkpoint(self.a, x, use_reentrant=True))


@pytest.mark.parametrize("tracer", ["auto", "dispatch"])
def test_a_reentrant_checkpoint_on_a_backbones_features(tracer: str) -> None:
    """A reentrant checkpoint's backward refuses ``autograd.grad`` and ``inputs=``: its plain
    ``backward()`` ran on into the caller's graph behind the input under ``tracer="dispatch"``
    (134,816 FLOPs for the head's 68,768: the backbone's backward, 65,536 + 512), wrote the
    backbone's ``.grad`` and freed the caller's graph. The input is now cut from the caller's
    graph before the forward (a copy that starts a graph of its own)."""
    torch.manual_seed(0)
    backbone, head = nn.Linear(64, 64), CheckpointedHead()
    feats = backbone(torch.randn(8, 64))
    before, before_backbone = snapshot(head), snapshot(backbone)
    r = count_flops(head, (feats,), tracer=tracer, backward=True)
    # a: forward, recompute, weight and input gradients (4 x 8 x 64 x 16 MACs); b: forward and
    # both gradients (3 x 8 x 16 x 4)
    assert 2 * r.macs == _head_oracle(head, feats) == 2 * (4 * 8 * 64 * 16 + 3 * 8 * 16 * 4)
    # + the bias gradients, a sum over the batch of each grad_output (FlopCounterMode counts no sum)
    assert r.flops == 2 * r.macs + 8 * 16 + 8 * 4
    assert backbone.weight.grad is None
    assert_same_state(head, before)
    assert_same_state(backbone, before_backbone)
    feats.sum().backward()  # the caller's graph is intact
    assert backbone.weight.grad is not None


class ScalesItsInput(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.mul_(2)
        return self.linear(x)


def test_an_in_place_op_on_a_computed_input_leaves_the_callers_graph() -> None:
    """An in-place op of the forward on a non-leaf input rebased the caller's tensor onto the
    model's graph (its ``grad_fn`` became MulBackward0; its values were put back): it now runs on
    the cut copy, and the count is main's: 3 x 8 x 4 MACs x 3 (forward, both gradients), the
    in-place multiply (3 x 8), the bias gradient's sum (3 x 4); the input's gradient is taken at
    the tensor the Linear read (the in-place op rebased it), so the multiply has no backward."""
    backbone = nn.Linear(8, 8)
    feats = backbone(torch.randn(3, 8))
    values, grad_fn = feats.detach().clone(), feats.grad_fn
    r = count_flops(ScalesItsInput(), (feats,), tracer="dispatch", backward=True)
    assert r.flops == 2 * 3 * 8 * 4 * 3 + 3 * 8 + 3 * 4
    assert feats.grad_fn is grad_fn
    assert torch.equal(feats.detach(), values)
    feats.sum().backward()
    assert backbone.weight.grad is not None
