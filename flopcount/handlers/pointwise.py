"""Elementwise arithmetic, comparisons, activations, dropout and their backward ops.

Cost = a per-element constant x output elements (the output's numel, so broadcasting
is handled). Every arithmetic primitive -- including exp, log, sqrt, tanh, erf, a
comparison, a select -- counts 1; composite activations count the primitives of their
textbook formula. The constants live in :data:`PER_ELEMENT`; docs/conventions.md lists
them with the formula each is counted from.
"""

from __future__ import annotations

from math import prod
from typing import Callable, Dict, Tuple

from flopcount.core.registry import HandlerRegistry
from flopcount.handlers._common import any_complex, broadcast, output_numel, per_grad_output
from flopcount.types import Cost, Handler, OpCall, TensorMeta, out_of_place

__all__ = ["register", "INTEGER_DTYPES", "PER_ELEMENT", "complex_flops", "per_element", "elementwise_flops", "integer_only"]

_ONE = (
    # arithmetic; scalar factors folded into an op (add's alpha, addcmul's value) are not extra
    "add", "sub", "rsub", "mul", "div", "true_divide", "floor_divide", "remainder", "fmod",
    "neg", "negative", "abs", "absolute", "sign", "sgn", "signbit", "reciprocal", "sqrt", "rsqrt", "square",
    "pow", "float_power", "copysign", "heaviside",
    # transcendental primitives: one library call each
    "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sin", "cos", "tan", "asin", "acos", "atan",
    "arcsin", "arccos", "arctan", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "atan2", "arctan2",
    "erf", "erfc", "erfinv", "lgamma", "digamma", "i0", "sinc", "hypot",
    # rounding
    "floor", "ceil", "round", "trunc", "fix", "frac",
    # one comparison or select per element
    "clamp", "clamp_min", "clamp_max", "clip", "relu", "relu6", "hardtanh", "threshold", "hardshrink",
    "where", "masked_fill", "minimum", "maximum", "fmin", "fmax",
    "eq", "ne", "lt", "le", "gt", "ge", "greater", "greater_equal", "less", "less_equal", "not_equal",
    "logical_and", "logical_or", "logical_xor", "logical_not",
    "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not", "bitwise_left_shift", "bitwise_right_shift",
    "__and__", "__or__", "__xor__", "__lshift__", "__rshift__",
    "isnan", "isinf", "isfinite", "isneginf", "isposinf", "nan_to_num",
    # angle: a sign select for real input, atan2(imag, real) for complex
    "angle",
    # backward selects: grad where the forward passed, else 0
    "threshold_backward", "hardtanh_backward", "hardshrink_backward", "softshrink_backward",
)

PER_ELEMENT: Dict[str, int] = {f"aten::{name}": 1 for name in _ONE}
PER_ELEMENT.update(
    {
        "aten::addcmul": 2,  # self + t1*t2
        "aten::addcdiv": 2,  # self + t1/t2
        "aten::lerp": 3,  # a + w*(b - a)
        "aten::xlogy": 2,  # x * log(y)
        "aten::logit": 3,  # log(x / (1 - x))
        "aten::logaddexp": 5,  # max + log1p(exp(-|a - b|)): sub, abs, exp, log1p, add
        "aten::sigmoid": 4,  # 1 / (1 + exp(-x))
        "aten::silu": 5,  # x * sigmoid(x)
        "aten::softplus": 3,  # log(1 + exp(x))
        "aten::mish": 5,  # x * tanh(softplus(x))
        "aten::log_sigmoid": 5,  # -log(1 + exp(-x))
        "aten::log_sigmoid_forward": 5,
        "aten::celu": 5,  # elu on x/alpha
        "aten::selu": 5,  # scale * elu
        "aten::hardswish": 4,  # x * clamp(x + 3, 0, 6) / 6
        "aten::hardsigmoid": 3,  # clamp(x + 3, 0, 6) / 6
        "aten::leaky_relu": 2,  # compare + multiply
        "aten::prelu": 2,
        "aten::_prelu_kernel": 2,
        "aten::rrelu": 2,
        "aten::rrelu_with_noise": 2,  # compare + multiply (the noise draw is RNG, not counted)
        "aten::rrelu_with_noise_backward": 2,  # select, multiply by the saved slope
        "aten::softshrink": 2,  # compare + shift
        "aten::tanhshrink": 2,  # x - tanh(x)
        "aten::glu": 5,  # a * sigmoid(b), per output element
        "aten::polar": 4,  # abs * cos(angle), abs * sin(angle)
        # backward: derivative x grad, counted from the same primitives
        "aten::leaky_relu_backward": 2,  # select, multiply by slope
        # grad_input = x > 0 ? g : w*g (select, multiply); the per-element grad_weight
        # x > 0 ? 0 : x*g (select, multiply) that autograd then sums (its own op)
        "aten::_prelu_kernel_backward": 4,
        "aten::sigmoid_backward": 3,  # g * y * (1 - y)
        "aten::tanh_backward": 3,  # g * (1 - y^2)
        "aten::silu_backward": 9,  # sigmoid (4) + g * s * (1 + x*(1 - s)) (5)
        "aten::elu_backward": 3,  # select, g * (y + alpha) on the negative side
        "aten::hardswish_backward": 4,  # range test, g * (2x + 3) / 6
        "aten::hardsigmoid_backward": 2,  # range test, g / 6
        "aten::softplus_backward": 5,  # g * sigmoid(beta * x)
        "aten::mish_backward": 14,  # softplus 3, tanh 1, sech^2 2, sigmoid 4, combine 4
        "aten::log_sigmoid_backward": 3,  # g * (1 - sigmoid(x)) from the saved buffer
    }
)

