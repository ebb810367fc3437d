"""The timed real runs (``benchmark``, ``module_latency``, ``profile``) leave the caller's model
where it was: they run its private twin (issue #27 item 5).

Before, they ran the caller's module objects: a forward's own bookkeeping (``self.calls += 1``)
and a library's stateful hook installed as an instance-level ``forward`` (diffusers'
``enable_cache`` hooks, which skip attention by iteration, written here in that style as in
tests/tracers/test_twin_hooks.py) were advanced once per warm-up and timed run, so the caller's
next call was not the one it would have made. The oracle is the state as found before the call,
and the caller's next output: the hook's second call, which returns its cache.
"""

from __future__ import annotations

from typing import Any, Callable

import pytest
import torch
from torch import nn
from tracers.test_twin_hooks import SkipEveryOtherCall, install

import flopcount
from flopcount import Roofs
from flopcount.bench import benchmark

ROOFS = Roofs({"float32": 1e11}, 1e10, "test roofs", "given")


class Counting(nn.Module):
    """A block that keeps its own count of forwards (an attribute, not a buffer)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.lin(x)


def _timed(name: str) -> Callable[[nn.Module, torch.Tensor], Any]:
    runs = {
        "benchmark": lambda model, x: benchmark(model, x, warmup=2, iters=3),
        "module_latency": lambda model, x: flopcount.module_latency(model, x, warmup=2, iters=3),
        "profile": lambda model, x: flopcount.profile(model, x, roofs=ROOFS, warmup=1, steps=2),
    }
    return runs[name]


READINGS = ("benchmark", "module_latency", "profile")


@pytest.mark.parametrize("reading", READINGS)
def test_a_forwards_own_counter_is_left_as_found(reading):
    torch.manual_seed(0)
    model = nn.Sequential(Counting(), nn.ReLU(), Counting())
    x = torch.randn(2, 8)
    _timed(reading)(model, x)
    assert [model[0].calls, model[2].calls] == [0, 0]


@pytest.mark.parametrize("reading", READINGS)
def test_a_stateful_hook_wrapper_is_left_as_found(reading):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    hook = SkipEveryOtherCall()
    install(model[0], hook)
    x = torch.randn(3, 8)
    with torch.no_grad():
        model(x)  # one step taken: the next call is the hook's second, which returns its cache
    cached = hook.state.cache
    _timed(reading)(model, x)
    assert hook.state.calls == 1 and hook.state.cache is cached
    with torch.no_grad():
        expected = model[2](model[1](cached))  # the hook's second call returns its cache
        assert torch.equal(model(x), expected)


def test_module_latency_names_the_twins_modules_as_the_models():
    torch.manual_seed(0)
    model = nn.Sequential(Counting(), nn.ReLU(), Counting())
    result = flopcount.module_latency(model, torch.randn(2, 8), warmup=0, iters=2)
    assert [row.name for row in result.modules] == [name for name, _ in model.named_modules()]
    assert all(row.calls == 1 for row in result.modules)


def test_a_model_with_a_compiled_part_is_timed_as_it_is():
    """What is timed is the compiled code: a twin would run the compiled part eagerly (as a
    count's copies do), so a model with one is run as it is, its forward's bookkeeping the
    caller's (here: warm-up 1 + 2 timed calls)."""
    torch.manual_seed(0)
    model = nn.Sequential(Counting(), nn.ReLU(), Counting())
    model[0].compile()
    benchmark(model, torch.randn(2, 8), warmup=1, iters=2)
    assert [model[0].calls, model[2].calls] == [3, 3]
