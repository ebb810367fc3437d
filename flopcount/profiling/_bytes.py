"""Bytes, dtype and priced FLOPs of an op call, for the memory and compute roofs.

Bytes come from the cost vector (``Cost.bytes_read + Cost.bytes_written``,
:mod:`flopcount.core.traffic`: inputs read + outputs written, views 0); :func:`traffic_as`
prices the same call as if its floating tensors had another dtype (``predict(dtype=)``).
:func:`call_dtype` is the dtype the kernel computes in (int8 for a quantized kernel); the part
of the counted FLOPs no kernel can skip (a causal attention's triangle) is the device model's
:func:`flopcount.devices.roofline.kernel_flops`, shared with serve.
"""

from __future__ import annotations

from typing import Any, Tuple

from flopcount.core.analysis import is_view_op
from flopcount.core.traffic import call_traffic, is_complex, is_floating
from flopcount.types import OpCall, TensorMeta


def _recast(value: Any, dtype: str) -> Any:
    if isinstance(value, TensorMeta):
        return TensorMeta(value.shape, dtype) if is_floating(value.dtype) else value
    return tuple(_recast(v, dtype) for v in value) if isinstance(value, tuple) else value


def traffic_as(call: OpCall, dtype: str, phase: str = "forward") -> Tuple[int, int]:
    """The call's (bytes read, bytes written) with its real floating tensors priced at
    ``dtype``; ``phase`` as the event's (the byte model prices some backward ops in place)."""
    recast = OpCall(call.op, {k: _recast(v, dtype) for k, v in call.args.items()}, tuple(_recast(o, dtype) for o in call.outputs))
    return call_traffic(recast, view=is_view_op(call.op), phase=phase)


#: quantized tensor dtypes (torch.ao.quantization): an op taking one runs an integer kernel
QUANTIZED_DTYPES = frozenset({"qint8", "quint8", "qint32", "quint4x2", "quint2x4"})


def call_dtype(call: OpCall) -> str:
    """The dtype the op computes in: "int8" for a quantized kernel (an argument of a quantized
    dtype: ``quantize_dynamic``'s packed qint8 weight, a static model's quint8 activations; fbgemm
    and oneDNN multiply them as int8 whatever the float activations around them), else its first
    floating or complex tensor's (else its first tensor's)."""
    arguments = call.tensors()
    if any(meta.dtype in QUANTIZED_DTYPES for meta in arguments):
        return "int8"
    first = None
    for meta in list(arguments) + [o for o in call.outputs if isinstance(o, TensorMeta)]:
        if first is None:
            first = meta.dtype
        if is_floating(meta.dtype) or is_complex(meta.dtype):
            return str(meta.dtype)
    return first or "float32"
