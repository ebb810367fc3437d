"""Autocast's casts in a jit trace, booked as the dispatch tracers book them (docs/conventions.md,
"Autocast under jit").

Autocast casts an op's arguments below the torch-function level, where torch.jit's tracer records
each cast as an ``aten::to`` node right before the op's node: the same node, schema and source
line as a ``.to(dtype)`` the user wrote in the call, so the finished graph cannot tell them apart.
The dispatch tracers book a composite (``F.linear``, ``torch.matmul``, SDPA...: the vocabulary's,
tracers/_vocabulary.py) whole at the torch-function level, above autocast: its casts are inside
the call and not booked, the composite reads its operands as passed. Other ops' casts reach them
as ``aten::_to_copy``.

While the trace runs under autocast, :class:`AutocastCasts`, a pass-through TorchFunctionMode,
marks every cast node added while one torch function runs that is not itself a conversion:
inside a composite of the vocabulary (muted: the composite reads the cast's input), elsewhere
(named ``aten::_to_copy``). A cast the user wrote is a call of its own (``Tensor.to``) and is
left as jit records it.
"""

from __future__ import annotations

from types import FunctionType
from typing import Any, Dict, Optional, Tuple

import torch
from torch.overrides import TorchFunctionMode

from flopcount.core.rebound import called_function
from flopcount.tracers._vocabulary import _any_batched, _autocast_on, _composites

__all__ = ["MARK", "MUTED", "RENAMED", "AutocastCasts", "autocast_cast", "autocast_on"]

#: the node attribute the mark is kept in (attributes survive torch's passes and graph copies)
MARK = "flopcount_autocast"
MUTED = "inside"  # a cast inside a composite: not booked, its output read as its input
RENAMED = "aten::_to_copy"  # a cast autocast added to another op: the dispatch tracers' name

_CASTS = frozenset({"aten::to", "aten::_to_copy"})

#: torch functions that are a conversion themselves: the cast node they add is the user's own
_CONVERSIONS = frozenset(
    {
        torch.Tensor.to, torch.Tensor.type, torch.Tensor.type_as, torch.Tensor.float, torch.Tensor.double,
        torch.Tensor.half, torch.Tensor.bfloat16, torch.Tensor.int, torch.Tensor.long, torch.Tensor.short,
        torch.Tensor.bool, torch.Tensor.byte, torch.Tensor.char, torch.Tensor.cpu, torch.Tensor.cuda,
    }
)  # fmt: skip


def autocast_on() -> bool:
    """True inside any ``torch.autocast`` (the dispatch tracers' own test)."""
    return _autocast_on()


def autocast_cast(node: Any) -> Optional[str]:
    """The mark :class:`AutocastCasts` left on ``node`` (MUTED or RENAMED), or None."""
    return node.s(MARK) if node.hasAttribute(MARK) else None


class AutocastCasts(TorchFunctionMode):
    """Pushed around a jit trace that starts under autocast: marks the cast nodes autocast adds
    (module docstring). Every call passes through unchanged, as the dispatch tracers' mode passes
    it (a Python function the caller rebound is called as the function it stands for)."""

    def __init__(self) -> None:
        super().__init__()
        self._composites = _composites()
        self._called: Dict[Any, Any] = {}  # core/rebound.py: a Python function handed -> what it calls

    def __torch_function__(self, func: Any, types: Any, args: Tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        if type(func) is FunctionType:
            func = self._called.get(func) or called_function(func, self._called)
        kwargs = kwargs or {}
        state = torch._C._get_tracing_state()
        if state is None or func in _CONVERSIONS or not _autocast_on():
            return func(*args, **kwargs)
        binder = self._composites.get(func)
        whole = binder is not None and not _any_batched(args, kwargs) and binder(args, kwargs) is not None
        graph = state.graph()
        point = graph.insertPoint()
        last = point.prev()
        out = func(*args, **kwargs)
        if graph.insertPoint() == point:  # else the call opened a module's block: left as recorded
            _mark_casts(point.prev(), last, MUTED if whole else RENAMED)
        return out


def _mark_casts(node: Any, stop: Any, mark: str) -> None:
    """Mark the cast nodes from ``node`` back to (not including) ``stop``: those one call added."""
    while node != stop and node.kind() != "prim::Param":
        if node.kind() in _CASTS:
            node.s_(MARK, mark)
        node = node.prev()
