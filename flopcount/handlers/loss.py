"""Loss functions and their backward ops.

Per-element constants times the loss's input elements, plus the reduction:
``reduction`` 0 (none) adds nothing, 2 (sum) one add per element, 1 (mean) the same
plus one divide (``mean_flops(N, 1)``). Cross-entropy is exactly log_softmax + nll_loss,
the two ops it decomposes into.
"""

from __future__ import annotations

from typing import Any

from ..registry import HandlerRegistry
from ..types import Cost, OpCall
from ._common import maybe_tensor
from .reduce import log_softmax_flops, mean_flops, reduce_flops

__all__ = ["register", "nll_flops"]

MEAN, SUM = 1, 2
PER_ELEMENT = {
    "aten::mse_loss": 2,  # subtract, square
    "aten::l1_loss": 2,  # subtract, abs
    "aten::smooth_l1_loss": 5,  # subtract, abs, compare, 0.5*d*d/beta or |d| - 0.5*beta
    "aten::huber_loss": 5,
    "aten::soft_margin_loss": 4,  # log(1 + exp(-y*x)): mul, exp, add, log
    "aten::binary_cross_entropy": 7,  # -(t*log(x) + (1-t)*log(1-x))
    "aten::binary_cross_entropy_with_logits": 7,  # (1-t)*x + log(1 + exp(-x)), stabilised
    "aten::kl_div": 3,  # t * (log t - x)
}
BACKWARD = {
    "aten::mse_loss_backward": 3,  # 2*(x - t)*g (/N folded)
    "aten::smooth_l1_loss_backward": 3,  # clamp((x - t)/beta, -1, 1) * g
    "aten::huber_loss_backward": 3,
    "aten::soft_margin_loss_backward": 6,  # -y*g*sigmoid(-y*x)
    "aten::binary_cross_entropy_backward": 5,  # g*(x - t)/((1 - x)*x)
}


def _reduction(n: int, reduction: Any) -> int:
    if reduction == MEAN or reduction is None:
        return mean_flops(n, 1)
    if reduction == SUM:
        return reduce_flops(n)
    return 0


def _elementwise_loss(call: OpCall) -> Cost:
    n = call.tensor("self").numel
    flops = PER_ELEMENT[call.op] * n + _reduction(n, call.arg("reduction", MEAN))
    flops += n * (maybe_tensor(call, "weight") is not None) + 2 * n * (maybe_tensor(call, "pos_weight") is not None)
    return Cost.from_flops(flops)


def nll_flops(targets: int, weighted: bool, reduction: Any) -> int:
    """Pick -x[t] and accumulate: 1 per target; a class weight adds a multiply and a
    weight-total add per target; mean adds one divide."""
    flops = targets + 2 * targets * weighted
    return flops + (1 if reduction == MEAN or reduction is None else 0)


def _nll(call: OpCall) -> Cost:
    targets = call.tensor("target").numel
    return Cost.from_flops(nll_flops(targets, maybe_tensor(call, "weight") is not None, call.arg("reduction", MEAN)))


def _cross_entropy(call: OpCall) -> Cost:
    """log_softmax over the class dim + nll_loss; label smoothing adds the class sum of
    the log-probabilities (N), its reduction (targets) and the blend (3)."""
    x, targets = call.tensor("self"), call.tensor("target")
    reduction = call.arg("reduction", MEAN)
    weighted = maybe_tensor(call, "weight") is not None
    if targets.shape == x.shape and x.ndim > 1:  # class probabilities as targets
        flops = log_softmax_flops(x.numel) + 2 * x.numel + _reduction(x.numel // x.shape[1], reduction)
        return Cost.from_flops(flops)
    flops = log_softmax_flops(x.numel) + nll_flops(targets.numel, weighted, reduction)
    if call.arg("label_smoothing"):
        flops += x.numel + targets.numel + 3
    return Cost.from_flops(flops)


def _loss_backward(call: OpCall) -> Cost:
    n = call.tensor("self").numel
    return Cost.from_flops(BACKWARD[call.op] * n + n * (maybe_tensor(call, "weight") is not None))


def _nll_backward(call: OpCall) -> Cost:
    # scatter -weight[t] * g (/ total) into grad_input: 1 per target
    return Cost.from_flops(call.tensor("target").numel)


def register(registry: HandlerRegistry) -> None:
    registry.register(list(PER_ELEMENT), _elementwise_loss)
    registry.register(
        ["aten::nll_loss", "aten::nll_loss_forward", "aten::nll_loss2d", "aten::nll_loss2d_forward", "aten::nll_loss_nd"],
        _nll,
    )
    registry.register("aten::cross_entropy_loss", _cross_entropy)
    registry.register(list(BACKWARD), _loss_backward)
    registry.register(["aten::nll_loss_backward", "aten::nll_loss2d_backward"], _nll_backward)
