"""torch.cond is counted (#19): the branch taken on real data; both branches, flagged as an
upper bound, when the predicate has no value (fake/meta tensors). It used to be a TraceError."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from flopcount import count_flops


class Gate(nn.Module):
    def __init__(self):
        super().__init__()
        self.small = nn.Linear(8, 8)
        self.large = nn.Linear(8, 16)

    def forward(self, x):
        return torch.cond(x.sum() > 0, lambda t: self.small(t).sum(-1), lambda t: self.large(t).sum(-1), (x,))


@pytest.mark.parametrize("batch", [2, 5])
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_real_tensors_count_the_branch_taken(batch, sign):
    model = Gate().eval()
    x = sign * torch.rand(batch, 3, 8)   # 3-D input: positive sum takes `small`, negative `large`
    r = count_flops(model, x, tracer="dispatch")
    out = 8 if sign > 0 else 16
    assert r.macs == batch * 3 * 8 * out
    assert r.module_totals("small" if sign > 0 else "large").macs == batch * 3 * 8 * out
    assert r.module_totals("large" if sign > 0 else "small").macs == 0
    assert r.complete


@pytest.mark.parametrize("batch", [1, 4])
def test_fake_tensors_count_both_branches_as_a_stated_bound(batch):
    model = Gate().train()
    x = torch.randn(batch, 8)
    r = count_flops(model, x)  # auto: fake tensors
    assert r.macs == batch * 8 * 8 + batch * 8 * 16
    assert r.by_module("macs") == {"": batch * 8 * 24, "small": batch * 64, "large": batch * 128}
    assert not r.complete
    assert any("both branches" in reason and "upper bound" in reason for reason in r.incomplete_reasons())
    assert model.training


@pytest.mark.parametrize("tracer", ["auto", "dispatch"])
def test_backward_through_cond_is_refused_plainly(tracer):
    from flopcount import UsageError

    with pytest.raises(UsageError, match="torch.cond"):
        count_flops(Gate(), torch.rand(3, 8), tracer=tracer, backward=True)
