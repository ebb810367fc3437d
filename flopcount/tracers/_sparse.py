"""Sparse tensors as handlers see them: their layout and stored values (docs/conventions.md,
"Sparse layouts"). Tracers only read metadata here; nothing is computed."""

from __future__ import annotations

from typing import Optional

import torch

from flopcount.core.inputs import is_dataless
from flopcount.types import TensorMeta

__all__ = ["has_sparse", "sparse_meta"]


def _stored(tensor: torch.Tensor) -> Optional[int]:
    """The element count of a sparse tensor's values (None if it has none to read: fake or
    meta tensors report 0 stored values whatever the real tensor holds)."""
    if is_dataless(tensor):
        return None
    with torch._C._DisableTorchDispatch():
        values = tensor._values() if tensor.layout == torch.sparse_coo else tensor.values()
        return int(values.numel())


def sparse_meta(tensor: torch.Tensor, dtype: Optional[str]) -> TensorMeta:
    """A TensorMeta for a tensor of a sparse layout, with its stored values."""
    layout = str(tensor.layout).replace("torch.", "")
    return TensorMeta(tuple(tensor.shape), dtype, layout, _stored(tensor))


def has_sparse(*groups: object) -> bool:
    """Whether any tensor in the given sequences of tensors has a sparse layout."""
    return any(
        isinstance(tensor, torch.Tensor) and tensor.layout != torch.strided
        for group in groups for tensor in group  # type: ignore[attr-defined]  # sequences of tensors
    )
