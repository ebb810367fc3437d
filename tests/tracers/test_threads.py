"""Two threads counting at once do not disturb each other (#19): module hooks answer only
the tracing thread, jit's process-wide tracing state is taken in turns."""

from __future__ import annotations

import threading

import pytest
import torch
from torch import nn

from flopcount import count_flops


def _mlp(width: int) -> nn.Module:
    return nn.Sequential(nn.Linear(32, width), nn.ReLU(), nn.Linear(width, 32), nn.Sequential(nn.Linear(32, 8)))


@pytest.mark.parametrize("tracer", ["auto", "dispatch", "jit"])
def test_concurrent_counts_equal_the_hand_formula(tracer):
    widths = [64, 128, 64, 256]
    models = [_mlp(w).eval() for w in widths]
    x = torch.randn(3, 32)
    results = [None] * len(models)
    errors = []

    def count(i):
        try:
            for _ in range(3):
                results[i] = count_flops(models[i], x, tracer=tracer)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=count, args=(i,)) for i in range(len(models))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for width, result in zip(widths, results):
        per_row = 32 * width + width * 32 + 32 * 8  # Linear MACs per row, by hand
        assert result.macs == 3 * per_row
        assert result.by_module("macs") == {"": 3 * per_row, "0": 3 * 32 * width, "1": 0, "2": 3 * width * 32,
                                            "3": 3 * 32 * 8, "3.0": 3 * 32 * 8}
        assert result.module_totals("1").count == 1  # the ReLU ran once per count, in its own thread


@pytest.mark.parametrize("tracer", ["dispatch", "jit"])
def test_a_model_served_in_another_thread_is_not_booked(tracer):
    """The same model object runs plain inference in a second thread while it is counted:
    those calls are not the count's (they used to push onto the count's module stack)."""
    model = _mlp(64).eval()
    x = torch.randn(3, 32)
    stop = threading.Event()

    def serve():
        with torch.no_grad():
            while not stop.is_set():
                model(x)

    server = threading.Thread(target=serve)
    server.start()
    try:
        results = [count_flops(model, x, tracer=tracer) for _ in range(5)]
    finally:
        stop.set()
        server.join()
    per_row = 32 * 64 + 64 * 32 + 32 * 8
    for result in results:
        assert result.macs == 3 * per_row
        assert {m.name: m.calls for m in result.modules} == {"": 1, "0": 1, "1": 1, "2": 1, "3": 1, "3.0": 1}
