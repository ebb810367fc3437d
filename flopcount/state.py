"""The caller's process and tensors as found: the random generators and the input tensors
(a forward that writes to its inputs in place). Shared by the tracers and the benchmark."""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, List, Sequence, Tuple

import torch

from .inputs import is_dataless


@contextlib.contextmanager
def preserved_rng() -> Iterator[None]:
    """Restore the CPU (and initialised CUDA) RNG state on exit."""
    rng = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    try:
        yield
    finally:
        torch.set_rng_state(rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)


def _layout(tensor: torch.Tensor) -> Tuple[Any, ...]:
    """Shape, strides and offset of a strided tensor; the shape of a sparse one (COO, CSR,
    CSC, BSR, BSC tensors have no strides)."""
    if tensor.layout != torch.strided:
        return (tensor.shape, tensor.layout)
    return (tensor.shape, tensor.stride(), tensor.storage_offset())


@contextlib.contextmanager
def preserved_inputs(tensors: Sequence[torch.Tensor]) -> Iterator[None]:
    """Give the caller's input tensors back exactly as found, even when the forward
    writes to them in place (``x.add_(1)``, ``x.relu_()``): their values, ``requires_grad``
    and ``.grad``. Each tensor with data is copied first; a copy is only written back to a
    tensor whose version counter moved."""
    saved: List[Tuple[torch.Tensor, int, Tuple[Any, ...], torch.Tensor, bool, Any]] = []
    seen = set()
    for tensor in tensors:
        if id(tensor) in seen or is_dataless(tensor):
            continue
        seen.add(id(tensor))
        layout = _layout(tensor)
        saved.append((tensor, tensor._version, layout, tensor.detach().clone(), tensor.requires_grad, tensor.grad))
    try:
        yield
    finally:
        with torch.no_grad():
            for tensor, version, layout, copy, requires_grad, grad in saved:
                if _layout(tensor) != layout and tensor.layout == torch.strided:
                    shape, stride, offset = layout
                    tensor.as_strided_(shape, stride, offset)
                if tensor._version != version:
                    tensor.copy_(copy)
                if tensor.is_leaf:
                    tensor.requires_grad_(requires_grad)
                    tensor.grad = grad
