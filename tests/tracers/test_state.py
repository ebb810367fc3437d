"""The model is the user's data: count_flops leaves it exactly as found, even in train
mode with BatchNorm and dropout, and when the forward raises."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_same_state, snapshot
from torch import nn

from flopcount import TraceError, count_flops


class Net(nn.Module):
    def __init__(self, fail: bool = False):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.drop = nn.Dropout(0.5)
        self.head = nn.Linear(8, 2)
        self.fail = fail

    def forward(self, x):
        x = self.drop(torch.relu(self.bn(self.conv(x))))
        if self.fail:
            raise RuntimeError("boom")
        return self.head(x.mean((2, 3)))


def _prepared(model: nn.Module) -> nn.Module:
    model.train()
    model.head.eval()  # mixed flags must survive
    model.conv.weight.requires_grad_(False)
    model.head.weight.grad = torch.ones_like(model.head.weight)
    model.head.register_forward_hook(lambda m, i, o: None)
    model.bn.register_forward_pre_hook(lambda m, i: None)
    return model


def test_train_mode_batchnorm_stats_untouched():
    model = _prepared(Net())
    before = snapshot(model)
    x = torch.randn(4, 3, 8, 8)
    rng = torch.get_rng_state()
    count_flops(model, x)
    assert_same_state(model, before)
    assert torch.equal(torch.get_rng_state(), rng), "dropout's RNG draws leaked into the process"
    assert model.bn.num_batches_tracked.item() == 0


def test_state_restored_when_forward_raises():
    model = _prepared(Net(fail=True))
    before = snapshot(model)
    grad_mode = torch.is_grad_enabled()
    with pytest.raises(TraceError):
        count_flops(model, torch.randn(4, 3, 8, 8))
    assert_same_state(model, before)
    assert torch.is_grad_enabled() == grad_mode


def test_a_peer_would_have_changed_the_stats():
    """The oracle for the test above: a plain train-mode forward does update BN stats."""
    model = Net().train()
    before = model.bn.running_mean.clone()
    model(torch.randn(4, 3, 8, 8))
    assert not torch.equal(before, model.bn.running_mean)


def test_no_grad_mode_and_inference_mode_callers():
    model = Net().eval()
    before = snapshot(model)
    with torch.no_grad():
        count_flops(model, torch.randn(1, 3, 8, 8))
    with torch.inference_mode():
        count_flops(model, torch.randn(1, 3, 8, 8))
    assert_same_state(model, before)


def test_train_mode_counts_on_fakes_under_auto():
    """BatchNorm's batch-size check in train mode reads a shape, not a value: auto stays
    on the fake copies (no real run, no warning)."""
    from examples.resnet import resnet18

    r = count_flops(resnet18().train(), torch.randn(2, 3, 32, 32))
    assert r.tracer == "dispatch" and r.warnings == ()