# gelu: exact 0.5*x*(1 + erf(x/sqrt(2))) = 5; tanh approximation
# 0.5*x*(1 + tanh(sqrt(2/pi)*(x + 0.044715*x^3))) = 9.
GELU = {"none": 5, "tanh": 9}
# gelu backward: exact Phi(x) (4) + x*phi(x) (5) + times grad... = 11; tanh form = 17.
GELU_BACKWARD = {"none": 11, "tanh": 17}
# glu backward, per grad_output element (half the grad_input it writes): sigmoid(b) (4),
# grad_a = g*s (1), grad_b = g*a*s*(1-s) (4)
GLU_BACKWARD = 9
# dropout in training: scale the mask by 1/(1-p) and multiply = 2 per element (what the
# decomposition bernoulli_ -> div_ -> mul runs); its backward is the same two ops.
DROPOUT = 2
# alpha dropout per mask element: b = (mask - 1) * alpha*a + alpha*a*p (3) and mask * a (1);
# per input element: input * mask + b (2). aten's _dropout_impl, torch/native/Dropout.cpp.
ALPHA_DROPOUT_MASK = 4
ALPHA_DROPOUT_INPUT = 2
#: elu(x, alpha, scale, input_scale) = x > 0 ? scale*x : alpha*scale*(exp(input_scale*x) - 1):
#: compare, exp, sub, multiply by alpha = 4; a scale or input_scale other than 1 one multiply
#: more each (selu = elu with scale: 5; celu = elu with input_scale 1/alpha: 5)
ELU = 4


#: complex operands: a complex number is two reals, so an op costs twice its real
#: constant (add, sub, neg: 2 real ops), except these, counted from their real formulas
COMPLEX_PER_ELEMENT = {
    "aten::mul": 6,  # (a+bi)(c+di): 4 multiplies, 2 adds
    "aten::div": 11,  # ((ac+bd) + (bc-ad)i) / (c^2+d^2): 6 multiplies, 3 adds, 2 divides
    "aten::true_divide": 11,
    "aten::abs": 1,  # hypot(re, im), one primitive (as aten::hypot)
    "aten::absolute": 1,
    "aten::angle": 1,  # atan2(im, re)
    "aten::sgn": 3,  # z / |z|: hypot + 2 divides
    "aten::reciprocal": 5,  # conj(z) / |z|^2: 2 squares, add, 2 divides
}


def complex_flops(op: str, real: int) -> int:
    """FLOPs per element of ``op`` on complex operands, given its real constant ``real``."""
    return COMPLEX_PER_ELEMENT.get(out_of_place(op), 2 * real)


def elementwise_flops(op: str, elements: int) -> int:
    """FLOPs of ``elements`` applications of the pointwise op ``op``."""
    return PER_ELEMENT[op] * elements


INTEGER_DTYPES = frozenset({"bool", "uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64"})


def integer_only(call: OpCall) -> bool:
    """True when every tensor in and out has a known integer/bool dtype: index and shape
    arithmetic (jit records ``size`` maths on 0-d int64 tensors), not floating point."""
    metas = call.tensors() + tuple(o for o in call.outputs if isinstance(o, TensorMeta))
    return bool(metas) and all(m.dtype in INTEGER_DTYPES for m in metas)


def per_element(flops: int) -> Handler:
    """A handler costing ``flops`` per output element (0 for integer-only arithmetic)."""

    def handler(call: OpCall) -> Cost:
        if integer_only(call):
            return Cost()
        if any_complex(call):
            return Cost.from_flops(complex_flops(call.op, flops) * output_numel(call))
        return Cost.from_flops(flops * output_numel(call))

    handler.__doc__ = f"{flops} FLOP(s) per output element."
    return handler


def _on(op: str, elements: int, complex_operand: bool) -> Tuple[str, Cost]:
    """One part of a composite: ``elements`` applications of ``op`` (on complex operands when asked)."""
    per = complex_flops(op, PER_ELEMENT[op]) if complex_operand else PER_ELEMENT[op]
    return op, Cost.from_flops(per * elements)


