"""Per-module latency through hooks: exact figures with a fake clock, parent = sum of
children when only leaves take time, shared modules, FLOP/s per module, hooks and
state restored (also when the forward raises)."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import FakeClock, assert_same_state, cuda, snapshot
from torch import nn

from flopcount.bench.modules import PERTURBATION_NOTE, module_latency
from flopcount.errors import UsageError


class Sleep(nn.Module):
    """Advances the fake clock by ``ns`` per call."""

    def __init__(self, clock: FakeClock, ns: int):
        super().__init__()
        self.clock, self.ns = clock, ns

    def forward(self, x):
        self.clock.now += self.ns
        return x


class Net(nn.Module):
    def __init__(self, clock: FakeClock):
        super().__init__()
        self.a = Sleep(clock, 1_000_000)
        self.block = nn.Sequential(Sleep(clock, 2_000_000), Sleep(clock, 3_000_000))
        self.shared = Sleep(clock, 500_000)

    def forward(self, x):
        x = self.shared(self.a(x))
        return self.shared(self.block(x))  # shared runs twice


def test_fake_clock_per_module_figures():
    clock = FakeClock()
    net = Net(clock)
    r = module_latency(net, torch.zeros(2), warmup=1, iters=4, timer=clock)
    s = r.by_module(seconds=True)
    assert s["a"] == pytest.approx(1e-3)
    assert s["block.0"] == pytest.approx(2e-3) and s["block.1"] == pytest.approx(3e-3)
    assert s["block"] == pytest.approx(5e-3)  # parent = sum of children (no own work)
    assert s["shared"] == pytest.approx(1e-3) and r["shared"].calls == 2
    assert s[""] == pytest.approx(7e-3) and r.root.calls == 1
    assert r.unhooked_median_s == pytest.approx(7e-3)
    assert r.by_module(seconds=False)[""] == pytest.approx(7.0)  # milliseconds, asked for
    assert [m.name for m in r.modules] == [n for n, _ in net.named_modules()]
    assert r["block.0"].depth == 2 and r.root.depth == 0


def test_flops_per_module_and_rendering():
    clock = FakeClock()
    net = Net(clock)
    r = module_latency(net, torch.zeros(2), warmup=0, iters=2, timer=clock, flops={"": 7e9, "a": 1e9})
    assert r.root.achieved_flops_per_s == pytest.approx(7e9 / 7e-3)
    assert r["a"].achieved_flops_per_s == pytest.approx(1e12)
    assert r["block"].flops is None and r["block"].achieved_flops_per_s is None
    text = str(r)
    assert "hooks" in text and "(model)" in text and PERTURBATION_NOTE in r.warnings
    json.dumps(r.to_dict())

    class FakeFlopResult:
        def by_module(self):
            return {"a": 2e9}

    r = module_latency(net, torch.zeros(2), warmup=0, iters=2, timer=clock, flops=FakeFlopResult())
    assert r["a"].achieved_flops_per_s == pytest.approx(2e12)


def test_real_clock_on_a_small_model_leaves_it_as_found():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 2))
    model(torch.randn(2, 3, 8, 8)).sum().backward()
    model.train()
    before = snapshot(model)
    r = module_latency(model, torch.randn(2, 3, 8, 8), warmup=1, iters=3)
    assert_same_state(model, before)
    assert all(m.median_s is not None and m.median_s >= 0 for m in r.modules)
    assert r.root.median_s >= max(m.median_s for m in r.modules if m.name)


def test_hooks_removed_when_forward_raises():
    class Boom(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(2, 2)
            self.calls = 0

        def forward(self, x):
            self.calls += 1
            if self.calls > 3:  # fails once hooks are in place
                raise RuntimeError("boom")
            return self.lin(x)

    model = Boom()
    before = snapshot(model)
    with pytest.raises(RuntimeError, match="boom"):
        module_latency(model, torch.randn(1, 2), warmup=1, iters=2)
    assert_same_state(model, before)


def test_module_latency_usage_errors():
    with pytest.raises(UsageError):
        module_latency(nn.Linear(2, 2), torch.randn(1, 2), iters=0)
    with pytest.raises(UsageError):
        module_latency(nn.Linear(2, 2), torch.randn(1, 2), flops=[1, 2])


@pytest.mark.cuda
@cuda
def test_module_latency_cuda_events():
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8)).cuda()
    r = module_latency(model, torch.randn(16, 64, device="cuda"), warmup=2, iters=5)
    assert r.timing == "cuda_event"
    assert all(m.median_s is not None and m.median_s > 0 for m in r.modules)
