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
marks the cast nodes added while a composite of the vocabulary runs (muted: the composite reads
the cast's input) and those of a conversion the user called (``Tensor.to``, ``.float()``...: left
as jit records them). Every other cast that changes the dtype was added below Python to another
op (a convolution's, ``addmm``'s) and is named ``aten::_to_copy``, as the dispatch tracers see it.
"""

from __future__ import annotations

from types import FunctionType
from typing import Any, Dict, Optional, Tuple

import torch
from torch.overrides import TorchFunctionMode

from flopcount.core.rebound import called_function
from flopcount.tracers._vocabulary import _any_batched, _autocast_on, _composites

__all__ = ["CASTS", "MARK", "MUTED", "RENAMED", "USER", "AutocastCasts", "autocast_cast", "autocast_on"]

#: the node attribute the mark is kept in (attributes survive torch's passes and graph copies)
MARK = "flopcount_autocast"
MUTED = "inside"  # a cast inside a composite: not booked, its output read as its input
USER = "user"  # the user's own conversion (``x.to(torch.bfloat16)``): as jit records it
#: what the dispatch tracers call a cast that changes the dtype (autocast's, below Python)
RENAMED = "aten::_to_copy"

CASTS = frozenset({"aten::to", "aten::_to_copy"})

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
    """The mark :class:`AutocastCasts` left on ``node`` (MUTED or USER), or None."""
    return node.s(MARK) if node.hasAttribute(MARK) else None


class AutocastCasts(TorchFunctionMode):
    """Pushed around a jit trace that starts under autocast: marks the cast nodes a composite's call
    adds (MUTED) and those of the user's own conversions (USER); every other cast the trace holds
    then is one a torch function added below Python, named as the dispatch tracers name it
    (module docstring). Every call passes through unchanged, as the dispatch tracers' mode passes
    it (a Python function the caller rebound is called as the function it stands for); a call that
    is neither touches no graph."""

    def __init__(self) -> None:
        super().__init__()
        self._composites = _composites()
        self._called: Dict[Any, Any] = {}  # core/rebound.py: a Python function handed -> what it calls

    def __torch_function__(self, func: Any, types: Any, args: Tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        if type(func) is FunctionType:
            func = self._called.get(func) or called_function(func, self._called)
        kwargs = kwargs or {}
        binder = self._composites.get(func)
        if binder is not None:
            mark = MUTED if not _any_batched(args, kwargs) and binder(args, kwargs) is not None else None
        else:
            mark = USER if func in _CONVERSIONS else None
        state = torch._C._get_tracing_state() if mark is not None else None
        if mark is None or state is None:
            return func(*args, **kwargs)
        graph = state.graph()
        point = graph.insertPoint()
        last = point.prev()
        out = func(*args, **kwargs)
        if graph.insertPoint() == point:  # else the call opened a module's block: left as recorded
            _mark_casts(point.prev(), last, mark)
        return out


def _mark_casts(node: Any, stop: Any, mark: str) -> None:
    """Mark the cast nodes from ``node`` back to (not including) ``stop``: those one call added."""
    while node != stop and node.kind() != "prim::Param":
        if node.kind() in CASTS:
            node.s_(MARK, mark)
        node = node.prev()
