"""Convolutions (1-D/2-D/3-D, grouped, depthwise, transposed) and their backward.

Forward MACs = output elements x (C_in/groups) x kernel volume; for a transposed conv
(weight (C_in, C_out/groups, *k)) input elements x (C_out/groups) x kernel volume.
Both read as ``elements x weight.shape[1] x prod(weight.shape[2:])``, so groups and
depthwise convs come out right from the weight's shape alone. Bias adds are not counted.
"""

from __future__ import annotations

from math import prod

from flopcount.core.registry import HandlerRegistry
from flopcount.handlers._common import Shape, first_output, grads_present, ints, maybe_tensor
from flopcount.types import Cost, OpCall

__all__ = ["register", "conv_macs"]


def _conv_output_shape(call: OpCall, x: Shape, w: Shape, transposed: bool) -> Shape:
    """The output shape from the conv arguments, for when the tracer did not record it."""
    nsp = len(w) - 2
    stride = ints(call.arg("stride"), nsp, 1)
    dilation = ints(call.arg("dilation"), nsp, 1)
    padding_arg = call.arg("padding")
    spatial_in = x[-nsp:]
    padding = (0,) * nsp if isinstance(padding_arg, str) else ints(padding_arg, nsp, 0)  # "valid": no padding
    if padding_arg == "same":
        spatial = spatial_in
    elif transposed:  # (string padding is for convolutions only)
        out_pad = ints(call.arg("output_padding"), nsp, 0)
        spatial = tuple(
            (i - 1) * s - 2 * p + d * (k - 1) + op + 1
            for i, k, s, p, d, op in zip(spatial_in, w[2:], stride, padding, dilation, out_pad)
        )
    else:
        spatial = tuple(
            (i + 2 * p - d * (k - 1) - 1) // s + 1 for i, k, s, p, d in zip(spatial_in, w[2:], stride, padding, dilation)
        )
    groups = call.arg("groups") or 1
    c_out = w[1] * groups if transposed else w[0]
    return x[:-nsp - 1] + (c_out,) + spatial


def conv_macs(x: Shape, w: Shape, out: Shape, transposed: bool) -> int:
    """MACs of one convolution given input, weight and output shapes."""
    elements = prod(x) if transposed else prod(out)
    return elements * w[1] * prod(w[2:])


def _conv(call: OpCall) -> Cost:
    # jit/composite ops name the input "input", backend kernels "self".
    x = (maybe_tensor(call, "input") or call.tensor("self")).shape
    w = call.tensor("weight").shape
    transposed = "transpose" in call.op or bool(call.arg("transposed", False))
    out_meta = first_output(call)
    out = out_meta.shape if out_meta is not None else _conv_output_shape(call, x, w, transposed)
    return Cost.from_macs(conv_macs(x, w, out, transposed))


def _conv_backward(call: OpCall) -> Cost:
    """grad_input and grad_weight each cost one forward's MACs (from shapes, so grouped
    and depthwise convs are exact); grad_bias is a sum over grad_output: numel FLOPs."""
    grad_out = call.tensor("grad_output").shape
    x, w = call.tensor("input").shape, call.tensor("weight").shape
    transposed = bool(call.arg("transposed", False))
    grad_input, grad_weight, grad_bias = grads_present(call)
    forwards = int(grad_input) + int(grad_weight)
    return Cost.from_macs(forwards * conv_macs(x, w, grad_out, transposed)) + Cost.from_flops(prod(grad_out) if grad_bias else 0)


def _conv_tbc(call: OpCall) -> Cost:
    """fairseq's time-batch-channel convolution: input (T, B, C_in), weight (K, C_in, C_out),
    ``pad`` on both ends of T: T_out = T + 2 pad - K + 1 positions, each B x C_out x C_in x K MACs."""
    t, b, _ = call.tensor("self").shape
    k, c_in, c_out = call.tensor("weight").shape
    steps = t + 2 * int(call.arg("pad") or 0) - k + 1
    return Cost.from_macs(steps * b * c_out * c_in * k)


CONV_OPS = (
    "aten::_convolution",
    "aten::convolution",
    "aten::_convolution_mode",
    "aten::conv1d",
    "aten::conv2d",
    "aten::conv3d",
    "aten::conv_transpose1d",
    "aten::conv_transpose2d",
    "aten::conv_transpose3d",
    "aten::cudnn_convolution",
    "aten::cudnn_convolution_transpose",
    "aten::mkldnn_convolution",
    "aten::miopen_convolution",
    "aten::_slow_conv2d_forward",
    "aten::thnn_conv2d",
    "aten::slow_conv3d",
    "aten::slow_conv_dilated2d",
    "aten::slow_conv_dilated3d",
    "aten::slow_conv_transpose2d",
    "aten::slow_conv_transpose3d",
    "aten::_nnpack_spatial_convolution",
    "aten::_conv_depthwise2d",
    "aten::conv_depthwise3d",
)


def register(registry: HandlerRegistry) -> None:
    registry.register(CONV_OPS, _conv)
    registry.register("aten::convolution_backward", _conv_backward)
    registry.register("aten::conv_tbc", _conv_tbc)
