"""Issue #32's review findings on estimate_memory and the optimizer step, each failing before.

Oracles: torch's MemTracker around the same step run for real (Adagrad), Adagrad's state counted
by hand (a ``sum`` the parameter's size and a 4-byte ``step`` per parameter), torch's own full
warm-up (``FLOPCOUNT_REUSE=0``) for the count's optimizer step."""

from __future__ import annotations

import warnings
from typing import Any, List

import pytest
import torch
from _live_oracles import loop_peaks, warmed_step_peak
from conftest import assert_same_state, snapshot
from torch import nn

import flopcount
from flopcount.errors import UsageError
from flopcount.memory.estimate import estimate_memory

pytestmark = pytest.mark.usefixtures("replay_from_six_layers")  # 8-layer stacks replayed (conftest)

MemTracker = pytest.importorskip("torch.distributed._tools.mem_tracker").MemTracker


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 64))


def test_a_lazy_module_is_refused_naming_it_and_left_lazy() -> None:
    # before: a UsageError carrying torch's "Attempted to use an uninitialized parameter" text
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Sequential(nn.LazyLinear(4)))
    with pytest.raises(UsageError, match=r"module '2\.0' \(LazyLinear\) has uninitialized lazy weight, bias") as info:
        estimate_memory(model, torch.randn(2, 8), backward=True)
    assert "Attempted to use" not in str(info.value)
    assert nn.parameter.is_lazy(model[2][0].weight)  # the caller's model is not materialised


@pytest.mark.parametrize("spec", ["adagrad", torch.optim.Adagrad, lambda ps: torch.optim.Adagrad(ps, lr=0.1)],
                         ids=["name", "class", "factory"])
def test_adagrad_is_estimated_on_fakes_as_memtracker_measures_it(spec: Any) -> None:
    # before: "Adagrad.step() failed on fake tensors: DataDependentOutputException" (its
    # constructor made a real ``step`` tensor outside the fake mode); the name was unknown
    torch.manual_seed(0)
    model = _mlp()
    x = torch.randn(4, 64)
    before = snapshot(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = estimate_memory(model, x, backward=True, optimizer=spec)
    assert_same_state(model, before)
    params = list(model.parameters())
    # Adagrad's state: ``sum`` (the parameter's shape, fp32) and ``step`` (a 0-d fp32 tensor) each.
    # The peak is in its step, where MemTracker books what the step makes as optimizer state too:
    # each parameter's ``std = sum.sqrt().add_(eps)`` while the previous parameter's is still bound
    # (the loop rebinds it after making the new one): 256x64 weight's 65,536 B + 256-bias's 1,024 B.
    state = sum(4 * p.numel() for p in params) + 4 * len(params)
    assert result.peak_phase == "optimizer"
    assert result.at_peak.optimizer_state == state + 4 * 256 * 64 + 4 * 256
    assert result.at_peak.gradients == result.at_peak.parameters == sum(4 * p.numel() for p in params)
    assert result.peak_bytes == warmed_step_peak(model, x, torch.optim.Adagrad)


def test_the_counts_optimizer_step_is_warmed_up_one_parameter_per_kind(monkeypatch: pytest.MonkeyPatch) -> None:
    # before: tracers/_optimizer.py's FakeOptimizerStep stepped every parameter in its warm-up
    # (the full step), not step/optimizers.py's warm-up by kind that estimate_memory and plan use
    import flopcount.step.optimizers as optimizers

    calls: List[int] = []
    by_kind = optimizers._warm_up_by_kind

    def spy(opt: torch.optim.Optimizer, caller: str) -> None:
        calls.append(sum(len(g["params"]) for g in opt.param_groups))
        by_kind(opt, caller)

    monkeypatch.setattr(optimizers, "_warm_up_by_kind", spy)
    model = nn.Sequential(*[nn.Linear(32, 32) for _ in range(6)])
    x = torch.randn(4, 32)
    monkeypatch.setenv("FLOPCOUNT_REUSE", "1")
    on = flopcount.count_flops(model, (x,), backward=True, optimizer="adam")
    assert calls == [12]  # the one warm-up of the count's optimizer, by kind (12 parameters, 2 kinds)
    monkeypatch.setenv("FLOPCOUNT_REUSE", "0")
    off = flopcount.count_flops(model, (x,), backward=True, optimizer="adam")
    assert calls == [12]  # off: the full warm-up, torch's own step on every parameter
    assert on.to_dict() == off.to_dict()


class _SkippingBlock(nn.Module):
    """Linear(64, 64) + ReLU, and a Linear(64, 16) its forward never calls."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(64, 64)
        self.unused = nn.Linear(64, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.lin(x))


class _UnusedInEveryLayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(_SkippingBlock() for _ in range(8))  # 8: the stack is replayed
        self.head = nn.Linear(64, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def _unused_head() -> nn.Module:
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent / "plan"))
    from _plan_gloo import UnusedHead

    return UnusedHead()


@pytest.mark.parametrize("reuse", ["1", "0"])
@pytest.mark.parametrize("build", [_unused_head, _UnusedInEveryLayer], ids=["unused-head", "unused-in-every-layer"])
def test_a_parameter_the_step_gives_no_gradient_holds_no_optimizer_state(
    build: Any, reuse: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # AdamW skips a parameter without a gradient, so a real loop never makes its state; the
    # warm-up gave it state. Unused head (8 Linear(64, 64) blocks + head, pooler Linear(64, 32)):
    # the pooler's 2 x (64 x 32 + 32) x 4 B of moments + 2 x 4 B of steps too many (665,296 B
    # against 648,648 B on tests/plan's 2 x 16 x 64 input). An unused Linear(64, 16) in each of
    # 8 replayed layers: the replayed estimate did not judge the stack's parameters at all,
    # 733,064 B against the real 666,440 B here, 8 layers x (2 x 1,040 x 4 B + 2 x 4 B) too many.
    # Oracle: torch's MemTracker on a real AdamW loop (the steady state's third step), and the
    # one-rank plan of the same model, which must equal it by construction (issue #27 item 2).
    monkeypatch.setenv("FLOPCOUNT_REUSE", reuse)
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.manual_seed(0)
        peaks, _ = loop_peaks(build().train(), x)
        torch.manual_seed(0)
        estimate = flopcount.estimate_memory(build().train(), (x,), backward=True, optimizer="adamw")
        planned = flopcount.plan(build, (x,), on=None)
    assert peaks[1] == peaks[2]  # the steady state
    assert estimate.peak_bytes == peaks[2] == planned.peak_bytes
