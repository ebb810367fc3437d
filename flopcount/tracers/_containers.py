"""The one module-tree copier (issue #27): :class:`TreeCopier` walks the tree for the fake copy
(``fake/copies.py``: tensors faked, other objects deep-copied) and for the real run's twin
(``_twin.py``: tensors and other objects shared, what points at a module rebound to its twin)."""

from __future__ import annotations

import types
from collections import OrderedDict
from typing import Any, Callable, Dict

import torch
from torch import nn

__all__ = ["IMMUTABLE", "IMMUTABLE_TYPES", "NOT_A_CONTAINER", "TreeCopier", "fresh_uninitialized", "rebuilt"]

#: what :func:`rebuilt` returns for a value that is not a dict, OrderedDict, list or tuple
NOT_A_CONTAINER: Any = object()
#: values (and subclasses) a copy shares: they cannot change
IMMUTABLE = (int, float, complex, str, bytes, bool, type(None), torch.dtype, torch.device, torch.Size, range)
IMMUTABLE_TYPES = frozenset(IMMUTABLE)
#: plain functions, builtins and classes: shared
_FUNCTIONS = (types.FunctionType, types.BuiltinFunctionType, type)


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


def fresh_uninitialized(tensor: Any) -> Any:
    """A new uninitialised parameter or buffer of ``tensor``'s kind: a copy's lazy module is
    materialised in the copy, not in the caller's model."""
    from torch.nn.parameter import UninitializedBuffer, UninitializedParameter

    kind: Any = UninitializedBuffer if isinstance(tensor, UninitializedBuffer) else UninitializedParameter
    return kind(requires_grad=tensor.requires_grad, device=tensor.device, dtype=tensor.dtype)


class TreeCopier:
    """A copy of a module tree; ``memo``: ``id(original)`` -> its copy, so each object is converted
    once (ties and shared modules stay shared). A module becomes a new object of its class
    (``object.__new__``: a GraphModule's ``__new__`` would make a class without the generated
    forward) holding its :meth:`attributes`; immutable values, functions and classes are shared,
    plain containers rebuilt, tensors given to :meth:`tensor`, anything else to :meth:`other`."""

    def __init__(self, memo: Dict[int, Any]):
        self.memo = memo

    def module(self, module: nn.Module) -> nn.Module:
        found = self.memo.get(id(module))
        if found is not None:
            return found
        kind = type(module)
        try:
            new = object.__new__(kind)
        except TypeError:  # a module that also subclasses a builtin container
            new = kind.__new__(kind)
        self.memo[id(module)] = new
        # one item at a time, in the original's order: the copy's __dict__ then shares its keys
        # with the class's other instances as the original's does (CPython's split dictionaries:
        # half the size of the combined one ``update`` makes; issue #32, a deep model's copy)
        self.fill(module, new.__dict__)
        return new

    def fill(self, module: nn.Module, state: Dict[str, Any]) -> None:
        """The copy's ``__dict__`` (``state``, empty): each attribute converted, written one item at
        a time in the original's order, straight into it (no dictionary made in between)."""
        convert = self.value
        for key, value in vars(module).items():
            state[key] = convert(value)

    def value(self, value: Any) -> Any:
        kind = type(value)
        if kind in IMMUTABLE_TYPES or isinstance(value, IMMUTABLE) or isinstance(value, _FUNCTIONS):
            return value
        found = self.memo.get(id(value))
        if found is not None:
            return found
        if isinstance(value, nn.Module):
            return self.module(value)
        if isinstance(value, torch.Tensor):
            return self.tensor(value)
        container = rebuilt(value, self.memo, self.value)
        if container is not NOT_A_CONTAINER:
            return container
        return self.other(value)

    def tensor(self, value: torch.Tensor) -> Any:
        """A tensor not converted beforehand (one held in a container, a plain attribute)."""
        raise NotImplementedError

    def other(self, value: Any) -> Any:
        """Any other object: a set, a config, a bound method, a KV cache..."""
        raise NotImplementedError
