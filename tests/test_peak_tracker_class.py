"""The step's MemTracker subclass (flopcount.step.runner.peak_tracker) is made once per torch base
class, not once per call: trackers made from one class must share no state (a later estimate of
the same model gives the same figures whatever ran between), and a step that fails part-way (in
a checkpoint's recompute, inside the backward) leaves neither the model nor the next estimate
changed. Oracle: the first estimate of the same model and inputs, and the model's own state
read before the failing call."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from flopcount.errors import TraceError
from flopcount.memory.estimate import estimate_memory
from flopcount.step import runner

pytest.importorskip("torch.distributed._tools.mem_tracker")

X = torch.randn(2, 8, 32, generator=torch.Generator().manual_seed(0))


class Checkpointed(nn.Module):
    """Two blocks under non-reentrant activation checkpointing: their forward runs again in the backward."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(32, 96), nn.GELU(), nn.Linear(96, 32)) for _ in range(2))
        self.head = nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = x + checkpoint(block, x, use_reentrant=False)
        return self.head(x)


def test_one_tracker_class_per_base_and_trackers_share_no_state() -> None:
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed._tools.mem_tracker import MemTracker

    assert runner.peak_tracker(MemTracker) is runner.peak_tracker(MemTracker)
    assert runner.peak_tracker(MemTracker) is not runner.peak_tracker(FSDPMemTracker)
    model = Checkpointed()
    first = estimate_memory(model, (X,), backward=True, optimizer="adam")
    estimate_memory(nn.Linear(32, 4096), (X,), backward=True)  # a bigger step between the two
    assert estimate_memory(model, (X,), backward=True, optimizer="adam") == first


class RaisesInBackward(nn.Module):
    """A checkpointed block whose recompute (in the backward) raises: the step fails mid-recompute."""

    def __init__(self) -> None:
        super().__init__()
        self.block = nn.Linear(32, 32)
        self.calls = 0

    def _run(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls > 1:
            raise RuntimeError("recompute refused")
        return self.block(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return checkpoint(self._run, x, use_reentrant=False)


def test_a_step_that_fails_in_a_recompute_leaves_the_next_estimate_and_the_model_as_they_were() -> None:
    model = Checkpointed()
    first = estimate_memory(model, (X,), backward=True, optimizer="sgd")
    bad = RaisesInBackward()
    state = {k: v.clone() for k, v in bad.state_dict().items()}
    with pytest.raises(TraceError, match="recompute refused"):
        estimate_memory(bad, (X,), backward=True)
    assert all(torch.equal(v, state[k]) for k, v in bad.state_dict().items())
    assert all(p.grad is None for p in bad.parameters()) and bad.training and bad.calls == 0
    assert estimate_memory(model, (X,), backward=True, optimizer="sgd") == first
