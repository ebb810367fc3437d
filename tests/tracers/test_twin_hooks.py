"""A library's stateful hook installed as an instance-level ``forward``, on the real-run path
(issue #27 item 5, branch twinhooks).

diffusers' HookRegistry (``enable_cache``: PyramidAttentionBroadcast, FasterCache,
FirstBlockCache) sets ``module.forward = functools.partial(new_forward, module)``, where
``new_forward`` is a closure over a reference object holding the module's original forward and
the hook with its state. The fake copy rebuilds that closure (tests/tracers/test_wrapped_forward.py);
the real run's private twin (``tracers/_twin.py``) shared it, so a count with tracer "dispatch",
"jit", or "auto" falling back to a real run ran the caller's module through the caller's closure
and advanced the caller's hook state: two consecutive counts differed, and the caller's next call
was not the one the count counted. The hook here is hand-written in that style (no diffusers import).
"""

from __future__ import annotations

import functools
from types import SimpleNamespace
from typing import Any, Tuple

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from flopcount import count_flops

B, IN, HIDDEN, OUT = 3, 8, 16, 4


class SkipEveryOtherCall:
    """A cache hook with state: every second call returns the output of the call before
    (diffusers' PyramidAttentionBroadcast skips attention so), counting its calls; its state
    object keeps the cached output, as diffusers' hooks keep theirs in a state object."""

    def __init__(self) -> None:
        self.state = SimpleNamespace(calls=0, cache=None)


def install(module: nn.Module, hook: SkipEveryOtherCall) -> None:
    """As diffusers' HookRegistry does: the original forward and the hook on a reference object
    only a closure holds, and ``module.forward`` a partial of that closure over the module."""
    reference = SimpleNamespace(forward=module.forward, hook=hook)

    def new_forward(module: nn.Module, *args: Any) -> Any:
        state = reference.hook.state
        state.calls += 1
        if state.calls % 2 == 0 and state.cache is not None:
            return state.cache
        out = reference.forward(*args)
        state.cache = out
        return out

    module.forward = functools.update_wrapper(functools.partial(new_forward, module), new_forward)


class DataDependent(nn.Module):
    """The hooked stack followed by ``nonzero``: the fake path gives up, "auto" runs for real."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(IN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, OUT))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.body(x)
        return y[torch.nonzero(y > 0, as_tuple=True)]


def _model(data_dependent: bool) -> Tuple[nn.Module, SkipEveryOtherCall, torch.Tensor]:
    torch.manual_seed(0)
    model = DataDependent() if data_dependent else nn.Sequential(nn.Linear(IN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, OUT))
    first = model.body[0] if isinstance(model, DataDependent) else model[0]
    hook = SkipEveryOtherCall()
    install(first, hook)
    x = torch.randn(B, IN)
    with torch.no_grad():
        model(x)  # a first step: the hook holds one call and its output
    return model, hook, x


def _live_flops(data_dependent: bool) -> int:
    """FlopCounterMode on the next call of a fresh model built as the caller's (``copy.deepcopy``
    would share the closure, a function, and advance the caller's hook): the hook's second call,
    the cached one."""
    fresh, _, x = _model(data_dependent)
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        fresh(x)
    return int(counter.get_total_flops())


@pytest.mark.parametrize(
    ("tracer", "data_dependent"),
    [("dispatch", False), ("jit", False), ("auto", True)],
    ids=["dispatch", "jit", "auto-real-run"],
)
def test_a_real_run_leaves_a_hooks_state_alone(tracer: str, data_dependent: bool) -> None:
    model, hook, x = _model(data_dependent)
    cached = hook.state.cache
    first = count_flops(model, x, tracer=tracer)
    second = count_flops(model, x, tracer=tracer)
    if tracer == "auto":
        assert any("real run" in warning for warning in first.warnings)  # the fallback this test is about
    # by hand, the caller's next call is the hook's second: the cached output, no Linear(IN, HIDDEN);
    # Linear(HIDDEN, OUT) B*HIDDEN*OUT MACs (the ReLU's FLOPs are not contractions)
    assert first.macs == second.macs == B * HIDDEN * OUT
    assert first.flops == second.flops
    assert 2 * first.macs == _live_flops(data_dependent)
    assert hook.state.calls == 1
    assert hook.state.cache is cached  # the caller's tensor, not the twin's output
    with torch.no_grad():
        model(x)
    assert hook.state.calls == 2  # the caller's model still runs its own hook


def test_the_twins_hook_state_holds_its_own_tensors() -> None:
    """A hook's cached tensor is the twin's copy: a write in place by the twin's run (a hook
    that updates its cache in place) does not land in the caller's tensor."""
    from flopcount.tracers._twin import private_twin

    model, hook, x = _model(data_dependent=False)
    cached = hook.state.cache.clone()
    made = private_twin(model)
    assert made is not None
    twin, _ = made
    reference = twin[0].forward.func.__closure__[0].cell_contents
    assert reference.hook is not hook and reference.hook.state is not hook.state
    assert reference.forward.__self__ is twin[0]
    reference.hook.state.cache.add_(1.0)
    assert torch.equal(hook.state.cache, cached)


