"""The ops optimizers run: multi-tensor (``_foreach_*``) ops and the fused optimizer kernels.

A ``_foreach_X`` op applies ``X`` to each tensor of its ``self`` list: it costs the sum over
the list of what ``X`` costs on that tensor (the per-element constant of
:data:`~flopcount.handlers.pointwise.PER_ELEMENT`, integer tensors 0, complex ones as
``X`` on complex). A fused kernel (``_fused_adam_``, ``_fused_adamw_``, ``_fused_sgd_``,
``_fused_adagrad_``) costs per parameter element what the single-tensor loop of the same
optimizer runs, counted from its primitives (docs/conventions.md, "Optimizers").
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Tuple

from flopcount.core.registry import HandlerRegistry
from flopcount.handlers._common import is_complex
from flopcount.handlers.pointwise import INTEGER_DTYPES, PER_ELEMENT, complex_flops
from flopcount.handlers.reduce import norm_flops
from flopcount.types import Cost, Handler, OpCall, TensorMeta

__all__ = ["register", "ADAM", "SGD_UPDATE", "ADAGRAD"]


# Adam per element (torch/optim/adam.py, single-tensor loop): exp_avg.lerp_(grad, 1-b1) 3;
# exp_avg_sq.mul_(b2).addcmul_(grad, grad, 1-b2) 1 + 2; denom = sqrt / bias_correction2_sqrt
# + eps 3; param.addcdiv_(exp_avg, denom, -step_size) 2. The step counter's += 1 is 1 per tensor.
ADAM = 11
# weight decay: AdamW param.mul_(1 - lr*wd), Adam grad.add(param, alpha=wd), SGD the same add: 1
WEIGHT_DECAY = 1
# amsgrad: torch.maximum(max_exp_avg_sq, exp_avg_sq) 1
AMSGRAD = 1
# SGD: param.add_(update, alpha=-lr) 1; momentum buf.mul_(m).add_(grad, alpha=1-d) 2;
# nesterov grad.add(buf, alpha=m) 1
SGD_UPDATE = 1
SGD_MOMENTUM = 2
SGD_NESTEROV = 1
# Adagrad: state_sum.addcmul_(grad, grad, 1) 2; std = sqrt().add_(eps) 2; param.addcdiv_(grad, std, -clr) 2
ADAGRAD = 6


def _tensors(value: Any) -> Tuple[TensorMeta, ...]:
    if isinstance(value, TensorMeta):
        return (value,)
    return tuple(v for v in value if isinstance(v, TensorMeta)) if isinstance(value, (tuple, list)) else ()


def _floating(tensors: Iterable[TensorMeta]) -> Iterable[TensorMeta]:
    return (t for t in tensors if t.dtype not in INTEGER_DTYPES)


def foreach_of(single: str) -> Handler:
    """The handler of ``_foreach_<single>``: the single op's per-element cost, summed over ``self``."""
    per = PER_ELEMENT[f"aten::{single}"]

    def handler(call: OpCall) -> Cost:
        tensors = _floating(_tensors(call.arg("self")))
        return Cost.from_flops(sum((complex_flops(f"aten::{single}", per) if is_complex(t) else per) * t.numel for t in tensors))

    handler.__doc__ = f"{per} FLOP(s) per element of each tensor in ``self`` (aten::{single} applied per tensor)."
    return handler


def _foreach_norm(roots: int) -> Handler:
    """``norm`` of each tensor: its norm cost with one output element (``roots`` 1) per
    tensor; ``powsum``, sum(|x|^ord), is a norm without its root (0)."""

    def handler(call: OpCall) -> Cost:
        order = call.arg("ord", 2)
        return Cost.from_flops(sum(norm_flops(t.numel, roots, order) for t in _floating(_tensors(call.arg("self")))))

    return handler


def _foreach_mm(call: OpCall) -> Cost:
    """One matrix product per pair (n, k) x (k, m): n*k*m MACs each."""
    pairs = zip(_tensors(call.arg("self")), _tensors(call.arg("mat2", call.arg("other"))))
    return Cost.from_macs(sum(a.shape[0] * a.shape[1] * b.shape[1] for a, b in pairs if a.ndim == 2 and b.ndim == 2))


def _fused(per_element: Callable[[OpCall], int]) -> Handler:
    """``per_element(call)`` FLOPs per element of the floating tensors of ``self``."""
    return lambda call: Cost.from_flops(per_element(call) * sum(t.numel for t in _floating(_tensors(call.arg("self")))))


def _flagged(base: int, **extra: int) -> Callable[[OpCall], int]:
    """``base`` FLOPs per element, plus each ``extra`` whose argument is set (``weight_decay=``...)."""
    return lambda call: base + sum(flops for name, flops in extra.items() if call.arg(name))


def _sgd_per_element(call: OpCall) -> int:
    per = SGD_UPDATE + (WEIGHT_DECAY if call.arg("weight_decay") else 0)
    if call.arg("momentum"):
        # the first step copies the gradient into the buffer instead of updating it
        per += (0 if call.arg("is_first_step") else SGD_MOMENTUM) + (SGD_NESTEROV if call.arg("nesterov") else 0)
    return per


def register(registry: HandlerRegistry) -> None:
    for name in sorted(_FOREACH_POINTWISE):
        registry.register(f"aten::_foreach_{name}", foreach_of(name))
    registry.register("aten::_foreach_norm", _foreach_norm(1))
    registry.register("aten::_foreach_powsum", _foreach_norm(0))
    registry.register("aten::_foreach_max", _fused(lambda call: 1))  # the maximum: one comparison per element
    registry.register("aten::_foreach_mm", _foreach_mm)
    registry.register_zero(["aten::_foreach_zero", "aten::_foreach_copy", "aten::_foreach_clone"])
    registry.register(["aten::_fused_adam", "aten::_fused_adamw"], _fused(_flagged(ADAM, weight_decay=WEIGHT_DECAY, amsgrad=AMSGRAD)))
    registry.register("aten::_fused_sgd", _fused(_sgd_per_element))
    registry.register("aten::_fused_adagrad", _fused(_flagged(ADAGRAD, weight_decay=WEIGHT_DECAY)))


# The single ops that have a _foreach_ spelling in torch (torch._C._jit_get_all_schemas()).
_FOREACH_POINTWISE = frozenset(
    {
        "abs", "acos", "add", "addcdiv", "addcmul", "asin", "atan", "ceil", "clamp_max", "clamp_min", "cos", "cosh",
        "div", "erf", "erfc", "exp", "expm1", "floor", "frac", "lerp", "lgamma", "log", "log10", "log1p", "log2",
        "maximum", "minimum", "mul", "neg", "pow", "reciprocal", "round", "rsqrt", "sigmoid", "sign", "sin", "sinh",
        "sqrt", "sub", "tan", "tanh", "trunc",
    }
)
