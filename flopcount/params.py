"""Parameter counts and sizes, read statically from the model (no forward needed)."""

from __future__ import annotations

from typing import Dict

from torch import nn

from .inputs import is_uninitialized
from .types import ParamSummary


def _dtype_name(tensor) -> str:  # type: ignore[no-untyped-def]
    return str(tensor.dtype).replace("torch.", "")


def summarize_parameters(model: nn.Module) -> ParamSummary:
    """Count each parameter tensor once, even when shared by several modules."""
    total = trainable = 0
    by_dtype: Dict[str, int] = {}
    for param in model.parameters():  # parameters() already yields a shared tensor once
        if is_uninitialized(param):
            continue  # a lazy module not materialised yet: its size is not known
        n = param.numel()
        total += n
        if param.requires_grad:
            trainable += n
        key = _dtype_name(param)
        by_dtype[key] = by_dtype.get(key, 0) + n * param.element_size()
    buffers: Dict[str, int] = {}
    for buf in model.buffers():
        if is_uninitialized(buf):
            continue
        key = _dtype_name(buf)
        buffers[key] = buffers.get(key, 0) + buf.numel() * buf.element_size()
    return ParamSummary(total, trainable, total - trainable, by_dtype, buffers)
