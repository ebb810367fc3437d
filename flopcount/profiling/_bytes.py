"""Bytes an op moves, for the memory roof: its input tensors read plus its output tensors
written (``numel * itemsize``), views (outputs that alias an input) 0.

TODO(lead): replace with the cost vector's ``Cost.bytes_read + Cost.bytes_written`` once
main has it ("Cost vector:" commit); this local copy follows the same convention.
"""

from __future__ import annotations

from functools import cache
from typing import Any, Tuple

from ..types import Cost, OpCall, TensorMeta

_ITEMSIZE = {
    "float64": 8, "double": 8, "float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2,
    "complex128": 16, "complex64": 8, "complex32": 4,
    "int64": 8, "long": 8, "int32": 4, "int": 4, "int16": 2, "short": 2, "int8": 1, "uint8": 1, "bool": 1,
    "uint16": 2, "uint32": 4, "uint64": 8,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1,
    "qint8": 1, "quint8": 1, "qint32": 4,
}


def itemsize(dtype: Any) -> int:
    """Bytes per element of a dtype name (4 when unknown)."""
    return _ITEMSIZE.get(str(dtype).replace("torch.", ""), 4)


def tensor_bytes(meta: TensorMeta) -> int:
    return meta.numel * itemsize(meta.dtype)


@cache
def is_view(op: str) -> bool:
    """True when the op's first result aliases an input without writing it (``view``,
    ``transpose``, ``expand``...): it moves no data."""
    try:
        import torch

        namespace, name = op.split("::", 1)
        packet = getattr(getattr(torch.ops, namespace), name)
        schema = getattr(packet, "default", None) or getattr(packet, packet.overloads()[0])
        returns = schema._schema.returns
    except Exception:
        return False
    if not returns:
        return False
    alias = returns[0].alias_info
    return alias is not None and not alias.is_write


def call_bytes(call: OpCall) -> Tuple[int, int]:
    """(bytes read, bytes written) of one op call; a view moves none."""
    if is_view(call.op):
        return 0, 0
    read = sum(tensor_bytes(t) for t in call.tensors())
    written = sum(tensor_bytes(o) for o in call.outputs if isinstance(o, TensorMeta))
    return read, written


def event_bytes(call: OpCall, cost: Cost) -> int:
    """Bytes read + written by the call: the cost vector's when it has them, else computed."""
    read = getattr(cost, "bytes_read", None)
    written = getattr(cost, "bytes_written", None)
    if isinstance(read, int) and isinstance(written, int):
        return read + written
    r, w = call_bytes(call)
    return r + w


def call_dtype(call: OpCall) -> str:
    """The dtype the op computes in: its first floating tensor's (else its first tensor's)."""
    first = None
    for meta in list(call.tensors()) + [o for o in call.outputs if isinstance(o, TensorMeta)]:
        if first is None:
            first = meta.dtype
        if meta.dtype and ("float" in meta.dtype or "complex" in meta.dtype):
            return meta.dtype
    return first or "float32"


def call_bytes_as(call: OpCall, dtype: Any = None) -> Tuple[int, int]:
    """:func:`call_bytes`, floating tensors priced at ``dtype``'s item size when given."""
    if dtype is None:
        return call_bytes(call)
    if is_view(call.op):
        return 0, 0
    size = itemsize(dtype)

    def moved(meta: TensorMeta) -> int:
        kind = str(meta.dtype)
        floating = "float" in kind or "half" in kind or "double" in kind
        return meta.numel * (size if floating else itemsize(kind))

    read = sum(moved(t) for t in call.tensors())
    written = sum(moved(o) for o in call.outputs if isinstance(o, TensorMeta))
    return read, written
