"""Contractions: linear, the mm family, matmul, einsum, tensordot, bilinear, grouped mm.

MACs = output elements x contracted size; bias/``self`` adds of addmm-style ops are
not counted (see docs/conventions.md), so these ops always have flops == 2 * macs.
With a complex operand every MAC is 4 real MACs (:func:`complex_contraction`).
"""

from __future__ import annotations

from math import prod
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from flopcount.core.registry import HandlerRegistry
from flopcount.handlers._common import Shape, broadcast, complex_contraction, matmul_macs, maybe_tensor
from flopcount.types import Cost, Handler, OpCall, TensorMeta

__all__ = ["register", "einsum_cost", "linear_macs", "sparse_product"]


def linear_macs(input_shape: Shape, weight_shape: Shape) -> int:
    """``F.linear``: rows of input x in_features x out_features (weight (out, in) or (in,))."""
    out_features = weight_shape[0] if len(weight_shape) == 2 else 1
    return prod(input_shape[:-1]) * input_shape[-1] * out_features


def _linear(call: OpCall) -> Cost:
    # input (*, in), weight (out, in); the bias add is not counted.
    return Cost.from_macs(linear_macs(call.tensor("input").shape, call.tensor("weight").shape))


def _two(left: str, right: str, macs: Callable[[TensorMeta, TensorMeta], int]) -> Handler:
    """``macs(left, right)`` of the operands named ``left`` and ``right`` in the schema."""
    return lambda call: Cost.from_macs(macs(call.tensor(left), call.tensor(right)))


def _product(left: str, right: str) -> Handler:
    """``left @ right``: (n, m) @ (m, p) -> n*m*p, batched (b, n, m) @ (b, m, p) -> b*n*m*p
    (addbmm also sums over b inside the MACs), (n, m) @ (m,) -> n*m; the added ``self`` and
    the alpha/beta scales of addmm-style ops are not counted."""
    return _two(left, right, lambda a, b: matmul_macs(a.shape, b.shape))


def _dot(call: OpCall) -> Cost:
    # (n,) . (n,) -> n
    return Cost.from_macs(call.tensor("self").numel)


