"""Diagnostics are typed records (#19): kind, op, modules, calls, text — the reports and the
CLI read these, never parse sentences back."""

from __future__ import annotations

import torch
from torch import nn

from flopcount import Cost, Diagnostic, count_flops


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 4)
        self.inner = nn.Sequential(nn.Linear(4, 4))

    def forward(self, x):
        y = torch.special.bessel_j0(self.fc(x))      # no handler: unsupported, in the root module
        y = self.inner(y)
        # a predicate with no value on fake tensors: both branches, a gap (an upper bound)
        y = torch.cond(y.sum() > 0, lambda t: t * 2, lambda t: t * 3, (y,))
        return torch.cumsum(y, dim=-1)


def test_every_kind_is_a_record_with_its_place():
    def estimated_cumsum(call):
        return Cost.from_flops(call.out().numel).with_note("depends on the moon")

    r = count_flops(_Net().eval(), torch.randn(3, 6), handlers={"aten::cumsum": estimated_cumsum})
    kinds = {d.kind for d in r.diagnostics()}
    assert kinds == {"unsupported", "gap", "estimate"}
    unsupported = [d for d in r.diagnostics() if d.kind == "unsupported"]
    assert unsupported == [Diagnostic("unsupported", "aten::special_bessel_j0 ran 1x without a handler",
                                      "aten::special_bessel_j0", ("",), 1)]
    estimate = next(d for d in r.diagnostics() if d.kind == "estimate")
    assert (estimate.op, estimate.count) == ("aten::cumsum", 1) and "depends on the moon" in estimate.text
    # the texts are the ones the old API gives
    incomplete = tuple(d.text for d in r.diagnostics() if d.makes_incomplete)
    assert incomplete == r.incomplete_reasons()
    assert {d.text for d in r.diagnostics() if not d.makes_incomplete} <= set(r.warnings)
    assert not r.complete


def test_a_clean_count_has_no_diagnostics():
    r = count_flops(nn.Linear(3, 2), torch.randn(4, 3))
    assert r.diagnostics() == () and r.complete