@pytest.mark.parametrize("tracer", ["auto", "dispatch"])
@pytest.mark.parametrize("reuse", ["0", "1"])
def test_a_hook_wrapping_a_hook_keeps_both_states(monkeypatch: Any, tracer: str, reuse: str) -> None:
    """Two hooks on one module (diffusers chains them: the second's reference object holds the
    first's partial as its ``forward``), the count running both: the inner partial, reached only
    through the outer hook's reference object, is rebuilt too (by the one rule, on the fake copy
    and on the twin), so neither hook's state advances nor holds a fake."""
    monkeypatch.setenv("FLOPCOUNT_REUSE", reuse)
    model, inner, x = _model(data_dependent=False)  # the inner hook has run once
    cached = inner.state.cache
    outer = SkipEveryOtherCall()
    install(model[0], outer)
    first = count_flops(model, x, tracer=tracer)
    second = count_flops(model, x, tracer=tracer)
    # by hand, the next call: the outer hook's first runs the inner hook's second, which returns
    # its cache (no Linear(IN, HIDDEN)); Linear(HIDDEN, OUT) B*HIDDEN*OUT MACs
    assert first.macs == second.macs == B * HIDDEN * OUT
    assert (inner.state.calls, outer.state.calls) == (1, 0)
    assert inner.state.cache is cached and outer.state.cache is None
    with torch.no_grad():
        model(x)
    assert (inner.state.calls, outer.state.calls) == (2, 1)  # the caller's model still runs its own hooks


def test_estimate_memorys_real_step_leaves_a_hooks_state_alone() -> None:
    """estimate_memory's real-step fallback (``nonzero``) runs a deep copy; ``copy.deepcopy``
    shares functions, so the copy's forward was the caller's closure over the caller's module:
    the step ran the caller's module and advanced its hook. Oracle: MemTracker live on the same
    step of a model built afresh the same way (tests/test_memory.py's ``truth_peak``)."""
    pytest.importorskip("torch.distributed._tools.mem_tracker")
    from test_memory import truth_peak

    from flopcount import estimate_memory
    from flopcount.errors import FlopcountWarning

    model, hook, x = _model(data_dependent=True)
    cached = hook.state.cache
    with pytest.warns(FlopcountWarning, match="measured one real step"):
        first = estimate_memory(model, x)
    with pytest.warns(FlopcountWarning, match="measured one real step"):
        second = estimate_memory(model, x)
    assert hook.state.calls == 1 and hook.state.cache is cached
    fresh, _, fresh_x = _model(data_dependent=True)
    assert first.peak_bytes == second.peak_bytes == truth_peak(fresh, fresh_x, False, None)
    assert first.module("body.0").calls == 1
