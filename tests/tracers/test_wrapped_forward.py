"""A library's stateful hook installed as an instance-level ``forward`` (branch diffreuse).

diffusers' cache hooks (``enable_cache`` with PyramidAttentionBroadcast, FasterCache,
FirstBlockCache), its layerwise casting and offloading install ``module.forward =
functools.partial(new_forward, module)``, where ``new_forward`` is a closure over a reference
object holding the module's original bound ``forward`` and the hook (with its state: a call
counter, the cached output). Found by benchmarks/zoo_reuse_wild.py on FLUX and CogVideoX with
PyramidAttentionBroadcast: the fake copy rebuilt the partial but shared the closure, so the
copy's forward ran the caller's module and advanced the caller's hook state (a count changed
the next count: 1,645,142 then 2,630,462 FLOPs), and left fake tensors in its cache.
"""

from __future__ import annotations

import functools
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn

from flopcount import count_flops

B, IN, HIDDEN, OUT = 3, 8, 16, 4


class SkipEveryOtherCall:
    """A cache hook: every second call returns the output of the call before (diffusers'
    PyramidAttentionBroadcast skips attention so), counting its calls."""

    def __init__(self) -> None:
        self.calls = 0
        self.cache: Any = None


def install(module: nn.Module, hook: SkipEveryOtherCall) -> None:
    """As diffusers' HookRegistry does: the original forward and the hook on a reference object
    that only a closure holds, and ``module.forward`` a partial of that closure."""
    reference = SimpleNamespace(forward=module.forward, hook=hook)

    def new_forward(module: nn.Module, *args: Any) -> Any:
        reference.hook.calls += 1
        if reference.hook.calls % 2 == 0 and reference.hook.cache is not None:
            return reference.hook.cache
        out = reference.forward(*args)
        reference.hook.cache = out
        return out

    module.forward = functools.update_wrapper(functools.partial(new_forward, module), new_forward)


def _model() -> Any:
    model = nn.Sequential(nn.Linear(IN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, OUT))
    hook = SkipEveryOtherCall()
    install(model[0], hook)
    x = torch.randn(B, IN)
    with torch.no_grad():
        model(x)  # a first step: the hook holds one call and its output
    return model, hook, x


@pytest.mark.parametrize("reuse", ["0", "1"])
def test_a_count_leaves_a_hooks_state_alone_and_counts_the_next_call(monkeypatch: Any, reuse: str) -> None:
    monkeypatch.setenv("FLOPCOUNT_REUSE", reuse)
    model, hook, x = _model()
    cached = hook.cache
    first = count_flops(model, x)
    second = count_flops(model, x)
    # by hand, the next real call (the hook's second: the cached output, no Linear(IN, HIDDEN)):
    # ReLU B*HIDDEN FLOPs, Linear(HIDDEN, OUT) B*HIDDEN*OUT MACs
    assert first.macs == second.macs == B * HIDDEN * OUT
    assert first.flops == second.flops == B * HIDDEN + 2 * B * HIDDEN * OUT
    assert hook.calls == 1
    assert hook.cache is cached  # the caller's tensor, not a fake the count left there
    with torch.no_grad():
        model(x)
    assert hook.calls == 2  # the caller's model still runs its own hook
