"""A pytest plugin that plants one mutant in the handler registry (used by mutation_check.py).

``FLOPCOUNT_MUTANT="OP[,OP...]:KIND"`` wraps the handler every registry resolves for those op
names (overloads and in-place spellings included) so that it returns a changed cost:
``plus1`` adds one FLOP per call, ``double`` doubles the cost (MACs and FLOPs, every part of a
split cost). Loaded with ``-p _mutant`` and ``benchmarks/`` on ``PYTHONPATH``; without the
variable it does nothing. It patches ``HandlerRegistry.resolve`` in the test process only.
"""

from __future__ import annotations

import os
from typing import Callable, FrozenSet

from flopcount.core.registry import HandlerRegistry
from flopcount.types import Cost, OpCall

KINDS = ("plus1", "double")


def _base(op: str) -> str:
    """``aten::add_.Tensor`` -> ``aten::add``."""
    name = op.split(".", 1)[0]
    return name[:-1] if name.endswith("_") and not name.endswith("__") else name


def mutate(cost: Cost, kind: str) -> Cost:
    """The changed cost: one FLOP more (on the first part of a split cost), or twice the cost."""
    if kind == "plus1":
        if cost.parts:
            (name, first), *rest = cost.parts
            return Cost.split((name, first + Cost.from_flops(1)), *rest)
        return cost + Cost.from_flops(1)
    if kind == "double":
        if cost.parts:
            return Cost.split(*((name, part + part) for name, part in cost.parts))
        return cost + cost
    raise ValueError(f"unknown mutation kind {kind!r}; use one of {KINDS}")


def _wrap(handler: Callable[[OpCall], Cost], kind: str) -> Callable[[OpCall], Cost]:
    def mutant(call: OpCall) -> Cost:
        return mutate(handler(call), kind)

    return mutant


def install(ops: FrozenSet[str], kind: str) -> None:
    original = HandlerRegistry.resolve
    targets = frozenset(_base(op) for op in ops)

    def resolve(self: HandlerRegistry, op: str):  # type: ignore[no-untyped-def]
        found = original(self, op)
        if callable(found) and _base(op) in targets:
            return _wrap(found, kind)
        return found

    HandlerRegistry.resolve = resolve  # type: ignore[method-assign]


_SPEC = os.environ.get("FLOPCOUNT_MUTANT")
if _SPEC:
    _ops, _, _kind = _SPEC.rpartition(":")
    install(frozenset(_ops.split(",")), _kind)
