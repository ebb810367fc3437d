"""Process-wide memos over the caller's classes and functions that keep none of them alive.

A count classifies the classes it meets once per process (how the structural reuse key reads an
object of a class, the slots a class's instances hold, the globals its code names). A
``functools.lru_cache`` over a class held every class a count ever saw, with its class attributes
(tensors among them), until 4,096 others pushed it out: the block classes a function makes per
model, a ``torch.fx.GraphModule``'s own class, an architecture search's ``type(...)`` classes.
:class:`PerObject` keys an entry by the object's ``id`` and drops it by a weak reference's callback
when the object goes; torch's and Python's classes live as long as the process, and so do their
entries.
"""

from __future__ import annotations

import functools
import weakref
from typing import Any, Callable, Dict, Generic, Optional, TypeVar

__all__ = ["PerObject"]

V = TypeVar("V")


class PerObject(Generic[V]):
    """``compute(obj)`` once per object while it lives, keyed by ``id(obj)``; its entry is dropped
    by a weak reference's callback, which Python runs as the object goes, before its memory (and
    so its ``id``) can be reused. ``lookup(id(obj))`` is the per-call path, None for an object not
    seen yet: one dict lookup in C, as fast as an ``lru_cache`` hit (``fill(obj)`` on a miss);
    calling the cache does both. A value is never None, and must not hold ``obj`` nor anything
    that holds it (the entry would then keep it for good): plain data, names, weak references.
    An object that takes no weak reference (an instance of a class with ``__slots__``) is
    computed on each call, never kept."""

    __slots__ = ("_compute", "_values", "_refs", "lookup")

    def __init__(self, compute: Callable[[Any], V]) -> None:
        self._compute = compute
        self._values: Dict[int, V] = {}
        self._refs: Dict[int, weakref.ref[Any]] = {}
        self.lookup: Callable[[int], Optional[V]] = self._values.get

    def __call__(self, obj: Any) -> V:
        found = self._values.get(id(obj))
        return self.fill(obj) if found is None else found

    def fill(self, obj: Any) -> V:
        """``compute(obj)``, kept while ``obj`` lives."""
        value = self._compute(obj)
        self.put(obj, value)
        return value

    def put(self, obj: Any, value: V) -> None:
        """Keeps ``value`` for ``obj`` while it lives (one computed with others, as
        :func:`flopcount.core.state.code_bound`'s paths and places are read together)."""
        key = id(obj)
        try:
            ref = weakref.ref(obj, functools.partial(_forget, self._values, self._refs, key))
        except TypeError:  # no weak reference to it: not kept
            return
        self._refs[key] = ref  # before the value: a value is never there without its callback
        self._values[key] = value

    def forget(self, obj: Any) -> None:
        """Drops ``obj``'s entry (computed again on next use)."""
        key = id(obj)
        self._values.pop(key, None)
        self._refs.pop(key, None)


def _forget(values: Dict[int, Any], refs: Dict[int, Any], key: int, ref: Any) -> None:
    """The callback of ``ref``: its object is going; its entry goes (unless a later fill for the
    same object, from another thread, put its own reference there: that one's callback drops it)."""
    if refs.get(key) is ref:
        del refs[key]
        values.pop(key, None)
