"""What a generation cache holds, measured by walking the cache object: the storages its
tensors keep alive (:func:`cache_bytes`), the positions it keeps (:func:`cache_position_bytes`)
and its floating dtype(s) (:func:`cache_dtype`). Shared by count_generation and serve."""

from __future__ import annotations

from typing import Any, Dict, Iterable, Iterator, Mapping, Tuple

import torch

from flopcount.types import dtype_name

__all__ = ["cache_bytes", "cache_dtype", "cache_position_bytes", "items_of"]


def cache_bytes(cache: Any) -> int:
    """Bytes a KV cache object holds: every storage its tensors keep alive, each once and
    whole (a sliding-window layer's keys are a view of a larger tensor), found by walking
    its attributes, lists, tuples and dicts; real dtypes, meta/fake tensors included."""
    storages: Dict[int, Any] = {}  # id -> storage (kept alive while the walk lasts)
    loose = 0
    for tensor in _unique_tensors(cache):
        try:
            storage = tensor.untyped_storage()
        except (RuntimeError, NotImplementedError):  # sparse or opaque tensors: their own elements
            loose += tensor.numel() * tensor.element_size()
            continue
        storages.setdefault(id(storage), storage)
    return loose + sum(storage.nbytes() for storage in storages.values())


def cache_position_bytes(cache: Any) -> int:
    """Bytes of the positions a KV cache keeps: each of its tensors' own elements
    (``nbytes`` of the views), the figure positions x bytes per position gives."""
    return sum(tensor.numel() * tensor.element_size() for tensor in _unique_tensors(cache))


def _unique_tensors(cache: Any) -> Iterator[torch.Tensor]:
    return iter({id(tensor): tensor for tensor in _tensors_in(cache, set())}.values())  # each once, in order


def cache_dtype(cache: Any) -> str:
    """The dtype of a KV cache's floating tensors ("bfloat16"; several joined by "+"; "" if none)."""
    names = {dtype_name(t.dtype) for t in _tensors_in(cache, set()) if t.is_floating_point()}
    return "+".join(sorted(names))


def _tensors_in(obj: Any, visited: set) -> Iterator[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield obj
        return
    if id(obj) in visited or obj is None or isinstance(obj, (int, float, str, bool, torch.dtype, torch.device)):
        return
    visited.add(id(obj))
    for _, child in items_of(obj):
        yield from _tensors_in(child, visited)


def items_of(obj: Any) -> Iterable[Tuple[Any, Any]]:
    """What a walk of ``obj`` visits: a mapping's items, a list's or tuple's entries (key ""),
    an object's attributes; nothing for anything else."""
    if isinstance(obj, Mapping):
        return obj.items()
    if isinstance(obj, (list, tuple)):
        return (("", child) for child in obj)
    return vars(obj).items() if hasattr(obj, "__dict__") else ()
