"""The plan sizes the steady-state step, the one every step after the first repeats.

Oracle: torch's MemTracker, run live on a real single-process training loop of the same model
(``loss = loss_fn(model(x)); loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)``):
its second and third steps peak the same, and a one-rank plan must equal that peak to the byte.
Before: the plan sized the first step (no optimizer state during its forward and backward) and
kept the model's outputs through the backward, which no such loop does."""

from __future__ import annotations

import warnings

import pytest
import torch
from _plan_gloo import tiny_encoder

import flopcount
from flopcount.planning.step import make_optimizer
from flopcount.step.loss import default_loss


def _real_peaks(x: torch.Tensor, steps: int = 3) -> list:
    from torch.distributed._tools.mem_tracker import MemTracker

    torch.manual_seed(0)
    model = tiny_encoder().train()
    opt = make_optimizer("adamw", model)
    peaks = []
    for _ in range(steps):
        tracker = MemTracker()
        tracker.track_external(model, opt, x)
        with tracker:
            default_loss(model(x)).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        peaks.append(sum(int(s["Total"]) for s in tracker.get_tracker_snapshot("peak").values()))
    return peaks


@pytest.mark.parametrize("batch", [2, 64])  # the optimizer step peaks; the backward peaks
def test_a_one_rank_plan_is_the_real_steady_state_step(batch: int) -> None:
    x = torch.randn(batch, 16, 64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        first, second, third = _real_peaks(x)
        planned = flopcount.plan(tiny_encoder, (x,), on=None).peak_bytes
        estimated = flopcount.estimate_memory(tiny_encoder(), x, backward=True, optimizer="adamw").peak_bytes
    assert second == third  # the steady state
    assert planned == second == estimated
    if batch == 64:
        assert first < second  # the first step's peak is the lower one: planning it under-sizes
