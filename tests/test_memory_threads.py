"""estimate_memory beside other threads (issue #29 item 17): MemTracker's module and optimizer
hooks are process-wide, so another thread's forwards and optimizer steps used to enter the
estimate (wrong peaks) and run its code (raising inside that thread). Oracle: torch's MemTracker
on a real single-threaded step of the same model (tests/test_memory.py's truth_peak)."""

from __future__ import annotations

import threading
from typing import Any, List

import pytest
import torch
from torch import nn

from flopcount import estimate_memory

pytest.importorskip("torch.distributed._tools.mem_tracker")

from test_memory import truth_peak  # the live MemTracker oracle


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 64))


class _Trainer(threading.Thread):
    """Trains its own model in a loop (forward, backward, Adam step) until stopped."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.model = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 8))
        self.opt = torch.optim.Adam(self.model.parameters())
        self.stop = threading.Event()
        self.ready = threading.Event()
        self.errors: List[BaseException] = []
        self.steps = 0

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self.model(torch.randn(4, 32)).sum().backward()
                self.opt.step()
                self.opt.zero_grad()
                self.steps += 1
            except BaseException as exc:  # what the neighbour got is the test's finding
                self.errors.append(exc)
            self.ready.set()


@pytest.mark.parametrize("optimizer", [None, "adam"])
def test_estimate_beside_a_training_thread(optimizer):
    model, x = _model(), torch.randn(8, 64)
    truth = truth_peak(model, x, True, optimizer)
    neighbour = _Trainer()
    neighbour.start()
    assert neighbour.ready.wait(60)
    try:
        peaks = [estimate_memory(model, x, backward=True, optimizer=optimizer).peak_bytes for _ in range(4)]
    finally:
        neighbour.stop.set()
        neighbour.join(120)
    assert not neighbour.errors, neighbour.errors[:1]
    assert neighbour.steps >= 1
    assert peaks == [truth] * 4


def test_two_estimates_at_once():
    model, x = _model(), torch.randn(8, 64)
    truth = {None: truth_peak(model, x, True, None), "adam": truth_peak(model, x, True, "adam")}
    results: dict = {}
    errors: List[BaseException] = []

    def estimate(optimizer: Any) -> None:
        try:
            results[optimizer] = [estimate_memory(model, x, backward=True, optimizer=optimizer).peak_bytes for _ in range(3)]
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=estimate, args=(opt,)) for opt in truth]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    assert not errors, errors[:1]
    assert results == {opt: [peak] * 3 for opt, peak in truth.items()}
