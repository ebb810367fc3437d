"""The one handler registry: aten op name -> handler, known zero, or unknown.

Keys are canonical op names such as ``"aten::addmm"``. An in-place spelling
(``"aten::add_"``) resolves to its out-of-place handler when it has none of its own.
This module imports no handler: ``flopcount.handlers`` builds and owns the default registry.
"""

from __future__ import annotations

from typing import Callable, Dict, Iterable, Iterator, Mapping, Optional, Set, Union, overload

from flopcount.errors import DuplicateHandlerError, UsageError
from flopcount.types import Handler, out_of_place

#: Returned by :meth:`HandlerRegistry.resolve` for ops that do no arithmetic.
KNOWN_ZERO = "known-zero"

Resolved = Union[Handler, str, None]

#: One op name, or several that share a handler.
OpNames = Union[str, Iterable[str]]


def _check_name(op: str) -> str:
    if not isinstance(op, str) or "::" not in op:
        raise UsageError(f"op names look like 'aten::addmm' or 'mylib::op', got {op!r}")
    return op


class HandlerRegistry:
    """Maps op names to cost handlers; a copy can be changed without touching the original."""

    def __init__(self) -> None:
        self._handlers: Dict[str, Handler] = {}
        self._zero: Set[str] = set()

    # -- building ---------------------------------------------------------------
    @overload
    def register(self, op: OpNames, handler: Handler, *, replace: bool = ...) -> Handler: ...

    @overload
    def register(self, op: OpNames, handler: None = ..., *, replace: bool = ...) -> Callable[[Handler], Handler]: ...

    def register(
        self, op: OpNames, handler: Optional[Handler] = None, *, replace: bool = False
    ) -> Union[Handler, Callable[[Handler], Handler]]:
        """Register ``handler`` for ``op`` (usable as a decorator). Registering an op
        twice is an error unless ``replace=True``."""
        names = (op,) if isinstance(op, str) else tuple(op)

        def add(fn: Handler) -> Handler:
            if not callable(fn):
                raise UsageError(f"handler for {names} must be callable, got {fn!r}")
            for name in names:
                _check_name(name)
                if not replace and (name in self._handlers or name in self._zero):
                    raise DuplicateHandlerError(f"a handler for {name!r} is already registered; pass replace=True")
                self._zero.discard(name)
                self._handlers[name] = fn
            return fn

        return add if handler is None else add(handler)

    def register_zero(self, ops: Iterable[str], *, replace: bool = False) -> None:
        """Declare ops that do no floating-point arithmetic (views, copies, indexing...)."""
        for name in ops:
            _check_name(name)
            if not replace and (name in self._handlers or name in self._zero):
                raise DuplicateHandlerError(f"{name!r} is already registered")
            self._handlers.pop(name, None)
            self._zero.add(name)

    def copy(self) -> HandlerRegistry:
        new = HandlerRegistry()
        new._handlers = dict(self._handlers)
        new._zero = set(self._zero)
        return new

    def with_overrides(self, handlers: Mapping[str, Optional[Handler]]) -> HandlerRegistry:
        """A copy where each ``op -> handler`` replaces the default (``None`` = known zero)."""
        new = self.copy()
        for name, fn in handlers.items():
            if fn is None:
                new.register_zero([name], replace=True)
            else:
                new.register(name, fn, replace=True)
        return new

    # -- lookup -----------------------------------------------------------------
    def resolve(self, op: str) -> Resolved:
        """The handler for ``op``, :data:`KNOWN_ZERO`, or ``None`` when unknown."""
        for name in _spellings(op):
            fn = self._handlers.get(name)
            if fn is not None:
                return fn
            if name in self._zero:
                return KNOWN_ZERO
        return None

    def __contains__(self, op: object) -> bool:
        return isinstance(op, str) and self.resolve(op) is not None

    def ops(self) -> Dict[str, str]:
        """Every registered op and what it resolves to ("handler" or "zero")."""
        return dict(sorted({**dict.fromkeys(self._handlers, "handler"), **dict.fromkeys(self._zero, "zero")}.items()))


def _spellings(op: str) -> Iterator[str]:
    yield op
    base = out_of_place(op)
    if base != op and "::" in op:
        yield base
