"""Shape helpers shared by every handler family, so each formula exists exactly once."""

from __future__ import annotations

from math import prod
from typing import Any, Optional, Tuple

from flopcount.core.traffic import broadcast as broadcast  # the handlers' too
from flopcount.core.traffic import first_output as first_output
from flopcount.core.traffic import maybe_tensor as maybe_tensor
from flopcount.types import Cost, Handler, OpCall, TensorMeta

Shape = Tuple[int, ...]


def output_numel(call: OpCall) -> int:
    """Elements of the op's first output; the broadcast of its tensor inputs when the
    tracer did not know the output shape."""
    out = first_output(call)
    if out is not None:
        return out.numel
    tensors = call.tensors()
    if not tensors:
        raise ValueError(f"{call.op}: no output shape and no tensor input to infer one")
    return prod(broadcast(*(t.shape for t in tensors)))


def per_grad_output(flops: int) -> Handler:
    """A handler costing ``flops`` per element of a backward op's ``grad_output``."""
    return lambda call: Cost.from_flops(flops * call.tensor("grad_output").numel)


def ints(value: Any, ndim: int, default: int) -> Tuple[int, ...]:
    """An int-list argument expanded to ``ndim`` entries (``[]``/None -> ``default``)."""
    if isinstance(value, int):
        return (value,) * ndim
    value = tuple(value or ())
    return value * ndim if len(value) == 1 else value or (default,) * ndim


def matmul_macs(a: Shape, b: Shape) -> int:
    """MACs of ``torch.matmul(a, b)`` with its 1-D and broadcasting rules:
    output elements x contracted size."""
    if not a or not b:
        raise ValueError(f"matmul needs tensors of at least one dimension, got {a} and {b}")
    k = a[-1]
    if len(a) == 1 and len(b) == 1:
        out: Shape = ()
    elif len(a) == 1:
        out = b[:-2] + b[-1:]
    elif len(b) == 1:
        out = a[:-1]
    else:
        out = broadcast(a[:-2], b[:-2]) + (a[-2], b[-1])
    return prod(out) * k


def grads_present(call: OpCall, count: int = 3) -> Tuple[bool, ...]:
    """Which of a backward op's ``count`` gradients were computed: the outputs the tracer
    saw (None = not computed), else ``output_mask``, else all."""
    if len(call.outputs) >= count:
        return tuple(o is not None for o in call.outputs[:count])
    mask = call.arg("output_mask")
    return (True,) * count if mask is None else tuple(bool(m) for m in mask)


def is_complex(meta: Optional[TensorMeta]) -> bool:
    return meta is not None and bool(meta.dtype) and str(meta.dtype).startswith("complex")


def any_complex(call: OpCall) -> bool:
    """True when some tensor argument of ``call`` is complex."""
    return any(is_complex(t) for t in call.tensors())


#: real MACs in one complex multiply-accumulate: (a+bi)(c+di) = 4 real products
COMPLEX_MAC = 4
#: real FLOPs in one complex add
COMPLEX_ADD = 2


def complex_contraction(handler: Handler) -> Handler:
    """Wrap a contraction handler: with a complex operand each MAC is 4 real MACs and
    each non-contraction FLOP (a pre-sum, an add) 2 real FLOPs."""

    def wrapped(call: OpCall) -> Cost:
        cost = handler(call)
        if cost is None or not any_complex(call):  # None: unsupported (a sparse product it cannot cost)
            return cost
        macs = COMPLEX_MAC * cost.macs
        other = cost.flops - 2 * cost.macs
        return Cost(macs=macs, flops=2 * macs + COMPLEX_ADD * other)

    wrapped.__doc__ = handler.__doc__
    wrapped.__name__ = getattr(handler, "__name__", "handler")
    return wrapped
