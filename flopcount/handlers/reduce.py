"""Reductions, scans, softmax and friends.

N = input elements, M = output elements. A reduction costs one FLOP per input element
(an add, a compare...); ``mean`` adds one divide per output element. The constants are
written once here (``mean_flops``, ``softmax_flops``...) and reused by the norm and loss
families, so a composite op costs the sum of the pieces it decomposes into.
"""

from __future__ import annotations

import math
from math import prod
from typing import Any, Tuple

from flopcount.core.registry import HandlerRegistry
from flopcount.handlers._common import COMPLEX_ADD, broadcast, first_output, is_complex, maybe_tensor, per_grad_output
from flopcount.handlers.pointwise import complex_flops, per_element
from flopcount.types import Cost, Handler, OpCall, TensorMeta

__all__ = [
    "register",
    "reduce_flops",
    "norm_flops",
    "mean_flops",
    "var_flops",
    "softmax_flops",
    "log_softmax_flops",
    "SOFTMAX",
]

SOFTMAX = 5  # per input element: max, subtract, exp, sum, divide
LOG_SOFTMAX = 5  # per input element: max, subtract, exp, sum, subtract (log per row not counted)
SOFTMAX_BACKWARD = 4  # y * (g - sum(g * y)): multiply, sum, subtract, multiply
LOG_SOFTMAX_BACKWARD = 4  # g - exp(y) * sum(g): sum, exp, multiply, subtract


def reduce_flops(n: int) -> int:
    """sum / prod / amax / argmax / any ...: one op per input element."""
    return n


def mean_flops(n: int, m: int) -> int:
    """sum (N) + one divide per output element (M)."""
    return n + m


def var_flops(n: int, m: int) -> int:
    """mean (N + M) + subtract, square, sum (3N) + divide (M) = 4N + 2M."""
    return 4 * n + 2 * m


def softmax_flops(n: int) -> int:
    return SOFTMAX * n


def log_softmax_flops(n: int) -> int:
    return LOG_SOFTMAX * n


def _input(call: OpCall) -> TensorMeta:
    return maybe_tensor(call, "self") or maybe_tensor(call, "input") or call.tensors()[0]


def _out_elements(call: OpCall) -> int:
    out = first_output(call)
    if out is not None:
        return out.numel
    x = _input(call)
    dims = call.arg("dim")
    if dims is None or dims == ():
        return 1
    if isinstance(dims, int):
        dims = (dims,)
    reduced = {d % max(x.ndim, 1) for d in dims}
    return prod(s for i, s in enumerate(x.shape) if i not in reduced)


_ELEMENTWISE = per_element(1)  # max(self, other) is the elementwise maximum


#: complex input: an add of complex numbers is 2 real adds, a product 6 real FLOPs
COMPLEX_REDUCE = {"aten::prod": 6, "aten::cumprod": 6}


def _reduce(call: OpCall) -> Cost:
    x = _input(call)
    factor = COMPLEX_REDUCE.get(call.op.removesuffix("_"), COMPLEX_ADD) if is_complex(x) else 1
    return Cost.from_flops(factor * reduce_flops(x.numel))


def _max_min(call: OpCall) -> Cost:
    # aten::max(self, other) is elementwise (1 per output); max(self[, dim]) a reduction.
    return _ELEMENTWISE(call) if isinstance(call.arg("other"), TensorMeta) else _reduce(call)


def _mean(call: OpCall) -> Cost:
    x = _input(call)
    factor = COMPLEX_ADD if is_complex(x) else 1  # complex sum and divide-by-count: 2 real ops each
    return Cost.from_flops(factor * mean_flops(x.numel, _out_elements(call)))


def _nanmean(call: OpCall) -> Cost:
    """``nansum(x) / (x == x).sum()`` as torch runs it (ReduceOps.cpp, composite: jit records
    it whole, the dispatch tracer sees these ops): the not-NaN test ``ne`` and its count (N
    each), nansum (N), a divide per output element (M)."""
    n, m = _input(call).numel, _out_elements(call)
    parts = (("aten::ne", n), ("aten::sum", n), ("aten::nansum", n), ("aten::div", m))
    return Cost.split(*((op, Cost.from_flops(flops)) for op, flops in parts))


def _segment_reduce(call: OpCall) -> Cost:
    """One op per data element into its segment; "mean" + a divide per output element."""
    flops = call.tensor("data").numel
    if call.arg("reduce") == "mean":
        flops += _out_elements(call)
    return Cost.from_flops(flops)


def _var(roots: int) -> Handler:
    """var_flops(N, M), and ``roots`` square roots per output element (std: 1)."""

    def handler(call: OpCall) -> Cost:
        m = _out_elements(call)
        return Cost.from_flops(var_flops(_input(call).numel, m) + roots * m)

    return handler


