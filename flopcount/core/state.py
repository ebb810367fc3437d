"""The caller's process and tensors as found: the random generators and the input tensors
(a forward that writes to its inputs in place). Shared by the tracers and the benchmark."""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Iterable, Iterator, List, Sequence, Tuple

import torch

from flopcount.core.inputs import is_dataless


@contextlib.contextmanager
def preserved_rng() -> Iterator[None]:
    """Restore the CPU (and initialised CUDA) RNG state on exit.

    The generators are process-wide: restoring them also rewinds every draw another thread
    made meanwhile (issue #29 item 18). So only work that draws random numbers on real
    tensors uses this (a benchmark's or a profile's real steps); a count on fake tensors
    draws nothing and touches no generator, and a tracer's real run restores them only when
    its trace shows a random op (:func:`draws_random`)."""
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
#: random ops whose ``train`` argument turns the draw off (eval-mode dropout draws nothing)
_TRAIN_GATED = ("dropout", "feature_dropout", "alpha_dropout", "feature_alpha_dropout", "native_dropout", "rrelu")


@functools.cache
def _seeded(op: str) -> bool:
    """``aten::name`` (any overload) carries torch's ``nondeterministic_seeded`` tag: it draws
    from a generator. An op torch does not know (a custom op) counts as drawing."""
    namespace, _, name = op.partition("::")
    packet = getattr(getattr(torch.ops, namespace, None), name.split(".")[0], None) if name else None
    if packet is None:
        return namespace not in ("aten", "prim")
    tag = getattr(torch.Tag, "nondeterministic_seeded", None)
    try:
        overloads = [getattr(packet, overload) for overload in packet.overloads()]
    except (AttributeError, RuntimeError):
        return True
    return tag is None or any(tag in getattr(overload, "tags", ()) for overload in overloads)


def draws_random(events: Iterable[Any]) -> bool:
    """True when one of the trace's events drew random numbers from a generator (dropout in
    train mode, ``randn``, ``bernoulli_``...): the real run advanced the process's RNG."""
    for event in events:
        call = event.call
        op = call.op
        if not _seeded(op):
            continue
        if op.partition("::")[2].split(".")[0].rstrip("_") in _TRAIN_GATED:
            if call.arg("train") is False or call.arg("training") is False or call.arg("p") == 0:
                continue
        return True
    return False


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
