"""Quantized modules keep their weights in packed ScriptObjects, not ``nn.Parameter``s;
these helpers find and unpack them (read-only) for parameter counts and tracers."""

from __future__ import annotations

from typing import Any, Iterator, Optional, Tuple

import torch
from torch import nn

__all__ = ["packed_dtype", "packed_objects", "unpack"]


def unpack(obj: Any) -> Optional[Tuple[torch.Tensor, Optional[torch.Tensor]]]:
    """(weight, bias) of a packed-params ScriptObject (quantized linear/conv), else None."""
    if not isinstance(obj, torch.ScriptObject):
        return None
    try:
        if not obj._has_method("unpack"):  # type: ignore[attr-defined]
            return None
        unpacked = obj.unpack()  # type: ignore[attr-defined]
    except (RuntimeError, TypeError, AttributeError):  # an unknown custom class: not packed weights
        return None
    if not isinstance(unpacked, tuple) or not unpacked or not isinstance(unpacked[0], torch.Tensor):
        return None
    bias = unpacked[1] if len(unpacked) > 1 and isinstance(unpacked[1], torch.Tensor) else None
    return unpacked[0], bias


def packed_objects(model: nn.Module) -> Iterator[Tuple[str, nn.Module, Any]]:
    """(qualified module name, module, packed ScriptObject) for every packed-params
    object held directly by a module of ``model``, each object once."""
    seen = set()
    for name, module in model.named_modules():
        for value in vars(module).values():
            if isinstance(value, torch.ScriptObject) and id(value) not in seen and unpack(value) is not None:
                seen.add(id(value))
                yield name, module, value


def packed_dtype(module: nn.Module, weight: torch.Tensor) -> torch.dtype:
    """The dtype the packed weight is stored in: fp16 dynamic linears unpack to float32
    but hold float16 (their module says so in ``dtype``)."""
    declared = getattr(module, "dtype", None)
    if declared == torch.float16 and weight.dtype == torch.float32:
        return torch.float16
    return weight.dtype