def norm_flops(n: int, m: int, p: Any) -> int:
    """p=2 (default, 'fro'): square, sum, sqrt = 2N + M; p in {1, inf, -inf, 0}: |x| or
    x != 0, then sum/max = 2N; other p: |x|, pow, sum = 3N, plus a root per output = M."""
    if p is None or p == 2 or p == "fro":
        return 2 * n + m
    return 2 * n if p in (1, 0) or (isinstance(p, float) and math.isinf(p)) else 3 * n + m


def _norm(call: OpCall) -> Cost:
    return Cost.from_flops(norm_flops(_input(call).numel, _out_elements(call), call.arg("p", call.arg("ord"))))


def sort_flops(n: int, length: int) -> int:
    """Sorting ``n`` elements in rows of ``length``: N * ceil(log2(L)) comparisons."""
    return n * max(1, math.ceil(math.log2(length))) if length > 1 else 0


def _sort(call: OpCall) -> Cost:
    x = _input(call)
    if x.ndim == 0:
        return Cost()
    dim = call.arg("dim", -1)
    return Cost.from_flops(sort_flops(x.numel, x.shape[(dim if dim is not None else -1) % x.ndim]))


def _msort(call: OpCall) -> Cost:
    """msort sorts along the first dim (``sort(x, dim=0)``); its schema has no ``dim``."""
    x = _input(call)
    return Cost.from_flops(sort_flops(x.numel, x.shape[0])) if x.ndim else Cost()


#: per-output FLOPs after the shared gather, by interpolation, as the decomposition runs
#: them: masked_fill (1) + sub, ceil, lerp (5) for linear; + round/floor/ceil (1) for
#: the index modes; + sub, ceil, lerp(0.5) for midpoint. nanquantile adds the per-row
#: valid count scale (mul) and a lt test per output.
QUANTILE_PER_OUTPUT = {"linear": 6, "lower": 2, "higher": 2, "nearest": 2, "midpoint": 5}


def _quantile(call: OpCall) -> Cost:
    """quantile/nanquantile over L elements per row (the whole tensor when ``dim`` is
    None), Q quantiles, O = rows x Q outputs: sort (N ceil(log2 L)) + isnan and any/sum
    (2N) + quantile plumbing, exactly the decomposition: quantile Q + k O, nanquantile
    (k + 2) O, k from :data:`QUANTILE_PER_OUTPUT`."""
    x = _input(call)
    dim = call.arg("dim")
    length = x.numel if dim is None or x.ndim == 0 else x.shape[int(dim) % x.ndim]
    rows = x.numel // length if length else 0
    q = call.arg("q")
    quantiles = q.numel if isinstance(q, TensorMeta) else 1
    outputs = rows * quantiles
    sort = sort_flops(x.numel, length)
    per = QUANTILE_PER_OUTPUT.get(call.arg("interpolation") or "linear", QUANTILE_PER_OUTPUT["linear"])
    if call.op == "aten::nanquantile":
        return Cost.from_flops(sort + 2 * x.numel + (per + 2) * outputs)
    return Cost.from_flops(sort + 2 * x.numel + quantiles + per * outputs)


