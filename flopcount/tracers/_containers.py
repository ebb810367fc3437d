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
from typing import Any, Callable, Dict, Iterable

import torch
from torch import nn

__all__ = [
    "COMPILE_WRAPPER", "EagerWrapper", "IMMUTABLE", "IMMUTABLE_TYPES", "NOT_A_CONTAINER", "TreeCopier", "compiled_parts",
    "deep_copied", "eager_wrapper", "fresh_uninitialized", "rebuilt", "wrapped_own_method",
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


#: the class name of torch.compile's module wrapper (``OptimizedModule``, which holds the module it
#: compiles as its one child): named, not imported (its module is private to torch)
COMPILE_WRAPPER = "OptimizedModule"


class EagerWrapper(nn.Module):
    """What a copy makes of a ``torch.compile`` wrapper: the same attributes and child, called
    eagerly through its one child (the module it compiles). The wrapper's compiled forward, made
    for the caller's module and tensors, never runs on a copy: on a fake copy's tensors its
    compiled code crashed the process (SIGSEGV), and under torch's own ``__call__`` of the wrapper
    a count's process-wide hooks made torch warn."""

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        (wrapped,) = self.children()
        return wrapped(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        """An attribute the wrapper does not hold is its child's, as torch's wrapper reads it."""
        try:
            return super().__getattr__(name)
        except AttributeError:
            (wrapped,) = self.children()
            return getattr(wrapped, name)


#: the attributes every module holds (its parameter, buffer, child and hook dictionaries, ...), as
#: a new ``nn.Module`` has them
_MODULE_STATE = frozenset(vars(nn.Module()))


def _module_state(module: nn.Module) -> Dict[str, Any]:
    """``module``'s attributes that every module holds: a ``torch.compile`` wrapper's copy holds
    these and no more (not the compiler's context, compiled ``forward`` and references to the
    caller's module, which a copy would otherwise convert: copying the child a second time, its
    rows then booked on the wrapper)."""
    return {key: value for key, value in vars(module).items() if key in _MODULE_STATE}


def eager_wrapper(copied: nn.Module, original: nn.Module) -> None:
    """Make ``copied``, the copy of the ``torch.compile`` wrapper ``original`` (filled with
    :func:`_module_state`), an :class:`EagerWrapper` holding the ``training`` flag the wrapper
    reads from its child (a property of torch's class) as any module holds it."""
    (wrapped,) = original.children()
    copied.__class__ = EagerWrapper
    copied.__dict__["training"] = wrapped.training


def compiled_parts(modules: Iterable[nn.Module]) -> bool:
    """Whether any of ``modules`` is compiled: a ``torch.compile`` wrapper, or a module holding a
    wrapper of its own call (``Module.compile()``; :meth:`TreeCopier.own_method`)."""
    for module in modules:
        if type(module).__name__ == COMPILE_WRAPPER:
            return True
        if any(type(value) is types.FunctionType and wrapped_own_method(module, value) for value in vars(module).values()):
            return True
    return False


def wrapped_own_method(module: nn.Module, function: types.FunctionType) -> Any:
    """The method of ``module`` itself that ``function`` wraps (``__wrapped__``, as
    ``functools.wraps`` sets it; ``Module.compile()``'s compiled call wraps the module's call),
    else None."""
    wrapped = function.__dict__.get("__wrapped__")
    return wrapped if type(wrapped) is types.MethodType and wrapped.__self__ is module else None


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
        if kind.__name__ == COMPILE_WRAPPER:
            self.fill(module, new.__dict__, _module_state(module))
            eager_wrapper(new, module)
            return new
        # one item at a time, in the original's order: the copy's __dict__ then shares its keys
        # with the class's other instances as the original's does (CPython's split dictionaries:
        # half the size of the combined one ``update`` makes; issue #32, a deep model's copy)
        self.fill(module, new.__dict__, vars(module))
        return new

    def fill(self, module: nn.Module, state: Dict[str, Any], attributes: Dict[str, Any]) -> None:
        """The copy's ``__dict__`` (``state``, empty): each of ``attributes`` (the module's own, as a
        rule) converted, written one item at a time in the original's order, straight into it (no
        dictionary made in between)."""
        convert = self.value
        for key, value in attributes.items():
            if key == "forward":
                state[key] = self.own_forward(value)
            elif type(value) is types.FunctionType:
                state[key] = self.own_method(module, value)
            else:
                state[key] = convert(value)

    def own_method(self, module: nn.Module, value: types.FunctionType) -> Any:
        """The copy of a function attribute of ``module``. One that wraps a method of ``module``
        itself (``__wrapped__``, as ``functools.wraps`` sets it) is that method, undecorated,
        bound to the copy: ``Module.compile()`` keeps such a wrapper of the module's call, and its
        compiled code, made for the caller's module and tensors, ran the caller's module from the
        copy, or crashed the process on a fake copy's tensors. A copy counts a compiled module
        through the module it wraps, eagerly (as :func:`flopcount.core.analysis.uncompiled` does
        at the top). Any other function is shared."""
        wrapped = wrapped_own_method(module, value)
        return value if wrapped is None else types.MethodType(wrapped.__func__, self.memo[id(module)])

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
