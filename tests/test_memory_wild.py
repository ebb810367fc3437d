"""estimate_memory on patterns real training code writes that the other memory tests did not
cover (branch wildmem), each failing before: an ``nn.LSTM`` on the CPU (oneDNN's workspace, two
bias gradients) and activation checkpointing under ``autocast=`` (the recompute's weight casts).

Oracle: torch's ``MemTracker`` on the real CPU step of the same model, inputs and recipe
(``_live_oracles``: forward, sum loss, backward, the optimizer's step with its state made by
an earlier step; under AMP the forward and loss inside ``torch.autocast(bfloat16)``, the
backward and step outside it), batch > 1."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.utils.checkpoint as checkpoint
from _live_oracles import warmed_step_peak
from conftest import assert_same_state, snapshot
from torch import nn

from flopcount.memory.estimate import estimate_memory

MemTracker = pytest.importorskip("torch.distributed._tools.mem_tracker").MemTracker


class Sequence(nn.Module):
    """An LSTM whose output sequence is the model's output (the sum loss of the oracle)."""

    def __init__(self, **options: object) -> None:
        super().__init__()
        self.lstm = nn.LSTM(32, 64, **options)  # type: ignore[arg-type]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lstm(x)[0]


def _estimate(model: nn.Module, x: torch.Tensor, **options: object) -> int:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return estimate_memory(model, x, **options).peak_bytes  # type: ignore[arg-type]


@pytest.mark.parametrize("options, train", [
    ({"num_layers": 2, "batch_first": True}, True),
    ({"num_layers": 2, "bidirectional": True}, True),
    ({"num_layers": 2}, False),  # eval mode: the kernel still keeps a workspace when grad is on
], ids=["2-layers", "bidirectional", "eval"])
def test_an_lstm_training_step_keeps_onednns_workspace_as_the_real_one(options: dict, train: bool) -> None:
    # before: torch's meta kernel of mkldnn_rnn_layer gives an empty workspace (the CPU kernel keeps
    # 180,224 B per layer and direction at 10 steps x batch 4 x 64 units for the backward), and one
    # tensor for both bias gradients: the 2-layer step was 109,576 B short of MemTracker's peak
    torch.manual_seed(0)
    model = Sequence(**options).train(train)
    x = torch.randn(4, 10, 32)
    before = snapshot(model)
    estimate = _estimate(model, x, backward=True, optimizer=torch.optim.AdamW)
    assert_same_state(model, before)
    assert estimate == warmed_step_peak(model, x, torch.optim.AdamW)


def test_an_lstm_in_inference_has_no_workspace() -> None:
    # the kernel makes none without grad mode: the stand-in must not add one (as before)
    torch.manual_seed(0)
    model = Sequence(num_layers=2)
    x = torch.randn(10, 4, 32)
    tracker = MemTracker()
    tracker.track_external(model, x)
    with tracker, torch.no_grad():
        model(x)
    (peak,) = tracker.get_tracker_snapshot("peak").values()
    assert _estimate(model, x) == peak["Total"]


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(64, 256), nn.Linear(256, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(x)))


class Checkpointed(nn.Module):
    """Three blocks, each run under torch.utils.checkpoint (non-reentrant), or two segments of
    checkpoint_sequential."""

    def __init__(self, sequential: bool) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*[Block() for _ in range(3)])
        self.sequential = sequential

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.sequential:
            return checkpoint.checkpoint_sequential(self.blocks, 2, x, use_reentrant=False)
        for block in self.blocks:
            x = checkpoint.checkpoint(block, x, use_reentrant=False)
        return x


