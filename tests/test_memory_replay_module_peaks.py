"""Issue #32's contract, every per-module row identical with the replay on and off, for modules
whose forward makes no tensor: a dropout at p = 0 in training mode (transformers' GPT-2 and BERT
right after construction) runs one op, ``prim::device`` (the input's device, read by ATen's
``dropout``), and in eval mode none. The full trace credited that op's live bytes to the dropout;
the replay's timeline leaves tensor-less ops out, so with the replay on its ``peak_bytes`` was 0
(13 GPT-2 rows, 13 BERT rows, inference steps).

The definition flopcount follows (docs/memory.md, "per module ... ``peak_bytes``: highest total
while it ran"): a module's peak is the highest live total at any moment it is running, read at
each entry (its forward, a recompute, its backward) and after each op while it runs. The bytes
alive when it is entered are alive while it runs, whatever ops it runs or skips, so a module
that runs no tensor op is credited with them, in the full trace and in the replay alike. That is
torch's own definition: ``MemTracker`` starts a module's ``local_peak`` from the snapshot at its
forward (``PEAK_FW``) and backward (``PEAK_BW``) entries and raises it after each op. The oracle
below is MemTracker run live on the same real step (a copy of the model, batch 2): every module
that ran has flopcount's ``peak_bytes`` equal to MemTracker's highest ``PEAK_FW``/``PEAK_BW``
total; modules that never ran (the unused ``attn_dropout`` under SDPA, the layer lists) have
no MemTracker record and 0 calls, peak 0 in flopcount.
"""

from __future__ import annotations

import copy
from typing import Any, Callable, Dict, List, Tuple

import pytest
import torch
from _layer_stacks import bert, estimates_on_and_off, gpt2, ids
from conftest import assert_same_state, snapshot
from torch import nn

from flopcount.step.loss import default_loss

pytestmark = pytest.mark.usefixtures("replay_from_six_layers")  # the replay's module rows on 6-8-layer stacks (conftest)

pytest.importorskip("transformers")
mem_tracker = pytest.importorskip("torch.distributed._tools.mem_tracker")

MODELS: Dict[str, Callable[[], nn.Module]] = {"gpt2": gpt2, "bert": bert}


def _estimates(monkeypatch: pytest.MonkeyPatch, model: nn.Module, x: torch.Tensor, backward: bool) -> Tuple[Any, Any, List[bool]]:
    """The estimate with the replay on and off, and whether the replay was taken each time."""
    return estimates_on_and_off(monkeypatch, model, (x,), {}, backward=backward)


def _memtracker_module_peaks(model: nn.Module, x: torch.Tensor, backward: bool) -> Dict[str, int]:
    """torch's MemTracker around the same step run for real on a copy (forward under no_grad;
    with backward: flopcount's default loss, the outputs released, backward): each module's
    highest total over its PEAK_FW and PEAK_BW snapshots, by the model's module names."""
    real = copy.deepcopy(model)
    tracker = mem_tracker.MemTracker()
    tracker.track_external(real, x)
    with tracker:
        if backward:
            loss = default_loss(real(x))
            loss.backward()
            del loss
        else:
            with torch.no_grad():
                real(x)
    states = (mem_tracker._ModState.PEAK_FW, mem_tracker._ModState.PEAK_BW)
    out: Dict[str, int] = {}
    for (name, _), module in zip(model.named_modules(), real.modules()):
        stats = tracker.memory_tracking.get(module)
        if stats is not None:
            snaps = [snap for state in states for snap in stats.snapshots.get(state, [])]
            out[name] = max(sum(int(dev["Total"]) for dev in snap.values()) for snap in snaps)
    return out


@pytest.mark.parametrize("step", ["inference", "fwd+bwd"])
@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_module_row_is_the_same_with_the_replay_on_and_off(monkeypatch: pytest.MonkeyPatch, name: str, mode: str, step: str) -> None:
    torch.manual_seed(0)
    model = MODELS[name]()
    model.train(mode == "train")
    x = ids()  # batch 2
    backward = step == "fwd+bwd"
    before = snapshot(model)
    on, off, used = _estimates(monkeypatch, model, x, backward)
    assert used == [True, False]  # replayed with the switch on, traced in full with it off
    assert [row.name for row in on.modules] == [row.name for row in off.modules]
    for a, b in zip(on.modules, off.modules):
        assert a == b, a.name  # name, type, depth, calls, activation bytes, peak bytes
    assert on == off
    assert_same_state(model, before)

    truth = _memtracker_module_peaks(model, x, backward)
    dropouts = [row for row in on.modules if row.type_name == "Dropout" and row.calls]
    assert len(dropouts) == 13  # the embeddings' dropout and 2 per layer, 6 layers
    for row in on.modules:
        if row.name in truth:
            assert row.peak_bytes == truth[row.name], row.name
        else:  # never ran: MemTracker never saw it
            assert row.calls == 0 and row.peak_bytes == 0, row.name
    for row in dropouts:  # what they were credited: the live bytes while they ran, never 0
        assert row.peak_bytes == truth[row.name] > 0


class _Block(nn.Module):
    """Linear(64, 64) then a dropout at p = 0: in training mode the dropout's only op reads the
    input's device (no tensor made); in eval mode it runs no op."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(64, 64)
        self.drop = nn.Dropout(0.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.lin(x))


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_a_dropout_is_credited_the_bytes_alive_while_it_runs(monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    # 8 blocks (replayed: at least 6 identical layers), batch 4, inference. Derived by hand, in
    # float32 bytes: parameters P = 8 x (64 x 64 + 64) x 4 = 133,120; each activation x = 4 x 64 x 4
    # = 1,024. When block i's dropout runs, alive: P, the model's input (held by the caller), and
    # block i's Linear output; from block 1 on also block i's input (the previous block's output,
    # still held by Sequential's loop variable). So blocks.0.drop: P + 2x, blocks.i.drop (i >= 1):
    # P + 3x, in train and eval mode alike, with the replay on and off.
    torch.manual_seed(0)
    model = nn.Sequential(*(_Block() for _ in range(8)))
    model.train(mode == "train")
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(3))
    on, off, used = _estimates(monkeypatch, model, x, backward=False)
    assert used == [True, False] and on == off
    params, act = 8 * (64 * 64 + 64) * 4, 4 * 64 * 4
    assert on.module("0.drop").peak_bytes == params + 2 * act
    for i in range(1, 8):
        assert on.module(f"{i}.drop").peak_bytes == params + 3 * act
    truth = _memtracker_module_peaks(model, x, backward=False)
    assert {row.name: row.peak_bytes for row in on.modules if row.name} == {k: v for k, v in truth.items() if k}
