"""Bytes, dtype and priced FLOPs of an op call, for the memory and compute roofs.

Bytes come from the cost vector (``Cost.bytes_read + Cost.bytes_written``,
:mod:`flopcount.core.traffic`: inputs read + outputs written, views 0); :func:`traffic_as`
prices the same call as if its floating tensors had another dtype (``predict(dtype=)``).
:func:`call_dtype` is the dtype the kernel computes in (int8 for a quantized kernel) and
:func:`kernel_flops` the part of the counted FLOPs no kernel can skip (a causal attention's
triangle): what a bound divides by a peak.
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

from flopcount.core.analysis import is_view_op
from flopcount.core.traffic import call_traffic, is_complex, is_floating
from flopcount.devices.roofline import ATTENTION, op_family
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


def kernel_flops(call: OpCall, flops: float) -> float:
    """The part of a call's counted ``flops`` a kernel cannot skip: all of it, except for a
    causal attention (``is_causal``, or the efficient kernel's causal ``custom_mask_type``),
    whose fused kernels (flash and memory-efficient, CPU and GPU) skip the key blocks past the
    diagonal: of the Lq x Lk scores per head the count books (torch's convention), only the
    m(m + 1) / 2 of the causal triangle, m = min(Lq, Lk), are needed whichever way the
    triangle is aligned (torch's top-left, flash-attn's bottom-right)."""
    lengths = _causal_lengths(call) if flops else None
    if lengths is None:
        return flops
    lq, lk = lengths
    m = min(lq, lk)
    return flops * (m * (m + 1) / 2) / (lq * lk)


def _causal_lengths(call: OpCall) -> Optional[Tuple[int, int]]:
    """(Lq, Lk) of a causal attention kernel's query and key (None: not one, or not 4-D)."""
    if op_family(call.op) != ATTENTION or not (call.arg("is_causal") or call.arg("custom_mask_type") in (1, 2)):
        return None
    query, key = call.arg("query"), call.arg("key")
    if not (isinstance(query, TensorMeta) and isinstance(key, TensorMeta) and query.ndim == key.ndim == 4):
        return None
    # (B, L, H, E) for flash-attn's and the efficient kernel's own ops, (B, H, L, E) for the SDPA ops
    axis = 1 if call.op.rpartition("::")[2].startswith(("_flash_attention", "_efficient_attention")) else 2
    lq, lk = query.shape[axis], key.shape[axis]
    return (lq, lk) if lq and lk else None