def amp_recipe_peak(model: nn.Module, x: torch.Tensor, adam: bool) -> int:
    """MemTracker's peak of the real AMP recipe on a copy: ``with autocast: loss = model(x).sum()``,
    then ``loss.backward(); del loss; opt.step()`` outside it, Adam's state made by an earlier step
    (``_live_oracles.amp_step_peak`` keeps the loss alive through the step: 4 bytes more)."""
    model = copy.deepcopy(model)
    opt = torch.optim.Adam(model.parameters()) if adam else None
    if opt is not None:
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
        opt.step()
        opt.zero_grad(set_to_none=True)
    tracker = MemTracker()
    tracker.track_external(model, *([opt] if opt is not None else []), x)
    with tracker:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(x).sum()
        loss.backward()
        del loss
        if opt is not None:
            opt.step()
    (peak,) = tracker.get_tracker_snapshot("peak").values()
    return int(peak["Total"])


@pytest.mark.parametrize("sequential", [False, True], ids=["checkpoint", "checkpoint_sequential"])
@pytest.mark.parametrize("adam", [False, True], ids=["fwd+bwd", "adam"])
def test_checkpointing_under_autocast_frees_the_recomputes_casts_as_the_recipe_does(sequential: bool, adam: bool) -> None:
    # before: the step ran its backward inside torch.autocast(enabled=False); each recompute's
    # autocast was then nested in it, and its exit kept the bf16 weight casts it had cached to the
    # backward's end (a bare loss.backward() frees them as each recompute ends): 198,528 B (+24 %)
    # over MemTracker on the 3-block fwd+bwd step
    torch.manual_seed(0)
    model = Checkpointed(sequential)
    x = torch.randn(32, 64)
    before = snapshot(model)
    estimate = _estimate(model, x, backward=True, optimizer="adam" if adam else None, autocast=torch.bfloat16)
    assert_same_state(model, before)
    assert estimate == amp_recipe_peak(model, x, adam)


def test_a_large_workspace_probe_is_announced_before_it_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe runs one real layer per shape: from ``PROBE_NOTED_FLOPS`` on (10^11, seconds to
    minutes; lowered here to this small LSTM's first layer) a FlopcountWarning says so before it
    runs and the estimate's warnings keep it (main: silent). The work is the layer's gate products
    by hand, 2 x (steps x batch) x 4 x hidden x (input + hidden); the estimate stays MemTracker's."""
    from flopcount.errors import FlopcountWarning
    from flopcount.tracers.fake import meta_kernels

    steps, batch, inputs, hidden = 11, 3, 24, 40  # shapes no other test probes (the probe is cached per shape)
    first = 2 * (steps * batch) * 4 * hidden * (inputs + hidden)  # 675,840 FLOPs
    second = 2 * (steps * batch) * 4 * hidden * (hidden + hidden)  # the second layer's input is the first's output
    monkeypatch.setattr(meta_kernels, "PROBE_NOTED_FLOPS", first)
    torch.manual_seed(0)
    model = Sequence(num_layers=2)
    model.lstm = nn.LSTM(inputs, hidden, num_layers=2)
    x = torch.randn(steps, batch, inputs)
    with pytest.warns(FlopcountWarning) as caught:
        estimate = estimate_memory(model, x, backward=True, optimizer=torch.optim.AdamW)
    said = [str(w.message) for w in caught if "oneDNN" in str(w.message)]
    layer = f"a layer (input [{steps}, {batch}, {inputs}], hidden {hidden}: {first / 1e9:,.0f} GFLOP"
    assert any(text.startswith("estimate_memory: sizing oneDNN's LSTM workspace runs " + layer) for text in said), said
    assert any(layer in text for text in estimate.warnings), estimate.warnings
    assert second > first and f"input [{steps}, {batch}, {hidden}]" in " ".join(estimate.warnings)
    assert estimate.peak_bytes == warmed_step_peak(model, x, torch.optim.AdamW)
    monkeypatch.setattr(meta_kernels, "PROBE_NOTED_FLOPS", second + 1)  # below it: nothing said
    assert not [w for w in estimate_memory(model, x, backward=True, optimizer=torch.optim.AdamW).warnings if "oneDNN" in w]
