"""Normalisation layers: layer/batch/group/instance/RMS norm, both spellings, and backward.

A norm over N elements in G groups (rows for layer norm, channels for batch norm,
batch x groups for group norm, batch x channels for instance norm):

* statistics (only when computed from the batch): mean and biased variance, 4N + 2G
  (the same ``var_flops`` as ``aten::var``);
* normalisation: (x - mean) * rstd, 2N, plus eps add and rsqrt per group, 2G;
* affine: N for the weight multiply, N for the bias add, each only when given.

Batch norm in eval mode (running statistics) skips the statistics. Running-statistics
updates in training are O(C) and not counted. RMS norm costs exactly the ops it
decomposes into (pow, mean, add, rsqrt, mul, mul).
"""

from __future__ import annotations

from math import prod
from typing import Callable, Optional, Sequence

from flopcount.core.registry import HandlerRegistry
from flopcount.handlers._common import grads_present, maybe_tensor
from flopcount.handlers.pointwise import elementwise_flops
from flopcount.handlers.reduce import mean_flops, var_flops
from flopcount.types import Cost, Handler, OpCall, TensorMeta

__all__ = ["register", "normalize_flops", "rms_norm_flops"]

# backward, per element: recompute xhat (2), g*w (1), sum(g*w) (1), sum(g*w*xhat) (2),
# combine rstd*(g*w - a/n - xhat*b/n) (4): 10 with a weight, 9 without; + 2 divides per group.
NORM_BACKWARD_STATS = 9
NORM_BACKWARD_GROUP = 2
GRAD_WEIGHT = 2  # sum(g * xhat): multiply + add
GRAD_BIAS = 1  # sum(g)


def normalize_flops(n: int, groups: int, stats: bool, weight: bool, bias: bool) -> int:
    """FLOPs of normalising ``n`` elements in ``groups`` groups (see the module docstring)."""
    flops = 2 * n + 2 * groups
    if stats:
        flops += var_flops(n, groups)
    return flops + n * weight + n * bias


def rms_norm_flops(n: int, rows: int, weight: bool) -> int:
    """x * rsqrt(mean(x^2) + eps) [* weight]: pow N, mean N + rows, add rows, rsqrt rows,
    mul N, weight mul N -- the decomposition's own pieces."""
    flops = (
        elementwise_flops("aten::pow", n)
        + mean_flops(n, rows)
        + elementwise_flops("aten::add", rows)
        + elementwise_flops("aten::rsqrt", rows)
        + elementwise_flops("aten::mul", n)
    )
    return flops + (elementwise_flops("aten::mul", n) if weight else 0)


def _norm(groups: Callable[[OpCall, TensorMeta], int], stats: Callable[[OpCall], bool], backward: bool = False) -> Handler:
    """A norm over ``input`` in ``groups(call, x)`` groups, from batch statistics where
    ``stats(call)``: :func:`normalize_flops`, or :func:`norm_backward_flops` for its backward."""

    def handler(call: OpCall) -> Cost:
        x = call.tensor("input")
        weight = maybe_tensor(call, "weight") is not None
        if backward:
            return Cost.from_flops(norm_backward_flops(x.numel, groups(call, x), stats(call), weight, grads_present(call)))
        bias = maybe_tensor(call, "bias") is not None
        return Cost.from_flops(normalize_flops(x.numel, groups(call, x), stats(call), weight, bias))

    return handler


def _rows(call: OpCall, x: TensorMeta) -> int:
    """Groups of a layer or RMS norm: the rows of ``normalized_shape``."""
    return x.numel // max(_normalized_numel(call, x), 1)


def _normalized_numel(call: OpCall, x: TensorMeta) -> int:
    """prod(normalized_shape); entries jit computed while tracing (None) are read from
    the input's trailing dims."""
    shape = call.arg("normalized_shape")
    if shape is None:
        w = maybe_tensor(call, "weight")
        shape = w.shape if w is not None else x.shape[-1:]
    elif any(s is None for s in shape):
        shape = x.shape[-len(shape):]
    return prod(shape)


def _channels(call: OpCall, x: TensorMeta) -> int:
    return x.shape[1] if x.ndim >= 2 else 1


def _instances(call: OpCall, x: TensorMeta) -> int:
    """Instance norm is batch norm on (1, N*C, ...): one group per sample and channel."""
    return x.shape[0] * x.shape[1] if x.ndim >= 2 else 1


