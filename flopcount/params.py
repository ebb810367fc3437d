"""Parameter counts and sizes, read statically from the model (no forward needed)."""

from __future__ import annotations

from typing import Dict

import torch
from torch import nn

from ._packed import packed_dtype, packed_objects, unpack
from .types import ParamSummary


def _dtype_name(tensor) -> str:  # type: ignore[no-untyped-def]
    return str(tensor.dtype).replace("torch.", "")


def summarize_parameters(model: nn.Module) -> ParamSummary:
    """Count each parameter tensor once, even when shared by several modules."""
    total = trainable = 0
    by_dtype: Dict[str, int] = {}
    for param in model.parameters():  # parameters() already yields a shared tensor once
        n = param.numel()
        total += n
        if param.requires_grad:
            trainable += n
        key = _dtype_name(param)
        by_dtype[key] = by_dtype.get(key, 0) + n * param.element_size()
    # quantized modules: packed weights/biases are not nn.Parameters (frozen, stored dtype)
    for _, module, obj in packed_objects(model):
        weight, bias = unpack(obj)  # type: ignore[misc]
        for tensor, dtype in ((weight, packed_dtype(module, weight)), (bias, None)):
            if tensor is None:
                continue
            n = tensor.numel()
            total += n
            stored = dtype if dtype is not None else tensor.dtype
            size = torch.finfo(stored).bits // 8 if stored != tensor.dtype else tensor.element_size()
            key = str(stored).replace("torch.", "")
            by_dtype[key] = by_dtype.get(key, 0) + n * size
    buffers: Dict[str, int] = {}
    for buf in model.buffers():
        key = _dtype_name(buf)
        buffers[key] = buffers.get(key, 0) + buf.numel() * buf.element_size()
    return ParamSummary(total, trainable, total - trainable, by_dtype, buffers)
