"""Pooling, upsampling/interpolation, fold, and their backward ops.

Max pooling: one compare per window element: output elements x kernel volume.
Average pooling: one add per window element plus one divide per output element
(so a global average pool costs what ``mean`` over the same dims costs).
Adaptive pooling uses torch's exact windows: output i of a dim of size In -> Out covers
[floor(i*In/Out), ceil((i+1)*In/Out)).
Interpolation: nearest is a copy (known zero); linear modes count 3 FLOPs per lerp
(a + w*(b - a)) and a cubic tap row 7 (4 multiplies, 3 adds).
"""

from __future__ import annotations

import re
from math import prod
from typing import Sequence

from flopcount.core.registry import HandlerRegistry
from flopcount.handlers._common import first_output, ints, maybe_tensor, output_numel, per_grad_output
from flopcount.types import Cost, Handler, OpCall, TensorMeta

__all__ = ["register", "adaptive_window_total", "INTERPOLATION"]

LERP = 3
INTERPOLATION = {
    "linear1d": LERP,  # one lerp
    "bilinear2d": 3 * LERP,  # two lerps along w, one along h
    "trilinear3d": 7 * LERP,  # four + two + one lerps
    "bicubic2d": 5 * 7,  # four 4-tap rows along w, one 4-tap along h
}
NEAREST_BACKWARD = 1  # one add of each grad_output element into its source


def _spatial_dims(op: str) -> int:
    match = re.search(r"(\d)d", op)
    return int(match.group(1)) if match else 2


def _kernel_volume(call: OpCall) -> int:
    return prod(ints(call.arg("kernel_size"), _spatial_dims(call.op), 1))


def _pool(per_output: int) -> Handler:
    """Output elements x (kernel volume + ``per_output``): max pooling's compares (0), average
    pooling's adds and its divide (1)."""
    return lambda call: Cost.from_flops(output_numel(call) * (_kernel_volume(call) + per_output))


def adaptive_window_total(size_in: int, size_out: int) -> int:
    """Sum over outputs of torch's adaptive window lengths along one dimension."""
    return sum(-(-((i + 1) * size_in) // size_out) - (i * size_in) // size_out for i in range(size_out))


def _adaptive_windows(x: Sequence[int], out: Sequence[int], nsp: int) -> int:
    """Window elements summed over every output: leading dims x product of per-dim totals."""
    lead = prod(x[:-nsp])
    return lead * prod(adaptive_window_total(i, o) for i, o in zip(x[-nsp:], out[-nsp:]))


def _adaptive_out_shape(call: OpCall, x: TensorMeta, nsp: int) -> Sequence[int]:
    out = first_output(call)
    if out is not None:
        return out.shape
    size = ints(call.arg("output_size"), nsp, 1)
    return tuple(i if o is None else o for i, o in zip(x.shape[-nsp:], size))


def _adaptive_avg(call: OpCall) -> Cost:
    x, nsp = call.tensor("self"), _spatial_dims(call.op)
    out = _adaptive_out_shape(call, x, nsp)
    return Cost.from_flops(_adaptive_windows(x.shape, out, nsp) + prod(x.shape[:-nsp]) * prod(out[-nsp:]))


def _adaptive_max(call: OpCall) -> Cost:
    x, nsp = call.tensor("self"), _spatial_dims(call.op)
    return Cost.from_flops(_adaptive_windows(x.shape, _adaptive_out_shape(call, x, nsp), nsp))


def _adaptive_avg_backward(call: OpCall) -> Cost:
    # the forward's window sweep, from the input (self) and grad_output shapes
    x, g, nsp = call.tensor("self"), call.tensor("grad_output"), _spatial_dims(call.op)
    return Cost.from_flops(_adaptive_windows(x.shape, g.shape, nsp) + g.numel)


def _interpolation(per_output: int) -> Handler:
    """``per_output`` FLOPs per output element."""
    return lambda call: Cost.from_flops(per_output * output_numel(call))


def _col2im(call: OpCall) -> Cost:
    # fold sums overlapping patches: one add per input element
    x = maybe_tensor(call, "self") or call.tensor("input")
    return Cost.from_flops(x.numel)


def register(registry: HandlerRegistry) -> None:
    registry.register(
        [
            "aten::max_pool1d", "aten::max_pool2d", "aten::max_pool3d",
            "aten::max_pool1d_with_indices", "aten::max_pool2d_with_indices", "aten::max_pool3d_with_indices",
            "aten::mkldnn_max_pool2d", "aten::mkldnn_max_pool3d", "aten::quantized_max_pool2d",
        ],
        _pool(0),
    )
    registry.register(["aten::avg_pool1d", "aten::avg_pool2d", "aten::avg_pool3d"], _pool(1))
    # one add per window element and a divide, per grad_output element
    registry.register(["aten::avg_pool2d_backward", "aten::avg_pool3d_backward"],
                      lambda call: Cost.from_flops(call.tensor("grad_output").numel * (_kernel_volume(call) + 1)))
    registry.register(
        [
            "aten::adaptive_avg_pool1d", "aten::adaptive_avg_pool2d", "aten::adaptive_avg_pool3d",
            "aten::_adaptive_avg_pool2d", "aten::_adaptive_avg_pool3d", "aten::mkldnn_adaptive_avg_pool2d",
        ],
        _adaptive_avg,
    )
    registry.register(["aten::adaptive_max_pool1d", "aten::adaptive_max_pool2d", "aten::adaptive_max_pool3d"], _adaptive_max)
    registry.register(["aten::_adaptive_avg_pool2d_backward", "aten::_adaptive_avg_pool3d_backward"], _adaptive_avg_backward)
    for mode, per in INTERPOLATION.items():
        registry.register(f"aten::upsample_{mode}", _interpolation(per))
        registry.register(f"aten::upsample_{mode}_backward", per_grad_output(per))
    registry.register(
        [
            f"aten::{prefix}{dims}_backward"
            for prefix in ("upsample_nearest", "_upsample_nearest_exact")
            for dims in ("1d", "2d", "3d")
        ],
        per_grad_output(NEAREST_BACKWARD),
    )
    registry.register("aten::col2im", _col2im)
    # Tensor.unfold's backward adds each window element into its source, like fold
    registry.register("aten::unfold_backward", lambda call: Cost.from_flops(call.tensor("grad_in").numel))
    # fractional max pooling: one compare per window element, like max pooling
    registry.register(["aten::fractional_max_pool2d", "aten::fractional_max_pool3d"], _pool(0))
    registry.register(
        [
            "aten::max_pool2d_with_indices_backward", "aten::max_pool3d_with_indices_backward",
            "aten::adaptive_max_pool2d_backward", "aten::adaptive_max_pool3d_backward",
            "aten::fractional_max_pool2d_backward", "aten::fractional_max_pool3d_backward",
            "aten::max_unpool2d_backward", "aten::max_unpool3d_backward",
            # padding backward: each gradient element is accumulated into its source position
            "aten::reflection_pad1d_backward", "aten::reflection_pad2d_backward", "aten::reflection_pad3d_backward",
            "aten::replication_pad1d_backward", "aten::replication_pad2d_backward", "aten::replication_pad3d_backward",
        ],
        per_grad_output(1),
    )
