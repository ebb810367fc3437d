"""Issue #27 (suite time through the product): the step's MemTracker subclass
(flopcount.step.runner.peak_tracker) runs most ops through an inlined copy of torch's
``MemTracker.__torch_dispatch__`` / ``FSDPMemTracker.__torch_dispatch__`` (``_LeanDispatch``)
instead of torch's method, which walks each op's output with pytree behind a dynamo wrapper.

Oracle: torch's own method, run live on the same step (``_LeanDispatch.special`` answering True
sends every op to it, as before this change), compared as whole ``MemoryEstimate`` /
``PlanResult`` values (peak, categories at the peak, every module's figures, state bytes, FLOPs,
collectives). Cases chosen where the inlined method must do what torch's does differently from
a plain op: an activation-checkpoint recompute in the backward (torch books its tensors as
activations, not temporaries: ``_in_ac``), FSDP2's all-gathers and reduce-scatters (torch's
method books their buffers in their own categories: they must go to it), tensor parallelism
(DTensor ops passed on with NotImplemented, DTensor's shape propagation run past the tracker),
the gloo backend's scratch copy, a real step (no fake mode: the fallback for data reads),
inference and training, batch 2."""

from __future__ import annotations

import importlib
import warnings
from typing import Any, Callable, Dict, List

import pytest
import torch
from _layer_stacks import ids, llama
from torch import nn
from torch.utils.checkpoint import checkpoint

import flopcount
from flopcount.memory.estimate import estimate_memory
from flopcount.step import runner

pytest.importorskip("torch.distributed._tools.mem_tracker")


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


class Gathers(nn.Module):
    """A step that reads tensor values (``nonzero``): estimated by one real step on a copy."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        return h[h > 0].sum() + h.sum()


def _both(monkeypatch: pytest.MonkeyPatch, run: Callable[[], Any]) -> List[Any]:
    """``run()`` with the inlined method (counting the ops it took), then with torch's for every op."""
    taken: List[int] = []
    lean_call = runner._LeanDispatch.__call__

    def counted(self: Any, *args: Any) -> Any:
        taken.append(1)
        return lean_call(self, *args)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        monkeypatch.setattr(runner._LeanDispatch, "__call__", counted)
        lean = run()
        assert taken, "the inlined per-op method was never taken"
        monkeypatch.setattr(runner._LeanDispatch, "special", lambda self, func: True)
        torchs = run()
    return [lean, torchs]


X = torch.randn(2, 8, 32, generator=torch.Generator().manual_seed(0))

MEMORY_CASES: Dict[str, Callable[[], Any]] = {
    "checkpoint-adamw": lambda: estimate_memory(Checkpointed().train(), (X,), backward=True, optimizer="adamw"),
    "checkpoint-fwd+bwd": lambda: estimate_memory(Checkpointed().train(), (X,), backward=True),
    "checkpoint-eval": lambda: estimate_memory(Checkpointed().eval(), (X,)),
    "llama-sgd-autocast": lambda: estimate_memory(
        llama(intermediate_size=96, layers=2), (ids(),), backward=True, optimizer="sgd", autocast=torch.bfloat16
    ),
    "real-step": lambda: estimate_memory(Gathers(), (torch.randn(2, 16, generator=torch.Generator().manual_seed(1)),), backward=True),
}


@pytest.mark.parametrize("case", list(MEMORY_CASES))
def test_the_inlined_method_gives_every_figure_of_torchs_in_estimate_memory(monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    torch.manual_seed(0)
    build = MEMORY_CASES[case]
    lean, torchs = _both(monkeypatch, build)
    assert lean == torchs
    if case == "checkpoint-fwd+bwd":
        # the recompute's tensors are activations (torch's ``_in_ac``): the backward holds some at the peak
        assert lean.peak_phase == "backward" and lean.at_peak.activations


PLAN_CASES: Dict[str, Dict[str, Any]] = {
    "fsdp2-tp2": {"fsdp": 2, "tp": 2},
    "fsdp2-bf16-gloo": {"fsdp": 2, "mixed_precision": "bfloat16", "backend": "gloo"},
    "one-rank-checkpoint": {},
    "fsdp2-checkpoint": {"fsdp": 2},
}


@pytest.mark.parametrize("case", list(PLAN_CASES))
def test_the_inlined_method_gives_every_figure_of_torchs_in_plan(monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    options = PLAN_CASES[case]
    if case.endswith("checkpoint"):
        lean, torchs = _both(monkeypatch, lambda: flopcount.plan(Checkpointed, (X,), on="h100", link="nvlink4", **options))
    else:
        lean, torchs = _both(monkeypatch, lambda: flopcount.plan(lambda: llama(layers=2), (ids(),), on="h100", link="nvlink4", **options))
    assert lean == torchs
    if options.get("fsdp", 1) > 1:  # the collectives went to torch's method, and were booked
        assert {row.kind for row in lean.comm} >= {"all_gather", "reduce_scatter"}
        assert lean.memory["all_gather_buffers"] or lean.memory["reduce_scatter_buffers"]


def test_collectives_and_waits_go_to_torchs_method() -> None:
    lean = runner._lean_dispatch(importlib.import_module("torch.distributed._tools.mem_tracker").MemTracker)
    assert lean is not None
    import torch.distributed

    for op in (torch.ops._c10d_functional.wait_tensor.default, torch.ops.c10d._allgather_base_.default,
               torch.ops.c10d._reduce_scatter_base_.default):
        assert lean.special(op)
    assert not lean.special(torch.ops.aten.add.Tensor) and not lean.special(torch.ops.aten.mm.default)


def test_an_output_other_than_tensors_tuples_and_lists_is_walked_in_full() -> None:
    from collections import namedtuple

    pair = namedtuple("pair", "a b")
    a, b = torch.zeros(2), torch.ones(3)
    found: List[torch.Tensor] = []
    assert runner._plain_tensors((a, [b, None, 3]), found) and found == [a, b]
    assert not runner._plain_tensors(pair(a, b), [])  # a structure pytree walks its own way
    assert not runner._plain_tensors({"a": a}, [])


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
    from flopcount.errors import TraceError

    model = Checkpointed()
    first = estimate_memory(model, (X,), backward=True, optimizer="sgd")
    bad = RaisesInBackward()
    state = {k: v.clone() for k, v in bad.state_dict().items()}
    with pytest.raises(TraceError, match="recompute refused"):
        estimate_memory(bad, (X,), backward=True)
    assert all(torch.equal(v, state[k]) for k, v in bad.state_dict().items())
    assert all(p.grad is None for p in bad.parameters()) and bad.training and bad.calls == 0
    assert estimate_memory(model, (X,), backward=True, optimizer="sgd") == first  # no recompute left marked
