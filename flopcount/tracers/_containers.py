"""The one module-tree copier (issue #27): :class:`TreeCopier` walks the tree for the fake copy
(``fake/copies.py``: tensors faked, other objects deep-copied) and for the real run's twin
(``_twin.py``: tensors and other objects shared, what points at a module rebound to its twin), and
for a real deep copy (:func:`deep_copied`: ``copy.deepcopy``'s rules). All three copy a library's
hook wrapper installed as an instance-level ``forward`` by the one rule here,
:meth:`TreeCopier.own_forward` with :meth:`TreeCopier.hook_part`."""

from __future__ import annotations

import copy
import functools
import types
from collections import OrderedDict
from typing import Any, Callable, Dict

import torch
from torch import nn

__all__ = [
    "IMMUTABLE", "IMMUTABLE_TYPES", "NOT_A_CONTAINER", "TreeCopier", "deep_copied", "fresh_uninitialized", "rebuilt",
]

#: what :func:`rebuilt` returns for a value that is not a dict, OrderedDict, list or tuple
NOT_A_CONTAINER: Any = object()
#: values (and subclasses) a copy shares: they cannot change
IMMUTABLE = (int, float, complex, str, bytes, bool, type(None), torch.dtype, torch.device, torch.Size, range)
IMMUTABLE_TYPES = frozenset(IMMUTABLE)
#: plain functions, builtins and classes: shared
_FUNCTIONS = (types.FunctionType, types.BuiltinFunctionType, type)
#: what every copy shares as it is: immutable values, functions, classes
_SHARED = IMMUTABLE + _FUNCTIONS


