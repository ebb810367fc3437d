"""Memory traffic of one op call: the bytes it reads and writes (the roofline's memory side).

Convention (docs/conventions.md, "Bytes"): an op reads every tensor argument it is
given (lists flattened, each argument once as passed, ``numel x element size``) and
writes every tensor it returns. So:

* a **view** (its result aliases an input: ``view``, ``t``, ``expand``, ``select``...)
  moves nothing: 0 read, 0 written;
* an **in-place** op (``add_``) reads its arguments, ``self`` included, and writes
  ``self``; an op whose outputs the tracer cannot see as tensors (a list, ``None``)
  is taken to write as many bytes as its ``self`` argument (``_foreach_*``);
* an **allocation** that fills nothing (``empty``, ``empty_like``...) moves nothing;
* a **fused composite** (``aten::linear``, ``scaled_dot_product_attention``, a fused
  encoder layer) moves its own inputs and outputs only: the ideal kernel keeps
  intermediates on chip. A split cost books the composite's bytes under its first part.

Element sizes come from the dtype name; a tensor whose dtype a tracer could not see is
taken as float32 (4 bytes). No torch here: whether an op is a view is told by the caller.
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, Tuple

from .types import OpCall, TensorMeta

__all__ = ["ITEMSIZE", "call_traffic", "element_size"]

#: Bytes per element, by the dtype names tracers give (``str(torch.float32)`` less ``torch.``).
ITEMSIZE: Dict[str, int] = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1, "float8_e8m0fnu": 1,
    "complex128": 16, "complex64": 8, "complex32": 4,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "uint16": 2, "uint32": 4, "uint64": 8,
    "bool": 1, "qint8": 1, "quint8": 1, "qint32": 4, "quint4x2": 1, "quint2x4": 1,
}
_DEFAULT_ITEMSIZE = 4

#: Factories that allocate without writing a value.
ALLOCATIONS = frozenset({
    "aten::empty", "aten::empty_like", "aten::empty_strided", "aten::new_empty", "aten::new_empty_strided",
    "aten::empty_permuted",
})


def element_size(dtype: Any) -> int:
    """Bytes per element of a dtype name; float32's 4 when unknown."""
    return ITEMSIZE.get(dtype, _DEFAULT_ITEMSIZE) if dtype is not None else _DEFAULT_ITEMSIZE


def _nbytes(meta: TensorMeta) -> int:
    size = element_size(meta.dtype)
    for dim in meta.shape:
        size *= dim
    return size


def _tensor_bytes(values: Iterable[Any]) -> int:
    total = 0
    for value in values:
        if isinstance(value, TensorMeta):
            total += _nbytes(value)
        elif isinstance(value, tuple):
            total += _tensor_bytes(value)
    return total


def call_traffic(call: OpCall, *, view: bool) -> Tuple[int, int]:
    """``(bytes_read, bytes_written)`` of ``call`` by the convention above; ``view`` says
    the op's result aliases an input (told by the op's schema)."""
    if view or call.op in ALLOCATIONS:
        return 0, 0
    read = _tensor_bytes(call.args.values())
    written = _tensor_bytes(call.outputs)
    if not written and not any(isinstance(o, TensorMeta) for o in call.outputs):
        written = _tensor_bytes((call.args.get("self"),))
    return read, written
