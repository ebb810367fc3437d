"""estimate_memory where a module is called with grad mode off and handed a tensor that requires
grad: a parameter's view made under ``no_grad`` (DBRX's experts take views of their weights so).
torch's ModTracker hooks such a tensor's gradient and raises "Expected gradient function to be
set"; estimate_memory's inference step failed with it. Oracles: MemTracker live on the same step
of a twin whose views are of the detached parameters (the same storages: the same bytes), and the
bytes derived by hand."""

from __future__ import annotations

import pytest
import torch
from test_memory import checked_estimate, truth_peak
from torch import nn

import flopcount

MemTracker = pytest.importorskip("torch.distributed._tools.mem_tracker").MemTracker


class _Product(nn.Module):
    def forward(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return x @ w


class _Rows(nn.Module):
    """Returns a view of its own parameter: the post-hook's case (``detach``: of its detached
    parameter, the oracle's model)."""

    def __init__(self, detach: bool) -> None:
        super().__init__()
        self.table = nn.Parameter(torch.randn(16, 16))
        self.detach = detach

    def forward(self) -> torch.Tensor:
        table = self.table.detach() if self.detach else self.table
        return table[:8]


class _ViewHandedOn(nn.Module):
    """``self.w.view(...)`` handed to a submodule, and a submodule that returns a view of its
    weight (``detach``: views of the detached parameters, the same storages: the oracle's model,
    on which torch's hooks see no tensor that requires grad)."""

    def __init__(self, detach: bool = False) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, 16))
        self.product = _Product()
        self.rows = _Rows(detach)
        self.detach = detach

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.w.detach() if self.detach else self.w
        y = self.product(x, w.view(8, 16))
        return y + self.rows()[0]  # a row of the view, broadcast


def _memtracker_peak_detached(model: nn.Module, x: torch.Tensor) -> int:
    """MemTracker's peak of the no_grad forward of the model's detaching twin."""
    twin = _ViewHandedOn(detach=True)
    twin.load_state_dict(model.state_dict())
    tracker = MemTracker()
    tracker.track_external(twin, x)
    with tracker, torch.no_grad():
        twin(x)
    (peak,) = tracker.get_tracker_snapshot("peak").values()
    return int(peak["Total"])


def test_torch_s_memtracker_alone_fails_on_this_model() -> None:
    # the premise: what the regression is about is torch's own behaviour on this model
    model, x = _ViewHandedOn(), torch.randn(4, 8)
    tracker = MemTracker()
    tracker.track_external(model, x)
    with pytest.raises(AssertionError, match="Expected gradient function to be set"):
        with tracker, torch.no_grad():
            model(x)


@pytest.mark.parametrize("batch", [4, 7])
def test_an_inference_step_handed_views_of_parameters_is_estimated(batch: int) -> None:
    model = _ViewHandedOn()
    x = torch.randn(batch, 8)
    result = checked_estimate(model, x)  # the parent raised TraceError: Expected gradient function to be set
    # by hand: x (batch x 8) + w (8 x 16) + table (16 x 16) + product's output (batch x 16) and,
    # while the sum is made, the output (batch x 16), float32. The rows' view and the slice own no storage.
    by_hand = 4 * (batch * 8 + 8 * 16 + 16 * 16 + batch * 16 + batch * 16)
    assert result.peak_bytes == by_hand == _memtracker_peak_detached(model, x)
    assert all(p.requires_grad for p in model.parameters())


def test_a_training_step_with_grad_on_is_unchanged() -> None:
    # grad mode on: the hooks see the tensors as before; MemTracker live runs on this step
    model, x = _ViewHandedOn(), torch.randn(4, 8)
    result = checked_estimate(model, x, backward=True)
    assert result.peak_bytes == truth_peak(model, (x,), True, None)


class _FrozenBranch(nn.Module):
    """A training forward with a ``no_grad`` region that hands a view of a trained weight on."""

    def __init__(self, detach: bool) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, 8))
        self.product = _Product()
        self.detach = detach

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            w = self.w.detach() if self.detach else self.w
            scale = self.product(x, w.t())  # a view of w made under no_grad
        return (x @ self.w) * scale


def test_a_no_grad_region_inside_a_training_step_is_estimated() -> None:
    # oracle: MemTracker live on the same step where the region detaches the weight first (the
    # same storage: the bytes are the same; torch's hooks see no tensor that requires grad there)
    torch.manual_seed(0)
    model, x = _FrozenBranch(detach=False), torch.randn(5, 8)
    oracle = _FrozenBranch(detach=True)
    oracle.load_state_dict(model.state_dict())
    result = checked_estimate(model, x, backward=True)
    assert result.peak_bytes == truth_peak(oracle, (x,), True, None)


def test_plan_runs_the_training_step_with_a_no_grad_region() -> None:
    # plan's step runs under the same hooks: it failed on the parent too ("the planned training
    # step failed on rank 0: AssertionError: Expected gradient function to be set")
    torch.manual_seed(0)
    x = torch.randn(5, 8)
    oracle = _FrozenBranch(detach=True)
    planned = flopcount.plan(lambda: _FrozenBranch(detach=False), (x,), fsdp=1, optimizer="adam")
    assert planned.peak_bytes == truth_peak(oracle, (x,), True, "adam")