def _along(call: OpCall, name: str = "y") -> Tuple[TensorMeta, int, int]:
    x = call.tensor(name)
    dim = int(call.arg("dim", -1)) % max(x.ndim, 1)
    length = x.shape[dim] if x.ndim else 1
    return x, length, (x.numel // length if length else 0)


def _spacing(call: OpCall, x: TensorMeta, length: int) -> int:
    """diff(x) along the integration dim: L - 1 subtracts per row of ``x`` (1-D or full)."""
    if x.ndim <= 1:
        return length - 1
    dim = int(call.arg("dim", -1)) % x.ndim
    return (length - 1) * (x.numel // x.shape[dim] if x.shape[dim] else 0)


def _trapezoid(call: OpCall) -> Cost:
    """Its decomposition over L samples in R rows: uniform spacing (``dx``): sum (N) + the
    end-point half terms (4R); sample points ``x``: diff(x) (x's L - 1 per x row) +
    (y[1:] + y[:-1]) * dx, sum (3R(L - 1)) + a halving per row (R)."""
    y, length, rows = _along(call)
    x = maybe_tensor(call, "x")
    if x is None:
        return Cost.from_flops(y.numel + 4 * rows)
    return Cost.from_flops(_spacing(call, x, length) + 3 * rows * (length - 1) + rows)


def _cumulative_trapezoid(call: OpCall) -> Cost:
    """add, multiply, cumsum over the L - 1 intervals (3R(L - 1)); with sample points,
    + diff(x) + a halving per interval."""
    _, length, rows = _along(call)
    x = maybe_tensor(call, "x")
    flops = 3 * rows * (length - 1)
    if x is not None:
        flops += _spacing(call, x, length) + rows * (length - 1)
    return Cost.from_flops(flops)


def _diff(call: OpCall) -> Cost:
    """n-th difference along ``dim`` (after prepend/append): one subtract per element of
    each successive difference, R x sum_{k=1..n} (L - k)."""
    x, length, rows = _along(call, "self")
    dim = int(call.arg("dim", -1)) % max(x.ndim, 1)
    for extra in ("prepend", "append"):
        t = maybe_tensor(call, extra)
        if t is not None:
            length += t.shape[dim] if t.ndim == x.ndim else 1
    n = int(call.arg("n", 1))
    return Cost.from_flops(rows * sum(max(length - k, 0) for k in range(1, n + 1)))


def _vecdot(call: OpCall) -> Cost:
    """linalg.vecdot(x, y, dim) on the broadcast shape (N elements), as torch decomposes it,
    ``(x.conj() * y).sum(dim)`` (the dispatch tracer sees those two ops; jit records the
    composite): the product N (complex 6N) and the sum N (complex 2N). Its operands are
    floating or complex of one dtype (torch refuses anything else)."""
    x, y = call.tensor("x"), call.tensor("y")
    n = prod(broadcast(x.shape, y.shape))
    product, add = (complex_flops("aten::mul", 1), COMPLEX_ADD) if is_complex(x) else (1, 1)
    return Cost.split(("aten::mul", Cost.from_flops(product * n)), ("aten::sum", Cost.from_flops(add * n)))


def _dist(call: OpCall) -> Cost:
    # norm(self - other, p): subtract (N) + the norm
    n = prod(broadcast(call.tensor("self").shape, call.tensor("other").shape))
    p = call.arg("p")
    return Cost.from_flops(n + (2 * n + 1 if p in (None, 2) else 3 * n + 1))


def register(registry: HandlerRegistry) -> None:
    registry.register(
        [
            "aten::sum", "aten::nansum", "aten::prod", "aten::amax", "aten::amin", "aten::argmax", "aten::argmin",
            "aten::all", "aten::any", "aten::count_nonzero", "aten::cumsum", "aten::cumprod", "aten::cummax",
            "aten::cummin", "aten::median", "aten::nanmedian", "aten::kthvalue", "aten::mode", "aten::topk",
            "aten::equal", "aten::histc",
            # torch.distributions' argument checks (``_is_all_true``): an all/any over a bool tensor
            "aten::_is_all_true", "aten::_is_any_true",
        ],
        _reduce,
    )
    registry.register(["aten::max", "aten::min"], _max_min)
    registry.register("aten::aminmax", lambda call: Cost.from_flops(2 * _input(call).numel))
    registry.register("aten::mean", _mean)
    registry.register("aten::nanmean", _nanmean)
    registry.register("aten::segment_reduce", _segment_reduce)
    registry.register(["aten::var", "aten::var_mean"], _var(0))
    registry.register(["aten::std", "aten::std_mean"], _var(1))
    registry.register(["aten::norm", "aten::linalg_vector_norm", "aten::frobenius_norm"], _norm)
    # max, subtract, exp, sum (4N) + log, add back the max (2M)
    registry.register("aten::logsumexp", lambda call: Cost.from_flops(4 * _input(call).numel + 2 * _out_elements(call)))
    registry.register("aten::logcumsumexp", lambda call: Cost.from_flops(4 * _input(call).numel))
    registry.register(["aten::softmax", "aten::_softmax", "aten::_safe_softmax", "aten::special_softmax"],
                      lambda call: Cost.from_flops(softmax_flops(_input(call).numel)))
    registry.register(["aten::log_softmax", "aten::_log_softmax", "aten::special_log_softmax"],
                      lambda call: Cost.from_flops(log_softmax_flops(_input(call).numel)))
    registry.register("aten::_softmax_backward_data", per_grad_output(SOFTMAX_BACKWARD))
    registry.register("aten::_log_softmax_backward_data", per_grad_output(LOG_SOFTMAX_BACKWARD))
    registry.register(["aten::sort", "aten::argsort"], _sort)
    registry.register("aten::msort", _msort)
    registry.register("aten::dist", _dist)
    registry.register("aten::linalg_vecdot", _vecdot)
    registry.register(["aten::quantile", "aten::nanquantile"], _quantile)
    registry.register("aten::trapezoid", _trapezoid)
    registry.register("aten::cumulative_trapezoid", _cumulative_trapezoid)
    registry.register("aten::diff", _diff)
    registry.register("aten::trace", lambda call: Cost.from_flops(min(_input(call).shape)))  # the diagonal's sum