def _groups(call: OpCall, x: TensorMeta) -> int:
    """Group norm: ``num_groups`` (``group`` in the native ops) per sample."""
    return (x.shape[0] if x.ndim >= 2 else 1) * int(call.arg("num_groups", call.arg("group")))


def _batch_stats(call: OpCall) -> bool:
    """``training`` picks batch statistics; without running stats they are always used."""
    return bool(call.arg("training")) or maybe_tensor(call, "running_mean") is None


def _batch_stats_backward(call: OpCall) -> bool:
    train: Optional[bool] = call.arg("train", call.arg("update"))
    return True if train is None else bool(train) or maybe_tensor(call, "running_mean") is None


def _always(call: OpCall) -> bool:
    return True


def _rms_norm(call: OpCall) -> Cost:
    x = call.tensor("input")
    return Cost.from_flops(rms_norm_flops(x.numel, _rows(call, x), maybe_tensor(call, "weight") is not None))


# -- backward -------------------------------------------------------------------------------


def norm_backward_flops(n: int, groups: int, stats: bool, weight: bool, present: Sequence[bool]) -> int:
    """grad_input: with batch statistics 9N (+N with a weight) + 2G; with running
    statistics g * rstd [* w] = N (+N) + 2G. grad_weight 2N, grad_bias N."""
    flops = 0
    if present[0]:
        per = NORM_BACKWARD_STATS if stats else 1
        flops += (per + weight) * n + NORM_BACKWARD_GROUP * groups
    if present[1]:
        flops += GRAD_WEIGHT * n
    if present[2]:
        flops += GRAD_BIAS * n
    return flops


def _weight_norm(call: OpCall) -> Cost:
    """``w = v * (g / ||v||)``, the norm over every dim but ``dim`` (G = g's elements, N = v's):
    squares and sum 2N, G square roots, G divides, N multiplies: **3N + 2G** (the order of
    torch's CPU kernel ``weight_norm``)."""
    n, groups = call.tensor("v").numel, call.tensor("g").numel
    return Cost.from_flops(3 * n + 2 * groups)


def _weight_norm_backward(call: OpCall) -> Cost:
    """Both gradients of ``w = v * (g / ||v||)`` per group (N = v's elements, G = g's):
    ``s = sum(grad_w * v)`` 2N; ``grad_g = s / ||v||`` G; ``c = s / ||v||^2`` 2G;
    ``k = g / ||v||`` G; ``grad_v = k * (grad_w - c * v)`` 3N: **5N + 4G** (torch's CPU
    kernel ``weight_norm_backward`` reuses the saved norms)."""
    n, groups = call.tensor("saved_v").numel, call.tensor("saved_g").numel
    return Cost.from_flops(5 * n + 4 * groups)


def register(registry: HandlerRegistry) -> None:
    registry.register(["aten::_weight_norm", "aten::_weight_norm_interface"], _weight_norm)
    registry.register("aten::_weight_norm_interface_backward", _weight_norm_backward)
    registry.register(["aten::layer_norm", "aten::native_layer_norm"], _norm(_rows, _always))
    registry.register(
        [
            "aten::batch_norm",
            "aten::native_batch_norm",
            "aten::_native_batch_norm_legit",
            "aten::_native_batch_norm_legit_functional",
            "aten::_batch_norm_impl_index",
            "aten::cudnn_batch_norm",
            "aten::miopen_batch_norm",
            # no training flag: batch statistics exactly when no running statistics are given
            "aten::_batch_norm_no_update",
        ],
        _norm(_channels, _batch_stats),
    )
    registry.register("aten::_native_batch_norm_legit_no_training", _norm(_channels, lambda call: False))
    registry.register("aten::_batch_norm_with_update", _norm(_channels, _always))
    registry.register("aten::instance_norm", _norm(_instances, lambda call: call.arg("use_input_stats") is not False))
    registry.register(["aten::group_norm", "aten::native_group_norm"], _norm(_groups, _always))
    registry.register(["aten::rms_norm", "aten::_fused_rms_norm"], _rms_norm)
    registry.register("aten::native_layer_norm_backward", _norm(_rows, _always, backward=True))
    registry.register(
        ["aten::native_batch_norm_backward", "aten::batch_norm_backward", "aten::cudnn_batch_norm_backward"],
        _norm(_channels, _batch_stats_backward, backward=True),
    )
    registry.register("aten::native_group_norm_backward", _norm(_groups, _always, backward=True))