def _inner(call: OpCall) -> Cost:
    # contracts the last dims: (*a, k) x (*b, k) -> a_rows * b_rows * k
    a, b = call.tensor("self"), call.tensor("other")
    if a.ndim == 0 or b.ndim == 0:
        return Cost.from_macs(max(a.numel, b.numel))
    return Cost.from_macs(a.numel * b.numel // a.shape[-1])


def _tensordot(call: OpCall) -> Cost:
    # free dims of self x free dims of other x contracted dims
    a, b = call.tensor("self").shape, call.tensor("other").shape
    dims_a = {d % len(a) for d in call.arg("dims_self") or ()}
    dims_b = {d % len(b) for d in call.arg("dims_other") or ()}
    free_a = prod(s for i, s in enumerate(a) if i not in dims_a)
    free_b = prod(s for i, s in enumerate(b) if i not in dims_b)
    return Cost.from_macs(free_a * free_b * prod(a[i] for i in dims_a))


def _bilinear(call: OpCall) -> Cost:
    """input1 (*, in1), input2 (*, in2), weight (out, in1, in2): rows x out x in1 x in2 MACs;
    a bias is a separate ``aten::add`` in its decomposition: rows x out FLOPs."""
    x1, x2, w = call.tensor("input1").shape, call.tensor("input2").shape, call.tensor("weight").shape
    rows = prod(broadcast(x1[:-1], x2[:-1]))
    bias = rows * w[0] if maybe_tensor(call, "bias") is not None else 0
    return Cost.from_macs(rows * w[0] * w[1] * w[2]) + Cost.from_flops(bias)


def _trilinear(call: OpCall) -> Cost:
    """``aten::_trilinear`` (nn.Bilinear under dispatch): each input is unsqueezed at its
    ``expand`` dims; MACs = the product of the broadcast index space (i1 * i2 * i3 summed
    over ``sumdim``), i.e. rows x out x in1 x in2 for a bilinear layer."""
    shapes = []
    for tensor, expand in (("i1", "expand1"), ("i2", "expand2"), ("i3", "expand3")):
        shape = list(call.tensor(tensor).shape)
        for dim in sorted(call.arg(expand) or ()):
            shape.insert(dim, 1)
        shapes.append(tuple(shape))
    return Cost.from_macs(prod(broadcast(*shapes)))


def grouped_mm_macs(a: Shape, b: Shape) -> int:
    """``torch._grouped_mm(a, b, offs)``: the groups partition rows, columns or the
    contracted dim, so the total is that of one matmul over all of them:
    2-D x 3-D (M, K) x (G, K, N): M*K*N; 3-D x 2-D (G, M, K) x (K, N): M*K*N;
    2-D x 2-D (M, K) x (K, N) with K split: M*K*N; 3-D x 3-D (G, M, K) x (G, K, N): G*M*K*N."""
    if len(a) == 2 and len(b) == 3:
        return a[0] * a[1] * b[2]
    if len(a) == 3 and len(b) == 2:
        return a[1] * a[2] * b[1]
    if len(a) == 2 and len(b) == 2:
        return a[0] * a[1] * b[1]
    if len(a) == 3 and len(b) == 3:
        return a[0] * a[1] * a[2] * b[2]
    raise ValueError(f"grouped mm takes 2-D or 3-D operands, got {a} and {b}")


def _grouped(left: str, right: str, products: int = 1) -> Handler:
    """``products`` grouped products of ``left`` and ``right`` (:func:`grouped_mm_macs`)."""
    return _two(left, right, lambda a, b: products * grouped_mm_macs(a.shape, b.shape))


# -- einsum -------------------------------------------------------------------------------


def _parse_equation(equation: str, shapes: Sequence[Shape]) -> Tuple[List[str], str, Dict[str, int]]:
    """Operand subscripts, output subscripts and letter sizes, with "..." expanded into
    private placeholder characters (broadcast sizes) and the implicit output filled in."""
    equation = equation.replace(" ", "")
    lhs, arrow, rhs = equation.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(shapes):
        raise ValueError(f"einsum equation {equation!r} has {len(terms)} operands, got {len(shapes)} tensors")
    ell_ndim = max((len(s) - len(t.replace("...", "")) for t, s in zip(terms, shapes) if "..." in t), default=0)
    ell = "".join(chr(0x2460 + i) for i in range(ell_ndim))  # characters no equation uses
    sizes: Dict[str, int] = {}
    expanded: List[str] = []
    for term, shape in zip(terms, shapes):
        if "..." in term:
            n = len(shape) - len(term.replace("...", ""))
            term = term.replace("...", ell[ell_ndim - n:] if n else "")
        if len(term) != len(shape):
            raise ValueError(f"einsum subscripts {term!r} do not match shape {tuple(shape)}")
        for letter, size in zip(term, shape):
            if size != 1 or letter not in sizes:
                sizes[letter] = size
        expanded.append(term)
    if arrow:
        out = rhs.replace("...", ell)
    else:
        counts = "".join(expanded)
        out = ell + "".join(sorted(c for c in set(counts) if counts.count(c) == 1 and c not in ell))
    return expanded, out, sizes


def einsum_cost(equation: str, shapes: Sequence[Shape], path: Optional[Sequence[int]] = None) -> Cost:
    """einsum as torch evaluates it: operands contracted pairwise (left to right, or along
    ``path``); each pair costs the product of the sizes of every letter in either operand.
    A letter summed away that occurs in one operand only is summed first (1 FLOP per
    element of that operand after its repeated letters are taken as diagonals, as torch
    does with a view and a sum) and is not part of the MACs. A single operand costs those
    elements in FLOPs when some letter is summed (``"ii"``: n, the trace), else 0."""
    terms, out, sizes = _parse_equation(equation, shapes)
    operands = list(terms)
    flops = 0
    macs = 0

    def needed_elsewhere(letter: str, skip: Sequence[int]) -> bool:
        return letter in out or any(letter in t for i, t in enumerate(operands) if i not in skip)

    # Pre-sum letters private to one operand.
    for i, term in enumerate(operands):
        private = [c for c in set(term) if not needed_elsewhere(c, (i,))]
        if private:
            flops += prod(sizes[c] for c in set(term))  # a repeated letter is a diagonal (a view)
            operands[i] = "".join(c for c in term if c not in private)
    if len(operands) == 1:
        return Cost.from_flops(flops)
    pairs = list(path) if path else []
    pair_list = [(pairs[j], pairs[j + 1]) for j in range(0, len(pairs) - 1, 2)] if pairs else []
    while len(operands) > 1:
        i, j = pair_list.pop(0) if pair_list else (0, 1)
        a, b = operands[i], operands[j]
        letters = set(a) | set(b)
        macs += prod(sizes[c] for c in letters)
        kept = "".join(c for c in sorted(letters) if needed_elsewhere(c, (i, j)))
        operands = [t for k, t in enumerate(operands) if k not in (i, j)] + [kept]
    return Cost(macs=macs, flops=2 * macs + flops)


def _einsum(call: OpCall) -> Cost:
    tensors = call.arg("tensors") or ()
    return einsum_cost(call.arg("equation"), [t.shape for t in tensors], call.arg("path"))


def chain_macs(shapes: Sequence[Shape]) -> int:
    """``linalg.multi_dot`` / ``chain_matmul`` of matrices (d0, d1), (d1, d2) ... (a 1-D first
    operand is a row (1, n), a 1-D last one a column (n, 1)): torch multiplies them in the
    order of fewest multiply-adds, so the MACs are the matrix-chain minimum over the
    splits k of cost(i..k) + cost(k+1..j) + d_i d_(k+1) d_(j+1); for three,
    min(d0 d1 d2 + d0 d2 d3, d1 d2 d3 + d0 d1 d3)."""
    if len(shapes) < 2:
        return 0
    first, last = shapes[0], shapes[-1]
    dims = [first[0] if len(first) == 2 else 1] + [s[-1] for s in shapes[:-1]]
    dims.append(last[-1] if len(last) == 2 else 1)
    n = len(shapes)
    cost = [[0] * n for _ in range(n)]
    for length in range(1, n):
        for i in range(n - length):
            j = i + length
            cost[i][j] = min(cost[i][k] + cost[k + 1][j] + dims[i] * dims[k + 1] * dims[j + 1] for k in range(i, j))
    return cost[0][n - 1]


def _kron(call: OpCall) -> Cost:
    """``kron(a, b)``: one multiply per output element (torch runs it as a broadcast ``mul``;
    the shapes are padded with leading 1s to the same rank, out_i = a_i x b_i)."""
    a, b = call.tensor("self").shape, call.tensor("other").shape
    rank = max(len(a), len(b))
    a, b = (1,) * (rank - len(a)) + tuple(a), (1,) * (rank - len(b)) + tuple(b)
    return Cost.from_flops(prod(x * y for x, y in zip(a, b)))


def _chain(name: str) -> Handler:
    return lambda call: Cost.from_macs(chain_macs([t.shape for t in call.arg(name) or ()]))


def sparse_product(a: TensorMeta, b: TensorMeta) -> Optional[int]:
    """MACs of ``a @ b`` (2-D, or a matrix times a vector) with one sparse operand: one
    multiply-add per stored value of the sparse operand and column (row) of the dense one:
    sparse (M x K, S stored) @ dense (K x N) = S x N; dense (M x K) @ sparse (K x N) = M x S.
    S counts stored values, so an explicit zero stored in the tensor counts, and a BSR/BSC
    tensor's S is its blocks x block area. None (unsupported) when both are sparse (the
    work depends on how the non-zeros meet), when S is unknown (fake/meta sparse tensors),
    or for batched sparse operands."""
    if a.sparse and b.sparse:
        return None
    sparse, dense = (a, b) if a.sparse else (b, a)
    if sparse.nnz is None or sparse.ndim != 2 or dense.ndim not in (1, 2):
        return None
    if sparse is a:  # (M x K) @ (K x N) or (K,): each stored a[i, k] meets row k of b
        return sparse.nnz * (dense.shape[1] if dense.ndim == 2 else 1)
    if dense.ndim == 1:  # (K,) @ (K x N): each stored b[k, j] meets a[k]
        return sparse.nnz
    return dense.shape[0] * sparse.nnz


def _sparse_aware(handler: Handler, left: str, right: str) -> Handler:
    """``handler`` for dense operands; :func:`sparse_product` when ``left`` or ``right`` is sparse."""

    def wrapped(call: OpCall) -> Optional[Cost]:
        a, b = maybe_tensor(call, left), maybe_tensor(call, right)
        if (a is None) != (b is None) and call.arg(left if a is None else right) is None:
            # one operand without shape or values (jit types a sparse tensor made inside the
            # forward so): what it costs is unknown
            return None
        if (a is not None and a.sparse) or (b is not None and b.sparse):
            if a is None or b is None:
                return None
            macs = sparse_product(a, b)
            return None if macs is None else Cost.from_macs(macs)
        return handler(call)

    wrapped.__doc__ = handler.__doc__
    wrapped.__name__ = getattr(handler, "__name__", "handler")
    return wrapped  # type: ignore[return-value]  # None = unsupported, as the registry allows


def _sparse_only(left: str, right: str) -> Handler:
    """A kernel that only runs with a sparse operand (``torch.sparse.mm``'s ``_sparse_addmm``...)."""

    def handler(call: OpCall) -> Cost:
        raise KeyError(f"{call.op}: operands {left!r} and {right!r} are not sparse")

    return _sparse_aware(handler, left, right)


def register(registry: HandlerRegistry) -> None:
    def add(ops, handler, operands=None) -> None:  # type: ignore[no-untyped-def]
        if operands is not None:
            handler = _sparse_aware(handler, *operands)
        registry.register(ops, complex_contraction(handler))

    add("aten::linear", _linear)
    for ops, operands in ((["aten::mm", "aten::bmm"], ("self", "mat2")), ("aten::addmm", ("mat1", "mat2")),
                          ("aten::matmul", ("self", "other")), ("aten::mv", ("self", "vec")), ("aten::addmv", ("mat", "vec"))):
        add(ops, _product(*operands), operands)
    add(["aten::baddbmm", "aten::addbmm"], _product("batch1", "batch2"))
    # torch.sparse.mm / torch.sspaddmm / torch.hspmm and the kernels sparse @ dense reaches
    add("aten::_sparse_mm", _sparse_only("sparse", "dense"))
    add(["aten::_sparse_addmm", "aten::sspaddmm", "aten::hspmm"], _sparse_only("mat1", "mat2"))
    add("aten::smm", _sparse_only("self", "mat2"))
    add(["aten::dot", "aten::vdot"], _dot)
    add("aten::inner", _inner)
    # (n,) x (m,) -> n*m products (contracted size 1); addr's added ``self`` and scales not counted
    outer = lambda a, b: a.numel * b.numel  # noqa: E731
    add(["aten::outer", "aten::ger"], _two("self", "vec2", outer))
    add("aten::addr", _two("vec1", "vec2", outer))
    add("aten::tensordot", _tensordot)
    add("aten::bilinear", _bilinear)
    add("aten::_trilinear", _trilinear)
    add("aten::einsum", _einsum)
    add("aten::linalg_multi_dot", _chain("tensors"))
    add("aten::chain_matmul", _chain("matrices"))
    add("aten::_int_mm", _product("self", "mat2"))  # int8 (M, K) @ (K, N) accumulated in int32: M*K*N MACs
    registry.register("aten::kron", _kron)  # jit; the dispatch tracer sees its mul
    add("aten::_scaled_mm", _product("self", "mat2"))  # (M, K) @ (K, N) with scales folded in, as torch's flop counter
    # the scales of _scaled_grouped_mm are folded into the product, like alpha
    add(["aten::_grouped_mm", "aten::_scaled_grouped_mm"], _grouped("self", "mat2"))
    # transformers::grouped_mm_fallback(input (S, K), weight (G, K, N), offs): S*K*N; its backward
    # grad_input (S, N) x (G, N, K) and grad_weight (K, S) x (S, N) split by offs: 2*S*K*N
    add("transformers::grouped_mm_fallback", _grouped("input", "weight"))
    add("transformers::grouped_mm_fallback_backward", _grouped("input", "weight", 2))