def _plain_object(value: Any) -> bool:
    """Whether ``value`` is a plain Python object, all of its state in its ``__dict__``: a
    ``SimpleNamespace``, or an instance of a class that defines no pickling or copying methods
    of its own and no slots (``copy.copy`` then makes a new one with the same attributes)."""
    kind = type(value)
    if kind is types.SimpleNamespace:
        return True
    if not hasattr(value, "__dict__") or any("__slots__" in vars(base) for base in kind.__mro__):
        return False
    return (
        kind.__reduce_ex__ is object.__reduce_ex__
        and kind.__reduce__ is object.__reduce__
        and kind.__getstate__ is object.__getstate__
        and getattr(kind, "__setstate__", None) is None
        and getattr(kind, "__copy__", None) is None
        and getattr(kind, "__deepcopy__", None) is None
    )


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
            state[key] = self.own_forward(value) if key == "forward" else convert(value)

    def value(self, value: Any) -> Any:
        if type(value) in IMMUTABLE_TYPES or isinstance(value, _SHARED):
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

    def own_forward(self, value: Any) -> Any:
        """The copy of an instance-level ``forward``. A library that hooks a module installs
        ``functools.partial(new_forward, module)`` (diffusers' HookRegistry, accelerate), and
        diffusers' ``new_forward`` is a closure over a reference object holding the module's
        original forward and the hook with its state. Such a partial is rebuilt from its parts,
        its function given closure cells of its own; each cell's contents and each of the
        partial's parts is converted by :meth:`hook_part` (the caller's module becomes its copy,
        the hook and its state the copy's own), so the copy's forward runs the copy and writes the
        copy's hook state (issue #27 item 5: a count advanced the caller's hook state). A hook
        wrapping another hook holds the inner partial in its reference object: :meth:`hook_part`
        meets it there and rebuilds it by this rule too. Any other
        forward is converted as an attribute is (a plain function, a decorator's closure such as
        an exported module's guard function, stays shared)."""
        if type(value) is not functools.partial:
            return self.value(value)
        found = self.memo.get(id(value))
        if found is not None:
            return found
        func = value.func
        if type(func) is types.FunctionType and func.__closure__:
            func = self._own_closure(func)
        else:
            func = self.hook_part(func)
        made = functools.partial(
            func, *[self.hook_part(arg) for arg in value.args], **{name: self.hook_part(arg) for name, arg in value.keywords.items()}
        )
        for name, item in vars(value).items():  # update_wrapper's names (``__wrapped__``: the function's copy if made)
            copied = self.memo.get(id(item))
            made.__dict__[name] = copied if copied is not None else self.value(item)
        self.memo[id(value)] = made
        return made

    def _own_closure(self, function: types.FunctionType) -> types.FunctionType:
        """``function`` with closure cells of its own, each cell's contents converted by :meth:`hook_part`."""
        cells = []
        for cell in function.__closure__ or ():
            try:
                contents = cell.cell_contents
            except ValueError:  # a cell not yet filled
                cells.append(types.CellType())
                continue
            cells.append(types.CellType(self.hook_part(contents)))
        made = types.FunctionType(function.__code__, function.__globals__, function.__name__, function.__defaults__, tuple(cells))
        made.__kwdefaults__ = function.__kwdefaults__
        made.__qualname__ = function.__qualname__
        made.__dict__.update(vars(function))
        self.memo[id(function)] = made
        return made

    def hook_part(self, value: Any) -> Any:
        """What a hook wrapper's closure cell or partial argument holds, made the copy's own: a
        deep copy (not shallow: diffusers keeps the state three objects down, the reference object
        -> the hook -> its state, and every level is written or read through the one above it),
        taken apart here so that what it meets is converted by the copier's rules: a module
        becomes its copy, a function or immutable value is shared, a container is rebuilt, a bound
        method is bound to its object's copy, a ``functools.partial`` is rebuilt by
        :meth:`own_forward` (a hook wrapping another hook: the inner closure is the copy's too), a
        tensor goes to :meth:`hook_tensor`, and a plain Python object (its attributes all its state:
        a hook, its state, the reference object) becomes a new object of its class holding its
        attributes so converted. Any other object (one with pickling methods of its own, slots, a
        lock) goes to :meth:`other`, as an attribute would."""
        if isinstance(value, _SHARED):
            return value
        found = self.memo.get(id(value))
        if found is not None:
            return found
        if isinstance(value, nn.Module):
            return self.module(value)
        if isinstance(value, torch.Tensor):
            return self.hook_tensor(value)
        container = rebuilt(value, self.memo, self.hook_part)
        if container is not NOT_A_CONTAINER:
            return container
        if type(value) is functools.partial:
            return self.own_forward(value)
        if isinstance(value, types.MethodType):
            return types.MethodType(value.__func__, self.hook_part(value.__self__))
        if not _plain_object(value):
            return self.other(value)
        made = copy.copy(value)
        self.memo[id(value)] = made  # first: the hook's state may point back at the hook
        state = vars(made)
        for key, item in list(state.items()):
            state[key] = self.hook_part(item)
        return made

    def hook_tensor(self, value: torch.Tensor) -> Any:
        """A tensor a hook's objects hold (its cached output), not converted beforehand: as
        :meth:`tensor` unless the copier says otherwise."""
        return self.tensor(value)

    def tensor(self, value: torch.Tensor) -> Any:
        """A tensor not converted beforehand (one held in a container, a plain attribute)."""
        raise NotImplementedError

    def other(self, value: Any) -> Any:
        """Any other object: a set, a config, a bound method, a KV cache..."""
        raise NotImplementedError


class _DeepCopier(TreeCopier):
    """:func:`deep_copied`'s policy: tensors and other objects as ``copy.deepcopy`` copies them."""

    def tensor(self, value: torch.Tensor) -> Any:
        return copy.deepcopy(value, self.memo)

    def other(self, value: Any) -> Any:
        return copy.deepcopy(value, self.memo)


def deep_copied(model: nn.Module, memo: Dict[int, Any]) -> nn.Module:
    """``copy.deepcopy(model, memo)`` (what ``memo`` holds beforehand is used as it is, and
    afterwards it maps each original to its copy), except that a library's hook wrapper installed
    as an instance-level ``forward`` is the copy's own (:meth:`TreeCopier.own_forward`):
    ``copy.deepcopy`` shares functions, closures included, so the copy of diffusers' partial ran
    the caller's module through the caller's closure and advanced the caller's hook state."""
    return _DeepCopier(memo).module(model)
