"""Two composites jit records whole and prices by its own formula, where the dispatch tracer
sees the aten ops that run (wild4). ``torch.msort(x)`` is ``sort(x, dim=0)``: its schema has no
``dim``, and the handler sorted along the last dim. ``F.ctc_loss`` with list lengths and
``reduction="mean"``: torch makes the target lengths a float tensor and clamps it to >= 1
before the divide (B FLOPs the jit formula left out; a tensor of lengths is clamped as
integers, 0). Oracle: the hand count of docs/conventions.md (sort N x ceil(log2 L); ctc 13
FLOPs per lattice cell + the reduction's ops), the same under every tracer."""

from __future__ import annotations

from math import ceil, log2

import pytest
import torch
import torch.nn.functional as F
from conftest import Fn

from flopcount import count_flops

TRACERS = ["auto", "dispatch", "jit"]


@pytest.mark.parametrize("tracer", TRACERS)
@pytest.mark.parametrize("shape", [(4, 6, 10), (9, 3), (5,)])
def test_msort_sorts_the_first_dim(tracer: str, shape: tuple) -> None:
    x = torch.randn(*shape)
    r = count_flops(Fn(torch.msort), (x,), tracer=tracer)
    assert r.flops == x.numel() * ceil(log2(shape[0]))


@pytest.mark.parametrize("tracer", TRACERS)
def test_ctc_mean_with_list_lengths(tracer: str) -> None:
    time, batch, classes = 10, 2, 5
    log_probs = torch.randn(time, batch, classes).log_softmax(-1)
    targets = torch.tensor([[1, 2, 3], [1, 2, 0]])
    model = Fn(lambda lp, t: F.ctc_loss(lp, t, [10, 10], [3, 2]))
    r = count_flops(model, (log_probs, targets), tracer=tracer)
    cells = 10 * (2 * 3 + 1) + 10 * (2 * 2 + 1)
    # lattice, then clamp_min and divide (B each) and the mean (B + 1)
    assert r.flops == 13 * cells + 3 * batch + 1
