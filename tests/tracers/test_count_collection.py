"""The cyclic garbage collector around a count's run on fake copies (issue #32's 70B count
target). Finding: a LLaMA-2-70B count on meta met a full collection of the process in 5 of 8
counts (``benchmarks/bench_reuse.py``: 0.235 s median, 0.086 s without one): the fake copy of the
model lives through the run, young collections promote it, and a full collection walks every
object of the process. The count's fake run now pauses automatic collection as the decoding
loop does (core/collection.py), collects its young garbage when it ends, and leaves the switch
as found. Oracles: gc.callbacks (which generation each collection walked, and whether automatic
collection was on), gc.isenabled() before and after."""

from __future__ import annotations

import gc
from typing import Any, Dict, Iterator, List, Tuple

import pytest
import torch
from torch import nn

import flopcount.tracers.dispatch as dispatch
from flopcount import count_flops
from flopcount.errors import TraceError


class Deep(nn.Module):
    def __init__(self, layers: int = 24) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16)) for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x) + x
        return x


class Collections:
    def __init__(self) -> None:
        self.seen: List[Tuple[int, bool, bool]] = []  # (generation, automatic collection on, inside the trace)
        self.inside = False

    def __call__(self, phase: str, info: Dict[str, Any]) -> None:
        if phase == "start":
            self.seen.append((info["generation"], gc.isenabled(), self.inside))


@pytest.fixture
def collections(monkeypatch: pytest.MonkeyPatch) -> Iterator[Collections]:
    spy = Collections()
    run = dispatch.trace

    def traced(*args: Any, **kwargs: Any) -> Any:
        spy.inside = True
        try:
            return run(*args, **kwargs)
        finally:
            spy.inside = False

    monkeypatch.setattr(dispatch, "trace", traced)
    gc.callbacks.append(spy)
    try:
        yield spy
    finally:
        gc.callbacks.remove(spy)


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_a_fake_count_walks_no_old_generation(collections: Collections, device: str) -> None:
    """Everything made before the count frozen out of the collector's reach, thresholds
    (700, 1, 1): an object promoted past one young collection starts a full one at the next.
    Before, full (generation 2) collections ran inside the count's trace; now none does, and
    the count's young garbage is collected once, by the count, before it returns."""
    with torch.device(device):
        model = Deep()
    x = torch.randn(4, 16, device=device)
    thresholds = gc.get_threshold()
    gc.collect()
    gc.freeze()
    try:
        gc.collect()
        gc.set_threshold(700, 1, 1)
        collections.seen.clear()
        result = count_flops(model, (x,))
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()
    assert [g for g, _, inside in collections.seen if inside and g == 2] == [], collections.seen
    assert [g for g, enabled, _ in collections.seen if not enabled] == [1]
    assert gc.isenabled()
    assert result.macs == 24 * 4 * 2 * 16 * 32  # 24 layers, 4 rows, two Linears of 16 x 32


def test_the_switch_is_left_as_found_also_when_the_forward_raises(collections: Collections) -> None:
    class Raises(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise ValueError("boom")

    x = torch.randn(2, 3)
    gc.disable()
    try:
        collections.seen.clear()
        count_flops(Deep(2), (torch.randn(2, 16),))
        assert not gc.isenabled() and collections.seen == []  # off as the caller left it; nothing collected
        with pytest.raises(TraceError):
            count_flops(Raises(), (x,))
        assert not gc.isenabled()
    finally:
        gc.enable()
    with pytest.raises(TraceError):
        count_flops(Raises(), (x,))
    assert gc.isenabled()


def _spied_stages(monkeypatch: pytest.MonkeyPatch) -> Dict[str, List[bool]]:
    """Whether automatic collection was on in each stage of a count around the trace."""
    import flopcount.core.analysis as analysis

    seen: Dict[str, List[bool]] = {}
    for name in ("model_facts", "cost_records", "aggregate"):
        inner = getattr(analysis, name)

        def spy(*args: Any, __inner: Any = inner, __name: str = name, **kwargs: Any) -> Any:
            seen.setdefault(__name, []).append(gc.isenabled())
            return __inner(*args, **kwargs)

        monkeypatch.setattr(analysis, name, spy)
    return seen


@pytest.mark.parametrize("training", [False, True])
def test_the_whole_count_is_paused(monkeypatch: pytest.MonkeyPatch, training: bool) -> None:
    """Finding (issue #32): the pause covered the fake run only, and a full collection landed in
    the aggregate (ResNet-50: 6.6 ms of a 29.1 ms count with the collector on, 1.3 ms off). Now
    model facts, cost and aggregate run paused too (before: collection on in each of them);
    real-run tracers leave it on. Oracle: gc.isenabled() inside each stage; the MACs by hand."""
    seen = _spied_stages(monkeypatch)
    model = Deep(3).train(training)
    thresholds = gc.get_threshold()
    result = count_flops(model, (torch.randn(4, 16),))
    assert seen == {"model_facts": [False], "cost_records": [False], "aggregate": [False]}
    assert gc.isenabled() and gc.get_threshold() == thresholds
    assert result.macs == 3 * 4 * 2 * 16 * 32  # 3 layers, 4 rows, two Linears of 16 x 32
    seen.clear()
    for tracer in ("dispatch", "jit"):
        assert count_flops(model, (torch.randn(4, 16),), tracer=tracer).macs == result.macs
    assert seen == {"model_facts": [True, True], "cost_records": [True, True], "aggregate": [True, True]}
    assert model.training is training


def test_a_real_run_inside_a_paused_count_collects() -> None:
    """A forward that needs a value is counted on one real run: its garbage may hold data, so
    automatic collection is on while it runs (off while the fakes ran), and off again after."""
    states: List[Tuple[bool, bool]] = []  # (on fakes, collection on)

    class NeedsValue(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            states.append((type(x).__name__ == "FakeTensor", gc.isenabled()))
            return self.fc(x) * float(x.sum().item() > -1e9)

    thresholds = gc.get_threshold()
    result = count_flops(NeedsValue(), (torch.randn(3, 8),))
    assert states == [(True, False), (False, True)]
    assert result.macs == 3 * 8 * 8  # one Linear 8 x 8 on 3 rows
    assert gc.isenabled() and gc.get_threshold() == thresholds


def test_thresholds_and_switch_restored_when_the_forward_raises() -> None:
    class Raises(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise ValueError("boom")

    thresholds = gc.get_threshold()
    gc.set_threshold(500, 7, 9)
    try:
        with pytest.raises(TraceError):
            count_flops(Raises(), (torch.randn(2, 3),))
        assert gc.isenabled() and gc.get_threshold() == (500, 7, 9)
    finally:
        gc.set_threshold(*thresholds)
