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
from _live_oracles import loop_peaks
from _plan_gloo import tiny_encoder

import flopcount


def _real_peaks(x: torch.Tensor, steps: int = 3) -> list:
    torch.manual_seed(0)
    return loop_peaks(tiny_encoder().train(), x, steps)[0]


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