def _isclose_parts(call: OpCall) -> Tuple[Tuple[str, Cost], ...]:
    """``isclose`` as torch runs it (TensorCompare.cpp, composite: jit records it whole, the
    dispatch tracer sees these ops), N = broadcast elements, O = ``other``'s: ``self == other``
    (N; integer and bool inputs compare as integers: 0), with ``equal_nan`` ``isnan`` of each
    input; unless rtol = atol = 0, ``atol + |rtol * other|`` (3 O, integers cast to float first)
    and ``|self - other| <= it`` where finite: sub, abs, abs + ne + eq (isfinite), le (6 N)."""
    a, b = call.tensor("self"), call.tensor("other")
    n, o = prod(broadcast(a.shape, b.shape)), b.numel
    integral, cplx = a.dtype in INTEGER_DTYPES, any_complex(call)
    parts = [("aten::eq", Cost() if integral else _on("aten::eq", n, cplx)[1])]
    if call.arg("equal_nan", False) and not integral:
        parts += [_on("aten::isnan", a.numel, cplx), _on("aten::isnan", o, cplx)]
    if call.arg("rtol", 1e-05) == 0 and call.arg("atol", 1e-08) == 0:
        return tuple(parts)
    parts += [_on("aten::mul", o, cplx), _on("aten::abs", o, cplx), _on("aten::add", o, False)]
    parts += [_on("aten::sub", n, cplx), _on("aten::abs", n, cplx)]
    parts += [_on(op, n, False) for op in ("aten::abs", "aten::ne", "aten::eq", "aten::le")]
    return tuple(parts)


def _isclose(call: OpCall) -> Cost:
    return Cost.split(*_isclose_parts(call))


def _allclose(call: OpCall) -> Cost:
    """``isclose(...).all()`` in one kernel (no op below it reaches a dispatch mode): the
    isclose parts + one ``all`` over its N elements."""
    a, b = call.tensor("self"), call.tensor("other")
    return Cost.split(*_isclose_parts(call), ("aten::all", Cost.from_flops(prod(broadcast(a.shape, b.shape)))))


def _gelu(table: Dict[str, int]) -> Handler:
    """``table[approximate]`` FLOPs per output element (unknown forms as the exact one)."""
    return lambda call: Cost.from_flops(table.get(call.arg("approximate") or "none", table["none"]) * output_numel(call))


def _elu(call: OpCall) -> Cost:
    per = ELU + sum(1 for name in ("scale", "input_scale") if call.arg(name, 1) not in (1, None))
    return Cost.from_flops(per * output_numel(call))


def _when_training(flops: Callable[[OpCall, TensorMeta], int]) -> Handler:
    """A dropout: ``flops(call, the tensor it masks)`` in training; with ``train=False`` or
    p == 0 the identity (0)."""

    def handler(call: OpCall) -> Cost:
        if call.arg("train") is False or call.arg("p") == 0:
            return Cost()
        return Cost.from_flops(flops(call, _dropped(call)))

    return handler


def _feature_mask(shape: Tuple[int, ...]) -> int:
    """Elements of feature dropout's mask: one per (sample, channel), broadcast over the rest."""
    return prod(shape[:2])


def _dropped(call: OpCall) -> TensorMeta:
    """The tensor a dropout masks: ``input``, or ``self`` in the in-place ops' schema
    (``dropout_(Tensor(a!) self, float p, bool train)``, which jit records)."""
    return call.tensor("self") if "input" not in call.args and "self" in call.args else call.tensor("input")


def _alpha_dropout(call: OpCall, x: TensorMeta) -> int:
    mask = _feature_mask(x.shape) if call.op.startswith("aten::feature_") else x.numel
    return ALPHA_DROPOUT_MASK * mask + ALPHA_DROPOUT_INPUT * x.numel


def register(registry: HandlerRegistry) -> None:
    for op, flops in PER_ELEMENT.items():
        registry.register(op, per_element(flops))
    # forward-mode AD's formulas (torch.func.jvp) combine an op's tangent terms with prims
    registry.register(["prims::add", "prims::sub", "prims::mul", "prims::div"], per_element(1))
    registry.register("aten::isclose", _isclose)
    registry.register("aten::allclose", _allclose)
    registry.register("aten::gelu", _gelu(GELU))
    registry.register("aten::gelu_backward", _gelu(GELU_BACKWARD))
    registry.register("aten::elu", _elu)
    registry.register(["aten::dropout", "aten::native_dropout"], _when_training(lambda call, x: DROPOUT * x.numel))
    # divide the (N, C, 1, ...) mask by 1-p, multiply the input by it: N*C + numel
    registry.register("aten::feature_dropout", _when_training(lambda call, x: _feature_mask(x.shape) + x.numel))
    registry.register(["aten::alpha_dropout", "aten::feature_alpha_dropout"], _when_training(_alpha_dropout))
    registry.register("aten::native_dropout_backward", per_grad_output(DROPOUT))
    registry.register("aten::glu_backward", per_grad_output(GLU_BACKWARD))
