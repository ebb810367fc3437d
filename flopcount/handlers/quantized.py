"""Quantized kernels (``torch.ao.quantization``: dynamic and static linear/conv) and the
quantize/dequantize steps around them.

A MAC is a multiply-accumulate whatever the operand type: an int8 x int8 product
accumulated in int32 counts as one MAC, and "FLOPs" = 2 x MACs then counts integer
operations the same way, so a quantized model reports the MACs of its float original.
The packed weight arrives as ``(weight meta, bias meta)`` (the dispatch tracer unpacks
it); without it the MACs are derived from the input and output shapes. Fused ReLU/tanh
add one FLOP per output element, as the separate activation would. The requantization
inside a kernel (scale, zero point, clamp) is not counted.
"""

from __future__ import annotations

from math import prod
from typing import Optional

from flopcount.core.registry import HandlerRegistry
from flopcount.handlers._common import first_output, maybe_tensor
from flopcount.types import Cost, Handler, OpCall, TensorMeta

__all__ = ["DEQUANTIZE", "QUANTIZE", "register"]

QUANTIZE = 4  # x / scale, round, + zero point, clamp
DEQUANTIZE = 2  # (q - zero point) * scale


def _packed_weight(call: OpCall, name: str) -> Optional[TensorMeta]:
    value = call.arg(name)
    return value[0] if isinstance(value, tuple) and value and isinstance(value[0], TensorMeta) else None


def _input(call: OpCall) -> TensorMeta:
    found = (maybe_tensor(call, name) for name in ("X", "qx", "input", "act"))
    return next((tensor for tensor in found if tensor is not None), None) or call.tensors()[0]


def _weight_arg(call: OpCall) -> Optional[TensorMeta]:
    found = (_packed_weight(call, name) for name in ("W_prepack", "packed_weight", "weight", "w_prepack"))
    return next((weight for weight in found if weight is not None), None)


def _linear(activation: int):  # type: ignore[no-untyped-def]
    def handler(call: OpCall) -> Cost:
        """rows x in x out MACs (weight (out, in)); + activation per output element."""
        x, out = _input(call), first_output(call)
        weight = _weight_arg(call)
        rows = x.numel // x.shape[-1] if x.shape and x.shape[-1] else 0
        if weight is not None:
            out_features = weight.shape[0]
        elif out is not None:
            out_features = out.shape[-1]
        else:
            raise ValueError(f"{call.op}: neither the packed weight nor the output shape is known")
        return Cost.from_macs(rows * x.shape[-1] * out_features) + Cost.from_flops(activation * rows * out_features)

    return handler


def _conv(activation: int, transposed: bool):  # type: ignore[no-untyped-def]
    def handler(call: OpCall) -> Cost:
        """output elements x (C_in / groups) x kernel volume MACs (weight (C_out, C_in/g, *k));
        transposed: input elements x (C_out / groups) x kernel volume (weight (C_in, C_out/g, *k))."""
        x, out = _input(call), first_output(call)
        weight = _weight_arg(call)
        if weight is None or out is None:
            raise ValueError(f"{call.op}: the packed weight and the output shape are needed")
        kernel = prod(weight.shape[2:])
        elements = x.numel if transposed else out.numel
        return Cost.from_macs(elements * weight.shape[1] * kernel) + Cost.from_flops(activation * out.numel)

    return handler


def _per_element(flops: int) -> Handler:
    def handler(call: OpCall) -> Cost:
        meta = first_output(call) or _input(call)  # the input's count when the output is not known
        return Cost.from_flops(flops * meta.numel)

    handler.__doc__ = f"{flops} FLOP(s) per element."
    return handler


def register(registry: HandlerRegistry) -> None:
    q = "quantized::"
    registry.register([q + "linear", q + "linear_dynamic", q + "linear_dynamic_fp16"], _linear(0))
    registry.register(
        [
            q + "linear_relu",
            q + "linear_relu_dynamic",
            q + "linear_relu_dynamic_fp16",
            q + "linear_leaky_relu",
            q + "linear_tanh",
        ],
        _linear(1),
    )
    registry.register([q + "conv1d", q + "conv2d", q + "conv3d"], _conv(0, False))
    registry.register([q + "conv1d_relu", q + "conv2d_relu", q + "conv3d_relu"], _conv(1, False))
    registry.register([q + "conv_transpose1d", q + "conv_transpose2d", q + "conv_transpose3d"], _conv(0, True))
    registry.register([q + "add", q + "mul", q + "add_scalar", q + "mul_scalar"], _per_element(1))
    registry.register([q + "add_relu", q + "mul_relu", q + "add_scalar_relu", q + "mul_scalar_relu"], _per_element(2))
    registry.register(
        ["aten::quantize_per_tensor", "aten::quantize_per_channel", "aten::quantize_per_tensor_dynamic"],
        _per_element(QUANTIZE),
    )
    registry.register("aten::dequantize", _per_element(DEQUANTIZE))
    registry.register_zero(
        [
            q + "cat",
            "aten::q_scale",
            "aten::q_zero_point",
            "aten::int_repr",
            "aten::q_per_channel_scales",
            "aten::q_per_channel_zero_points",
            "aten::qscheme",
        ]
    )
