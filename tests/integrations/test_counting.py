"""The framework-free parts of the trainer integrations: signatures, the per-signature cache
(one count per shape, a failed count never raises), the rates by hand, the peak."""

from __future__ import annotations

import collections
import warnings
from typing import Deque

import pytest
import torch
from torch import nn

from flopcount.errors import FlopcountWarning
from flopcount.integrations._counting import StepCounter, batch_signature
from flopcount.integrations._rates import Window, model_flops, resolve_peak, window_metrics


class Counted(nn.Module):
    """Counts how often its forward runs (the fake copies' runs included): one entry per run in a
    deque of the class's (a reading sets a class's int, list, dict or set back as found,
    core/state.FoundState; a deque it leaves alone)."""

    runs: Deque[None] = collections.deque()

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 4, bias=False)

    def forward(self, x, flag=True, n_items=0):
        type(self).runs.append(None)
        return self.fc(x).sum()


def test_signature_is_shapes_dtypes_and_flags_not_numbers():
    x = torch.zeros(2, 8)
    base = batch_signature((x,), {"flag": True, "n_items": 3})
    assert batch_signature((torch.ones(2, 8),), {"flag": True, "n_items": 7}) == base  # values and numbers: same
    assert batch_signature((torch.zeros(3, 8),), {"flag": True, "n_items": 3}) != base  # shape
    assert batch_signature((x.double(),), {"flag": True, "n_items": 3}) != base  # dtype
    assert batch_signature((x,), {"flag": False, "n_items": 3}) != base  # a flag


def test_one_count_per_signature_then_lookups():
    model, sgd = Counted(), None
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    counter = StepCounter(lambda out: out)
    Counted.runs.clear()
    x = torch.randn(5, 8)
    sig = batch_signature((x,), {})
    first = counter.count_train(sig, model, (x,), {}, sgd)
    runs = len(Counted.runs)
    for _ in range(3):
        assert counter.count_train(sig, model, (x,), {}, sgd) == first
    assert len(Counted.runs) == runs == 1
    # forward x @ W.T: 5 x 8 x 4 MACs; backward grad_W only (x needs no grad)
    assert first.forward_macs == 5 * 8 * 4 and first.backward == 2 * 5 * 8 * 4
    assert counter.optimizer_flops(sgd) is not None and model.fc.weight.grad is None


def test_a_failed_count_warns_once_and_returns_none():
    def broken(out):
        raise RuntimeError("no loss here")

    counter = StepCounter(broken)
    x = torch.randn(2, 8)
    sig = batch_signature((x,), {})
    with pytest.warns(FlopcountWarning, match="could not count this training step"):
        assert counter.count_train(sig, Counted(), (x,), {}) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert counter.count_train(sig, Counted(), (x,), {}) is None  # remembered: not retried, no second warning


def test_window_metrics_by_hand():
    window = Window()
    # 4e12 FLOPs run in 4 s; model FLOPs 3e12 (a checkpointed model recomputes part of its forward)
    window.add(3 * 10**12, 2.0, 1000, 4, model_flops=2 * 10**12)
    window.add(10**12, 2.0, 3000, 4, model_flops=10**12)
    metrics = window_metrics(window, peak=2e12)
    assert metrics == pytest.approx({
        "flopcount/flops_per_step": 2e12, "flopcount/tflops_per_s": 1.0, "flopcount/hfu": 0.5,
        "flopcount/mfu": 3e12 / 4.0 / 2e12, "flopcount/tokens_per_s": 1000.0, "flopcount/samples_per_s": 2.0,
    })
    window.add(1, 1.0, None, 1)  # a step without token ids or model FLOPs: no tokens_per_s, no mfu
    assert "flopcount/tokens_per_s" not in window_metrics(window, None) and "flopcount/hfu" not in window_metrics(window, None)
    assert "flopcount/mfu" not in window_metrics(window, 2e12) and "flopcount/hfu" in window_metrics(window, 2e12)
    assert model_flops(7, 10, False) == model_flops(7, 30, True) == 21 and model_flops(7, 10, True) == 10  # frozen: at most the step's FLOPs


def test_no_peak_on_cpu_unless_given(tmp_path, monkeypatch):
    """Issue #29 item 11: a measured CPU GEMM rate is not a peak; no MFU on CPU unless a peak is passed
    (and no roof is measured for it: the seeded cache below would be read if it were)."""
    from flopcount.devices.measured import machine_roofs
    from flopcount.devices.roofline import Roofs

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    machine_roofs("cpu", measure=lambda dev: Roofs({"float32": 3e11, "bfloat16": 1e11}, 2e10, source="measured"),
                  loadavg=lambda: (0.0, 0.0, 0.0))  # an idle machine: the measurement is cached
    peak, note = resolve_peak(torch.device("cpu"), torch.float32, None)
    assert peak is None and "no MFU on CPU unless peak_flops=" in note
    assert resolve_peak(torch.device("cpu"), torch.bfloat16, None)[0] is None
    assert resolve_peak(torch.device("cpu"), torch.float32, 5e11) == (5e11, "")
    assert resolve_peak(torch.device("meta"), torch.float32, None)[0] is None
