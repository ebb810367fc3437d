"""Structural reuse of calls given a KV cache (transformers' ``Cache``): what such a call can
observe of the cache, and the replay of what it changed there (issue #32).

A decoder layer called with a cache reads and writes one slot of it: ``cache.update(k, v,
self.layer_idx)`` indexes ``cache.layers`` with the layer's own index and leaves new key and
value tensors in that slot. Two layers that differ only in that index do the same work when
their slots hold tensors of the same metadata. To take that as proven and not guessed, the
first call of a key runs with:

* each ``layer_idx`` attribute of its subtree's (tracked) modules replaced by a
  :class:`LayerIndex`, which behaves as the int it stands for but records every use of its
  value (arithmetic, comparison, hashing, formatting, ``__index__``: a list indexed with it in
  the model's own code, ``isinstance``). Only one use is not an observation: indexing the
  cache's layer list with it (:class:`SlotList` sees the index object itself). A call that
  used its index in any other way is not reused;
* the cache's ``layers`` list replaced by a :class:`SlotList` (a list) that records which
  slots were indexed, and with what: the layer's own index (a *relative* access: slot i for
  layer i) or a plain int (an *absolute* one, slot 0 for every layer). Iterating or slicing
  the list, or changing it, records "all", and such a call is not reused.

Every slot's attributes are described before the call (tensors by metadata, scalars by
value; anything else makes the slot undescribable) and compared after it: slots not indexed
must be left as they were (the same objects), the cache's own attributes too; an indexed
slot's new state is recorded (:func:`after_state`: attributes kept, new tensors by metadata
and view-ness, scalars by value). A later call matches when, besides the rest of the key, the
slots it would index (its own ``layer_idx`` for the relative accesses) are in the states the
first call found; its replay writes the recorded new states into those slots, with fresh fake
tensors of the recorded metadata.
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

__all__ = ["LayerIndex", "SlotList", "cache_type", "INDEX_ATTRIBUTE"]

#: the attribute transformers' attention modules index the cache with
INDEX_ATTRIBUTE = "layer_idx"


class Unkeyable(Exception):
    """A value the key cannot describe exactly: the call is traced."""


def cache_type() -> Optional[type]:
    """transformers' ``Cache`` base class when transformers' cache module is loaded (a model
    that makes one has loaded it), else None; transformers is never imported here."""
    module = sys.modules.get("transformers.cache_utils")
    found = getattr(module, "Cache", None) if module is not None else None
    return found if isinstance(found, type) else None


class LayerIndex:
    """Stands for a module's ``layer_idx`` during a first call: every use of its value is
    recorded in ``seen`` (and answered as the int would answer), except indexing a
    :class:`SlotList`."""

    __slots__ = ("value", "seen")

    def __init__(self, value: int):
        self.value = value
        self.seen = False

    @property  # type: ignore[misc]  # isinstance(index, int) holds, as for the int; it is a use
    def __class__(self) -> type:
        self.seen = True
        return int

    def __getattr__(self, name: str) -> Any:
        self.seen = True
        return getattr(self.value, name)


def _observing(name: str) -> Callable[..., Any]:
    def method(self: LayerIndex, *args: Any) -> Any:
        self.seen = True
        plain = tuple([a.value if type(a) is LayerIndex else a for a in args])
        return getattr(self.value, name)(*plain)

    method.__name__ = name
    return method


for _name in (
    "__index__", "__int__", "__float__", "__complex__", "__bool__", "__hash__", "__eq__", "__ne__", "__lt__",
    "__le__", "__gt__", "__ge__", "__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__",
    "__floordiv__", "__rfloordiv__", "__truediv__", "__rtruediv__", "__mod__", "__rmod__", "__divmod__",
    "__rdivmod__", "__pow__", "__rpow__", "__neg__", "__pos__", "__abs__", "__invert__", "__and__", "__rand__",
    "__or__", "__ror__", "__xor__", "__rxor__", "__lshift__", "__rlshift__", "__rshift__", "__rrshift__",
    "__round__", "__trunc__", "__floor__", "__ceil__", "__str__", "__repr__", "__format__", "__reduce__",
    "__reduce_ex__", "__sizeof__", "__dir__",
):
    setattr(LayerIndex, _name, _observing(_name))


def _copied(self: LayerIndex, *memo: Any) -> int:
    self.seen = True
    return self.value


LayerIndex.__copy__ = _copied  # type: ignore[attr-defined]
LayerIndex.__deepcopy__ = _copied  # type: ignore[attr-defined]


class SlotList(list):
    """The cache's ``layers`` during a first call: records the slots indexed (``("rel",
    index)`` with a :class:`LayerIndex`, ``("abs", i)`` with an int) and ``("all",)`` for any
    other look at the list or change of it (its length is keyed, so ``len`` is free)."""

    def __init__(self, items: List[Any]):
        super().__init__(items)
        self.accesses: List[Tuple[Any, ...]] = []

    def __getitem__(self, i: Any) -> Any:
        kind = type(i)
        if kind is LayerIndex:
            self.accesses.append(("rel", i))
            return list.__getitem__(self, i.value)
        if kind is int:
            n = len(self)
            self.accesses.append(("abs", i + n if i < 0 else i))
            return list.__getitem__(self, i)
        self.accesses.append(("all",))
        return list.__getitem__(self, i)


def _all(name: str) -> Callable[..., Any]:
    base = getattr(list, name)

    def method(self: SlotList, *args: Any, **kwargs: Any) -> Any:
        self.accesses.append(("all",))
        return base(self, *args, **kwargs)

    method.__name__ = name
    return method


for _name in (
    "__iter__", "__reversed__", "__contains__", "__setitem__", "__delitem__", "__iadd__", "__imul__", "__add__",
    "__mul__", "__rmul__", "__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__repr__", "__reduce_ex__",
    "append", "extend", "insert", "pop", "remove", "clear", "sort", "reverse", "index", "count", "copy",
):
    setattr(SlotList, _name, _all(_name))


# ---------------------------------------------------------------------- descriptions

_PLAIN = frozenset({int, float, bool, str, type(None), complex, torch.dtype, torch.device})


class States:
    """Describes cache slots and the cache's own attributes for one :class:`Reuse`."""

    def __init__(self, fake_type: Any, mode: Any):
        self.fake_type = fake_type
        self.mode = mode
        # equal slot descriptions and their parts one object each, for the count: a first call given a
        # cache describes every slot at once (``Reuse._watch``; 80 on a 70B model, equal before the
        # run), and as many tuples alive at once stayed in CPython's free lists after (issue #32)
        self._same: Dict[Any, Any] = {}

    def tensor(self, t: Any) -> Tuple[Any, ...]:
        """A fake tensor of the run's mode by its metadata (and the constant fake tensors
        carry, small ones by value); anything else is :class:`Unkeyable`."""
        if type(t) is not self.fake_type or t.fake_mode is not self.mode or t.layout != torch.strided:
            raise Unkeyable("a tensor of another kind")
        constant = t.constant
        if constant is not None:
            if constant.numel() > 64:
                raise Unkeyable("a large constant tensor")
            with torch._C._DisableTorchDispatch():  # a real tensor read under the run's modes: no op of the model
                constant = (constant.dtype, tuple(constant.reshape(-1).tolist()))
        return (tuple(t.shape), t.stride(), t.storage_offset(), t.dtype, t.fake_device, t.requires_grad,
                t._base is not None, constant)

    def value(self, value: Any) -> Any:
        kind = type(value)
        if kind in _PLAIN:
            pair = (kind, value) if kind is not float or value == value else (kind, "nan")
            return self._same.setdefault(pair, pair)
        if kind is self.fake_type:
            return ("tensor",) + self.tensor(value)
        if kind is tuple:
            return (kind, tuple([self.value(v) for v in value]))
        raise Unkeyable(f"a cache attribute of type {kind.__name__}")

    def own(self, cache: Any) -> Tuple[Any, ...]:
        """The cache object's own attributes but its slots: plain values, tensors by metadata,
        classes by identity; any other object (a nested cache) makes the cache undescribable."""
        items: List[Any] = []
        for name, value in vars(cache).items():
            if name == "layers":
                continue
            if isinstance(value, type):  # a layer class to replicate
                items.append((name, ("class", value)))
            else:  # another object (a nested cache, a stream) could change unseen: traced
                items.append((name, self.value(value)))
        return (type(cache), tuple(items))

    def slot(self, layer: Any) -> Tuple[Any, ...]:
        """A slot (a cache layer object) by class and every attribute it holds."""
        try:
            state = vars(layer)
        except TypeError:
            raise Unkeyable("a cache slot without attributes") from None
        same = self._same.setdefault
        made = (type(layer), tuple([same(item, item) for item in [(name, self.value(value)) for name, value in state.items()]]))
        return same(made, made)

    def after(self, before: Dict[str, Any], layer: Any, args: List[Any], made: List[Any]) -> Tuple[Any, ...]:
        """What a first call left in a slot it indexed: per attribute, ``("kept",)`` (the object
        it held before, unchanged), ``("value", v)`` for a plain value, or a tensor description:
        ``("arg", i)`` one of the call's tensors, ``("made", j)`` one described already,
        ``("new", ...)``/``("view", ...)`` a fresh one (views by their base's size)."""
        items: List[Any] = []
        for name, value in vars(layer).items():
            if name in before and before[name] is value:
                if type(value) is self.fake_type and before.get("\0" + name) != self.tensor(value):
                    raise Unkeyable("a tensor of the slot changed in place")  # a constant's value, a resize
                items.append((name, ("kept",)))
            elif type(value) is self.fake_type:
                items.append((name, self._made(value, args, made)))
            else:
                kind = type(value)
                if kind not in _PLAIN:
                    raise Unkeyable(f"a new cache attribute of type {kind.__name__}")
                items.append((name, ("value", value)))
        return (type(layer), tuple(items))

    def _made(self, t: Any, args: List[Any], made: List[Any]) -> Tuple[Any, ...]:
        for i, seen in enumerate(args):
            if seen is t:
                return ("arg", i)
        for j, seen in enumerate(made):
            if seen is t:
                return ("made", j)
        if t.fake_mode is not self.mode or t.constant is not None or t.requires_grad or t.layout != torch.strided:
            raise Unkeyable("a cache tensor of another kind")
        made.append(t)
        if t._base is not None:
            base = t.untyped_storage().nbytes() // t.element_size()
            return ("view", base, tuple(t.shape), t.stride(), t.storage_offset(), t.dtype, t.fake_device)
        if t.storage_offset():
            raise Unkeyable("a cache tensor with an offset that is not a view")
        return ("new", tuple(t.shape), t.stride(), t.dtype, t.fake_device)
