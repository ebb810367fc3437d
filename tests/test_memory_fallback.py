"""estimate_memory on a step that reads tensor values (issue #29 item 7): ``nonzero`` as
torch-geometric's self-loop helpers call it, or a value read in Python. Fake tensors cannot
run it, so one real step is measured on a copy, as count_flops falls back to one real run.

Oracle: torch's MemTracker on the same real step, run here on a deep copy of the model
(``truth_peak`` of tests/test_memory.py: optimizer warmed up, forward, sum of the outputs,
backward, step)."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_same_state, snapshot
from test_memory import MODE_IDS, MODES, truth_peak
from torch import nn

from flopcount.errors import FlopcountWarning, TraceError
from flopcount.memory.estimate import estimate_memory

pytest.importorskip("torch.distributed._tools.mem_tracker")


class KeepPositive(nn.Module):
    """Rows whose first feature is positive, then a Linear: the output size depends on data."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 32)
        self.norm = nn.BatchNorm1d(32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        keep = torch.nonzero(x[:, 0] > 0).squeeze(1)
        return self.norm(self.lin(x.index_select(0, keep)))


class AddSelfLoops(nn.Module):
    """A graph layer in torch-geometric's style: drop existing self loops (a boolean mask
    index, which is nonzero underneath), append one per node, scatter-add the messages."""

    def __init__(self, channels: int = 8) -> None:
        super().__init__()
        self.lin = nn.Linear(channels, channels)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        keep = edge_index[0] != edge_index[1]
        loops = torch.arange(x.shape[0]).repeat(2, 1)
        edges = torch.cat([edge_index[:, keep], loops], dim=1)
        h = self.lin(x)
        return torch.zeros_like(h).index_add(0, edges[1], h.index_select(0, edges[0]))


class ScatterIntoFloat32(nn.Module):
    """DBRX's expert loop in small: the routed rows (``nonzero``) go through a Linear and are
    added back into a float32 buffer with ``index_add_``. Under bfloat16 autocast the Linear's
    output is bfloat16 and the real ``index_add_`` refuses it: the real step itself fails."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        routed = torch.nonzero(x[:, 0] > 0).squeeze(1)
        out = torch.zeros(x.shape, dtype=torch.float32)
        return out.index_add_(0, routed, self.lin(x.index_select(0, routed)))


class KeepPositiveWithCyclicScratch(nn.Module):
    """:class:`KeepPositive`'s data-dependent rows, with a scratch tensor left in a reference
    cycle (as Qwen4-Exp's indexer loop leaves garbage for the collector): reference counts never
    free it, so when it dies depends on when Python's cyclic collector runs."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 256)
        self.out = nn.Linear(256, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        keep = torch.nonzero(x[:, 0] > 0).squeeze(1)
        h = self.lin(x.index_select(0, keep))
        scratch = [h.detach() * 2.0]
        scratch.append(scratch)  # a cycle: garbage the collector alone frees
        del scratch
        return self.out(torch.relu(h))


@pytest.mark.parametrize("backward, optimizer", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
def test_a_step_that_reads_values_is_measured_for_real(backward, optimizer, train):
    torch.manual_seed(0)
    model = KeepPositive().train(train)
    x = torch.randn(64, 16)  # batch 64, about half the rows kept
    before = snapshot(model)
    saved_x, rng = x.clone(), torch.get_rng_state()
    with pytest.warns(FlopcountWarning, match="measured one real step"):
        result = estimate_memory(model, x, backward=backward, optimizer=optimizer)
    assert result.peak_bytes == truth_peak(model, x, backward, optimizer)
    assert result.mode == ("training step" if optimizer else "forward+backward" if backward else "inference")
    assert any("nonzero" in w for w in result.warnings)
    assert_same_state(model, before)  # BatchNorm stats, grads, flags: the copy ran, not the model
    assert torch.equal(x, saved_x) and torch.equal(torch.get_rng_state(), rng)
    assert result.module("lin").calls == 1


def test_self_loop_layer_forward_and_backward():
    torch.manual_seed(0)
    model = AddSelfLoops()
    x = torch.randn(20, 8)
    edge_index = torch.randint(0, 20, (2, 60))
    edge_index[:, :5] = torch.arange(5).repeat(2, 1)  # five self loops to drop
    with pytest.warns(FlopcountWarning, match="measured one real step"):
        result = estimate_memory(model, (x, edge_index), backward=True, optimizer="adam")
    assert result.peak_bytes == truth_peak(model, (x, edge_index), True, "adam")


def test_meta_weights_have_no_values_to_fall_back_on():
    model = KeepPositive().to("meta")
    with pytest.raises(TraceError, match="no real step can stand in"):
        estimate_memory(model, torch.randn(8, 16, device="meta"))


def test_torch_geometric_gcn_conv():
    pyg = pytest.importorskip("torch_geometric")
    torch.manual_seed(0)
    conv = pyg.nn.GCNConv(8, 16)  # adds self loops (nonzero on the edge mask)
    x = torch.randn(30, 8)
    edge_index = torch.randint(0, 30, (2, 90))
    with pytest.warns(FlopcountWarning, match="measured one real step"):
        result = estimate_memory(conv, (x, edge_index), backward=True)
    assert result.peak_bytes == truth_peak(conv, (x, edge_index), True, None)


def test_dtype_cast_applies_to_the_real_step():
    """dtype= casts the copy's weights and inputs as it casts the fake ones. Oracle: MemTracker
    on the real step of a bfloat16 copy with bfloat16 inputs."""
    import copy

    torch.manual_seed(0)
    model = KeepPositive()
    x = torch.randn(32, 16)
    with pytest.warns(FlopcountWarning, match="measured one real step"):
        result = estimate_memory(model, x, backward=True, dtype=torch.bfloat16)
    assert result.peak_bytes == truth_peak(copy.deepcopy(model).to(torch.bfloat16), x.to(torch.bfloat16), True, None)
    assert result.dtype == "bfloat16" and model.lin.weight.dtype == torch.float32


def test_a_real_step_that_fails_itself_raises_a_trace_error_naming_its_failure():
    """The fake step reads values, so one real step stands in; that real step fails in the
    model's own code (bfloat16 autocast, as transformers' DBRX: zoo_replay_hf_types' sweep).
    estimate_memory raises the TraceError naming the real failure, where it let its private
    ``_NeedsData`` escape: the real error's context chain held the fake step's DataDependent
    error, so it was taken for one more value read."""
    torch.manual_seed(0)
    model = ScatterIntoFloat32()
    x = torch.randn(32, 16)
    with pytest.raises(RuntimeError, match="same scalar type"), torch.autocast("cpu", dtype=torch.bfloat16):
        model(x)  # the oracle: the real step fails in the model itself
    before = snapshot(model)
    saved_x = x.clone()
    with pytest.raises(TraceError, match=r"index_add_\(\): self \(Float\) and source \(BFloat16\)"):
        estimate_memory(model, x, backward=True, optimizer="adamw", autocast=torch.bfloat16)
    assert_same_state(model, before)
    assert torch.equal(x, saved_x)


def test_the_real_step_s_peak_does_not_depend_on_when_the_collector_runs():
    """The real step that stands in for a fake one reading values ran with Python's cyclic
    collector back on, so a tensor held by a garbage cycle was freed at a moment set by the
    process's allocation history: the same estimate gave another peak from one call to the next
    (Qwen4-Exp in zoo_replay_hf_types, reuse off against on, and reuse off twice). It now runs
    with the collector paused, as the fake steps do. Oracle: MemTracker live on the same real
    step with the collector off (the cycle held to the step's end)."""
    import gc

    torch.manual_seed(0)
    model = KeepPositiveWithCyclicScratch()
    x = torch.randn(64, 16)
    thresholds = gc.get_threshold()
    peaks = []
    try:
        for threshold in (1, 1_000_000):  # a collection at almost every allocation; none in the step
            gc.set_threshold(threshold)
            with pytest.warns(FlopcountWarning, match="measured one real step"):
                peaks.append(estimate_memory(model, x, backward=True, optimizer="adam").peak_bytes)
    finally:
        gc.set_threshold(*thresholds)
    gc.disable()
    try:
        truth = truth_peak(model, x, True, "adam")
    finally:
        gc.enable()
    assert peaks == [truth, truth]
