"""Rebuilding a module attribute's plain containers with their items converted: one walk for
the fake copy (``fake/copies.py``: tensors faked) and the real run's twin (``_twin.py``:
modules twinned, tensors shared)."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable, Dict

__all__ = ["NOT_A_CONTAINER", "rebuilt"]

#: what :func:`rebuilt` returns for a value that is not a dict, OrderedDict, list or tuple
NOT_A_CONTAINER: Any = object()


def rebuilt(value: Any, memo: Dict[int, Any], convert: Callable[[Any], Any]) -> Any:
    """A new dict / OrderedDict / list (recorded in ``memo`` first, so a container that holds
    itself is rebuilt once) or tuple of ``convert(item)``; :data:`NOT_A_CONTAINER` otherwise."""
    kind = type(value)
    if kind is dict or kind is OrderedDict:
        new: Any = kind()
        memo[id(value)] = new
        for key, item in value.items():
            new[key] = convert(item)
        return new
    if kind is list:
        new = []
        memo[id(value)] = new
        new.extend(convert(item) for item in value)
        return new
    if kind is tuple:
        return tuple(convert(item) for item in value)
    return NOT_A_CONTAINER
