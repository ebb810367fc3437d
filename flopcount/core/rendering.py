"""Where readings meet their renderers, without importing them.

A reading (``FlopResult``, ``MemoryEstimate``...) holds data; its ``table()`` / ``to_dict()``
/ ``__str__`` call :func:`render`, which finds the function that ``flopcount.report``
registered for that reading and form with :func:`renders`. The dependency points from both
sides into this module (readings -> rendering <- report): a reading module never imports
``flopcount.report``, not even for types, and ``report`` imports the readings only for types.

The table is filled when ``flopcount.report`` is imported: its ``__init__`` imports every
renderer module. :func:`render` imports it on the first miss, so ``import flopcount`` and a
count stay free of tabulate and the renderers until something is rendered. Like the default
handler registry, the table changes only by registration at import time.
"""

from __future__ import annotations

import importlib
import json
from typing import Any, Callable, Dict, Optional, Tuple, TypeVar

__all__ = ["Rendered", "RendererError", "render", "renderer", "renders"]

#: the package whose import registers every renderer
REPORT_PACKAGE = "flopcount.report"

F = TypeVar("F", bound=Callable[..., Any])

# (reading class name, form) -> renderer; filled by @renders while flopcount.report imports
_RENDERERS: Dict[Tuple[str, str], Callable[..., Any]] = {}


class RendererError(RuntimeError):
    """A reading has no renderer for a form, or two renderers claim one: a bug in flopcount,
    not in the user's input (deliberately not a ``FlopcountError``, which the CLI reads as
    bad input: this one is reported as an internal error)."""


def renders(reading: str, form: str) -> Callable[[F], F]:
    """Register the decorated function as the renderer of ``form`` for the reading class
    named ``reading`` (and its subclasses); the function is returned unchanged."""

    def register(function: F) -> F:
        key = (reading, form)
        existing = _RENDERERS.get(key)
        if existing is not None and existing is not function:
            raise RendererError(
                f"two renderers for {reading}.{form}: {_name(existing)} and {_name(function)}"
            )
        _RENDERERS[key] = function
        return function

    return register


def renderer(reading: Any, form: str) -> Callable[..., Any]:
    """The function that renders ``reading`` as ``form``: the first registered along the
    reading's class hierarchy; ``flopcount.report`` is imported on the first miss."""
    found = _lookup(type(reading), form)
    if found is None:
        importlib.import_module(REPORT_PACKAGE)
        found = _lookup(type(reading), form)
    if found is None:
        known = sorted(f for (name, f) in _RENDERERS if name == type(reading).__name__)
        raise RendererError(
            f"internal error: no renderer for {type(reading).__name__} as {form!r} "
            f"(registered forms: {', '.join(known) or 'none'}; renderers register in {REPORT_PACKAGE})"
        )
    return found


def render(reading: Any, form: str, **options: Any) -> Any:
    """``reading`` rendered as ``form`` (``"table"``, ``"dict"``, ``"csv"``...) with the
    renderer's keyword ``options``."""
    return renderer(reading, form)(reading, **options)


def _lookup(cls: type, form: str) -> Optional[Callable[..., Any]]:
    for klass in cls.__mro__:
        found = _RENDERERS.get((klass.__name__, form))
        if found is not None:
            return found
    return None


def _name(function: Callable[..., Any]) -> str:
    return f"{getattr(function, '__module__', '?')}.{getattr(function, '__qualname__', function)!s}"


class Rendered:
    """The forms every reading offers, through :func:`render`: ``table()`` (also ``str()``),
    ``to_dict()`` and ``to_json()``. A reading whose table takes options defines its own."""

    def table(self) -> str:
        return str(render(self, "table"))

    def to_dict(self) -> Dict[str, Any]:
        return dict(render(self, "dict"))

    def to_json(self, indent: Optional[int] = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def __str__(self) -> str:
        return self.table()
