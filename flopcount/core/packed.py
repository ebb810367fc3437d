"""Quantized modules keep their weights in packed ScriptObjects, not ``nn.Parameter``s;
these helpers find and unpack them (read-only) for parameter counts and tracers.

Two kinds are known: a quantized linear/conv's packed params (``unpack()`` gives weight
and bias) and a dynamic quantized RNN layer's ``CellParamsBase``, one per layer and
direction, whose state holds a packed linear for each of w_ih and w_hh (int8 weights;
fp16 cells keep float32 copies that stand for float16 storage) and the biases."""

from __future__ import annotations

from typing import Any, Iterator, List, Optional, Sequence, Tuple

import torch
from torch import nn

__all__ = ["cell_tensors", "held_tensors", "packed_dtype", "packed_objects", "unpack"]


def unpack(obj: Any) -> Optional[Tuple[torch.Tensor, Optional[torch.Tensor]]]:
    """(weight, bias) of a packed-params ScriptObject (quantized linear/conv), else None."""
    if not isinstance(obj, torch.ScriptObject):
        return None
    try:
        # a ScriptObject without the method raises AttributeError (a TorchScript custom class's own)
        unpacked = obj.unpack()  # type: ignore[attr-defined]
    except (RuntimeError, TypeError, AttributeError):  # an unknown custom class: not packed weights
        return None
    if not isinstance(unpacked, tuple) or not unpacked or not isinstance(unpacked[0], torch.Tensor):
        return None
    bias = unpacked[1] if len(unpacked) > 1 and isinstance(unpacked[1], torch.Tensor) else None
    return unpacked[0], bias


def _state(obj: Any) -> Optional[Tuple[Any, ...]]:
    try:
        # ScriptObject.__getstate__ runs the custom class's own, and raises RuntimeError ("does not
        # have a __getstate__ method defined") for a class without one
        state = obj.__getstate__()
    except (RuntimeError, TypeError, AttributeError):
        return None
    if isinstance(state, tuple) and len(state) == 2 and isinstance(state[1], str):
        state = state[0]  # (state, type name)
    return state if isinstance(state, tuple) and len(state) == 5 else None


def cell_tensors(obj: Any) -> Optional[Tuple[List[torch.Tensor], List[torch.Tensor], torch.dtype]]:
    """(weights w_ih, w_hh; biases; the weights' stored dtype) of a dynamic quantized RNN
    cell's ``CellParamsBase``, else None."""
    if not isinstance(obj, torch.ScriptObject):
        return None
    state = _state(obj)
    if state is None or not isinstance(state[0], str) or not state[0].startswith("quantized"):
        return None
    unpacked = [unpack(packed) for packed in state[4]]
    if not unpacked or any(u is None for u in unpacked):
        return None
    weights = [u[0] for u in unpacked if u is not None]
    biases = [u[1] for u in unpacked if u is not None and u[1] is not None]
    if not biases:  # int8 cells keep them beside the packed weights
        biases = [t for t in state[1] if isinstance(t, torch.Tensor) and t.dim() == 1]
    stored = torch.float16 if state[0].endswith("fp16") else weights[0].dtype
    return weights, biases, stored


def held_tensors(module: nn.Module, obj: Any) -> List[Tuple[torch.Tensor, torch.dtype]]:
    """Every tensor a packed object holds, with the dtype it is stored in (weights first)."""
    cell = cell_tensors(obj)
    if cell is not None:
        weights, biases, stored = cell
        return [(w, stored) for w in weights] + [(b, b.dtype) for b in biases]
    unpacked = unpack(obj)
    if unpacked is None:
        return []
    weight, bias = unpacked
    return [(weight, packed_dtype(module, weight))] + ([] if bias is None else [(bias, bias.dtype)])


def packed_objects(
    model: nn.Module, modules: Optional[Sequence[Tuple[str, nn.Module]]] = None
) -> Iterator[Tuple[str, nn.Module, Any]]:
    """(qualified module name, module, packed ScriptObject) for every packed-params
    object (linear/conv params, RNN cells) held directly by a module of ``model``, each once."""
    seen = set()
    for name, module in model.named_modules() if modules is None else modules:
        for value in vars(module).values():
            if isinstance(value, torch.ScriptObject) and id(value) not in seen and held_tensors(module, value):
                seen.add(id(value))
                yield name, module, value


def packed_dtype(module: nn.Module, weight: torch.Tensor) -> torch.dtype:
    """The dtype the packed weight is stored in: fp16 dynamic linears unpack to float32
    but hold float16 (their module says so in ``dtype``)."""
    declared = getattr(module, "dtype", None)
    if declared == torch.float16 and weight.dtype == torch.float32:
        return torch.float16
    return weight.dtype
