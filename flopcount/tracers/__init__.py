"""Tracers: run a model once and return a :class:`flopcount.types.Trace` of op events.

Tracers know nothing about costs. ``jit`` uses torch.jit tracing; ``dispatch`` uses a
TorchDispatchMode; :func:`trace` picks one (``tracer="auto"``) and says why in the
trace's warnings when it falls back.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any, Callable, Mapping, Optional, Protocol

from torch import nn

from ..errors import TraceError, UsageError
from ..inputs import as_call_args, flatten_tensors, is_dataless
from ..types import TRACERS, Trace

__all__ = ["TRACERS", "LossFn", "Tracer", "trace"]

LossFn = Callable[[Any], Any]


class Tracer(Protocol):
    """What a tracer module provides: run the model once, return its op events."""

    def __call__(self, model: nn.Module, inputs: Any = (), kwargs: Optional[Mapping[str, Any]] = None) -> Trace: ...


# jit records a custom torch.autograd.Function as one opaque node, and a scripted function
# it could not inline (control flow in the callee) as a call; dispatch sees their aten ops.
_OPAQUE_TO_JIT = frozenset({"prim::PythonOp", "prim::CallFunction"})


def trace(
    model: nn.Module,
    inputs: Any = (),
    kwargs: Optional[Mapping[str, Any]] = None,
    *,
    tracer: str = "auto",
    backward: bool = False,
    loss_fn: Optional[LossFn] = None,
) -> Trace:
    """Run ``model`` once with the chosen tracer. "auto" uses jit unless it cannot serve
    the request or fails, then the dispatch tracer; the reason is kept in the warnings."""
    from . import dispatch, jit

    if tracer not in TRACERS:
        raise UsageError(f"tracer must be one of {', '.join(TRACERS)}; got {tracer!r}")
    if tracer == "jit":
        if backward:
            raise UsageError("backward=True needs tracer='dispatch' (or 'auto'); torch.jit cannot see backward")
        return jit.trace(model, inputs, kwargs)
    if tracer == "dispatch":
        return dispatch.trace(model, inputs, kwargs, backward=backward, loss_fn=loss_fn)
    reason = _jit_unsuitable(model, inputs, kwargs, backward)
    if reason is None:
        try:
            jit_trace = jit.trace(model, inputs, kwargs, stop_on_value_read=True)
        except jit.ValueReadError as exc:
            # jit drops ops whose results only steered Python (an if/while on a tensor,
            # .tolist() routing), so its count would miss them; it stopped at the first read.
            reason = f"{exc} (data-dependent control flow jit cannot trace)"
        except TraceError as exc:
            reason = f"jit could not trace the model ({exc})"
        else:
            opaque = sorted({e.call.op for e in jit_trace.events if e.call.op in _OPAQUE_TO_JIT})
            if not opaque:
                return jit_trace
            reason = f"jit cannot see inside {', '.join(opaque)} (custom autograd Functions, scripted calls)"
    fallback = dispatch.trace(model, inputs, kwargs, backward=backward, loss_fn=loss_fn)
    return dataclasses.replace(fallback, warnings=(f"tracer auto: used dispatch because {reason}",) + fallback.warnings)


def _jit_unsuitable(model: nn.Module, inputs: Any, kwargs: Optional[Mapping[str, Any]], backward: bool) -> Optional[str]:
    from . import jit

    if backward:
        return "backward=True"
    if not jit.is_available():
        return "torch.jit is not available"
    tensors, _ = flatten_tensors(as_call_args(inputs, kwargs))
    for tensor in itertools.chain(tensors, model.parameters(), model.buffers()):
        if is_dataless(tensor):
            kind = "on the meta device" if tensor.device.type == "meta" else "FakeTensors"
            return f"inputs or weights are {kind}"
    return None
