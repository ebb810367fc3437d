"""benchmark, profile, plan and measured roofs leave another thread's random draws alone
(issue #29 item 18, the readings beyond count_flops).

Before: each saved the process-wide CPU generator and set it back afterwards, so a thread
drawing meanwhile was rewound and drew the same numbers again; measuring this machine's roofs
drew its operands from the process's generator. Oracles: the neighbour's own 62-bit draws (a
repeat by chance is out of the question), the generator's state read by the test, and, alone
in the process, the caller's next draw (issue #9 finding 7, kept)."""

from __future__ import annotations

import time
from typing import Any, Iterator

import pytest
import torch
from torch import nn
from tracers.test_threads_process import Neighbour, _draw

import flopcount
from flopcount.bench import benchmark, module_latency
from flopcount.devices.roofline import Roofs

ROOFS = Roofs({"float32": 1e11}, 1e10, "test roofs", "given")


def _dropout_model() -> nn.Module:
    with torch.random.fork_rng(devices=[]):  # the test's own set-up leaves the generator as found
        torch.manual_seed(0)
        # draws in every call; big enough that the neighbour runs while the calls are timed
        return nn.Sequential(nn.Linear(256, 256), nn.Dropout(0.5), nn.Linear(256, 2)).train()


MODEL, X = _dropout_model(), torch.zeros(64, 256)


def _build() -> nn.Module:
    return nn.Sequential(nn.Linear(256, 256), nn.Dropout(0.5), nn.Linear(256, 2))  # on the meta device: draws nothing


def _draws_on(neighbour: Neighbour, more: int = 200) -> None:
    """Let the neighbour draw ``more`` numbers after the reading: a rewind shows as repeats then."""
    target, deadline = len(neighbour.results) + more, time.monotonic() + 60
    while len(neighbour.results) < target and time.monotonic() < deadline:
        time.sleep(0.001)


def _no_repeats(neighbour: Neighbour) -> None:
    draws = neighbour.results
    assert len(draws) > 1 and not neighbour.errors
    assert len(set(draws)) == len(draws), f"{len(draws) - len(set(draws))} repeated draws: the generator was rewound"


READINGS = {
    "benchmark": lambda: benchmark(MODEL, X, iters=60, warmup=2),
    "module_latency": lambda: module_latency(MODEL, X, iters=30, warmup=1),
    "profile": lambda: flopcount.profile(MODEL, X, roofs=ROOFS, warmup=2, steps=10),
    "plan": lambda: flopcount.plan(_build, (X,), fsdp=2, on=None),
}  # fmt: skip


@pytest.mark.parametrize("reading", sorted(READINGS))
def test_a_drawing_neighbour_is_never_rewound(reading: str) -> None:
    with Neighbour(_draw) as neighbour:
        READINGS[reading]()
        _draws_on(neighbour)
    _no_repeats(neighbour)


@pytest.mark.parametrize("reading", sorted(READINGS))
def test_alone_in_the_process_the_callers_next_draw_is_unchanged(reading: str) -> None:
    # no other thread can be rewound: the generator is put back, as before
    torch.manual_seed(123)
    expected = torch.rand(5)
    torch.manual_seed(123)
    READINGS[reading]()
    assert torch.equal(torch.rand(5), expected)


def _fake_clock() -> Iterator[float]:
    t = 0.0
    while True:
        t += 0.01
        yield t


def test_measuring_this_machine_draws_nothing_from_the_process_generator() -> None:
    from flopcount.devices.measured import measure_roofs

    clock = _fake_clock()
    state = torch.get_rng_state()
    roofs = measure_roofs("cpu", ["float32"], budget_s=0.05, clock=lambda: next(clock), levels=False, stream_bytes=2**16)
    assert "float32" in roofs.peak_flops  # it measured (a fake clock: the figure itself is meaningless)
    assert torch.equal(torch.get_rng_state(), state)


def test_measuring_this_machine_leaves_a_drawing_neighbour_alone() -> None:
    from flopcount.devices.measured import measure_roofs

    def measure() -> Any:
        clock = _fake_clock()
        return measure_roofs("cpu", ["float32"], budget_s=0.05, clock=lambda: next(clock), levels=False, stream_bytes=2**16)

    with Neighbour(_draw) as neighbour:
        for _ in range(3):
            measure()
            _draws_on(neighbour)
    _no_repeats(neighbour)


def test_a_notebooks_own_threads_do_not_stop_the_generator_being_set_back():
    """In a Jupyter kernel (heartbeat, IOPub, control and history threads of its own) nobody
    else draws: a benchmark there must still leave the caller's next draw as it would have been
    (issue #9's rule). Before, any second thread turned the set-back off."""
    import threading

    from flopcount.bench import benchmark

    stop = threading.Event()

    class Heartbeat(threading.Thread):  # as ipykernel.heartbeat.Heartbeat
        def run(self) -> None:
            stop.wait()

    Heartbeat.__module__ = "ipykernel.heartbeat"
    beat = Heartbeat(daemon=True)
    iopub = threading.Thread(target=stop.wait, name="IOPub", daemon=True)  # ipykernel's IOPub
    beat.start()
    iopub.start()
    try:
        model = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5)).train()
        x = torch.randn(4, 8)
        torch.manual_seed(3)
        expected = torch.rand(5)
        torch.manual_seed(3)
        benchmark(model, x, iters=3, warmup=1)
        assert torch.equal(torch.rand(5), expected)
    finally:
        stop.set()
        beat.join()
        iopub.join()


class _KeepPositiveDropout(nn.Module):
    """Reads data (``nonzero``): estimate_memory measures one real step, which draws (dropout)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 32)
        self.drop = nn.Dropout(0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        keep = torch.nonzero(x[:, 0] > 0).squeeze(1)
        return self.drop(self.lin(x.index_select(0, keep)))


def test_estimate_memorys_real_step_never_rewinds_a_neighbour():
    """Before: the fallback's real step saved the process's generator and set it back whatever
    other threads drew meanwhile (their draws repeated)."""
    model, x = _KeepPositiveDropout().train(), torch.randn(4096, 16)
    with Neighbour(_draw) as neighbour:
        for _ in range(3):
            result = flopcount.estimate_memory(model, x, backward=True)
        _draws_on(neighbour)
    assert any("nonzero" in w for w in result.warnings)  # the real step ran
    _no_repeats(neighbour)


def test_serve_refuses_tp_on_this_machine_before_measuring_it(monkeypatch):
    """Before: serve(on="this machine", tp=2) measured the machine (seconds) and then refused."""
    from flopcount.devices import measured

    def measure(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("measured the machine")

    monkeypatch.setattr(measured, "machine_roofs", measure)
    with pytest.raises(flopcount.UsageError, match="tp > 1 on this machine"):
        flopcount.serve(nn.Linear(4, 4), torch.zeros(1, 3, dtype=torch.long), 2, on="this machine", tp=2)
