"""Dense linear algebra: factorizations, solves, inverses, determinants, eigen and singular
value decompositions, and the distance ops (cdist, pdist, cosine similarity...).

Factorization FLOPs are the standard LAPACK operation counts, leading terms, for one
matrix, times the batch (sources: LAPACK Working Note 41, "Installation Guide for
LAPACK", appendix on operation counts; Golub & Van Loan, *Matrix Computations*, 4th ed.,
tables in sections 3.2, 4.2, 5.2, 7.5, 8.3, 8.6). A complex matrix costs 4x (a complex
multiply-add is 4 real multiplies and 4 real adds). They are FLOPs, not MACs: MACs count
the contractions of neural-network layers, and LAPACK counts FLOPs.
"""

from __future__ import annotations

from math import prod
from typing import Callable, Optional, Sequence, Tuple

from flopcount.core.registry import HandlerRegistry
from flopcount.handlers._common import broadcast, first_output, is_complex, maybe_tensor, output_numel
from flopcount.handlers.reduce import _norm, norm_flops
from flopcount.types import Cost, OpCall, TensorMeta

__all__ = [
    "cholesky_flops", "lu_flops", "pairwise_distance_cost", "qr_flops", "qr_lstsq_flops", "register", "solve_flops",
    "svd_flops", "svd_lstsq_flops",
]  # fmt: skip

COMPLEX = 4


def _mat(call: OpCall, *names: str) -> TensorMeta:
    for name in names:
        value = maybe_tensor(call, name)
        if value is not None:
            return value
    raise KeyError(f"{call.op}: none of {names} is a tensor argument")


def _batch(shape: Sequence[int]) -> int:
    return prod(shape[:-2])


def _scale(call: OpCall, flops: float, batch: int) -> Cost:
    factor = COMPLEX if any(is_complex(t) for t in call.tensors()) else 1
    return Cost.from_flops(round(flops * batch * factor))


def cholesky_flops(n: int) -> float:
    """potrf: n^3 / 3."""
    return n**3 / 3


def lu_flops(m: int, n: int) -> float:
    """getrf of an m x n matrix: m n^2 - n^3 / 3 (m >= n), n m^2 - m^3 / 3 (m < n);
    2 n^3 / 3 for a square matrix."""
    return m * n * n - n**3 / 3 if m >= n else n * m * m - m**3 / 3


def qr_flops(m: int, n: int) -> float:
    """geqrf of an m x n matrix: 2 m n^2 - 2 n^3 / 3 (m >= n), 2 n m^2 - 2 m^3 / 3 (m < n)."""
    return 2 * m * n * n - 2 * n**3 / 3 if m >= n else 2 * n * m * m - 2 * m**3 / 3


def orgqr_flops(m: int, n: int, k: int) -> float:
    """orgqr: form the m x n matrix Q from k reflectors: 4 m n k - 2 (m + n) k^2 + 4 k^3 / 3."""
    return 4 * m * n * k - 2 * (m + n) * k * k + 4 * k**3 / 3


def solve_flops(n: int, nrhs: int) -> float:
    """getrf + getrs: 2 n^3 / 3 + 2 n^2 nrhs."""
    return lu_flops(n, n) + 2 * n * n * nrhs


def triangular_solve_flops(n: int, nrhs: int) -> float:
    """trsm with an n x n triangle and nrhs right-hand sides: n^2 nrhs."""
    return n * n * nrhs


def svd_flops(m: int, n: int, compute_uv: bool, full_matrices: bool) -> float:
    """Golub-Reinsch SVD (Golub & Van Loan 8.6.3), m >= n (else transposed): values only
    4 m n^2 - 4 n^3 / 3; thin U, S, V 14 m n^2 + 8 n^3; full U, S, V 4 m^2 n + 8 m n^2 + 9 n^3."""
    if m < n:
        m, n = n, m
    if not compute_uv:
        return 4 * m * n * n - 4 * n**3 / 3
    return 4 * m * m * n + 8 * m * n * n + 9 * n**3 if full_matrices else 14 * m * n * n + 8 * n**3


def eigh_flops(n: int, vectors: bool) -> float:
    """Symmetric QR algorithm (Golub & Van Loan 8.3): 4 n^3 / 3 for eigenvalues, 9 n^3 with vectors."""
    return 9 * n**3 if vectors else 4 * n**3 / 3


def eig_flops(n: int, vectors: bool) -> float:
    """Francis QR steps to Schur form (Golub & Van Loan 7.5.6): 10 n^3 for eigenvalues,
    25 n^3 with the Schur vectors (eigenvectors)."""
    return 25 * n**3 if vectors else 10 * n**3


def _dense(fn: Callable[..., float], square: bool = True) -> Callable[[OpCall], Cost]:
    """``fn(n)`` of each n x n matrix (``square``), else ``fn(m, n)`` of each m x n one."""

    def handler(call: OpCall) -> Cost:
        a = _mat(call, "A", "self", "input")
        return _scale(call, fn(*a.shape[-1 if square else -2:]), _batch(a.shape))

    handler.__doc__ = fn.__doc__
    return handler


_slogdet = _dense(lambda n: lu_flops(n, n) + 3 * n)  # LU + |u_ii|, log, sum over the diagonal (3n)


def _logdet(call: OpCall) -> Cost:
    """slogdet + a sign test and a select per matrix (log of a negative determinant is nan)."""
    return _slogdet(call) + Cost.from_flops(2 * _batch(_mat(call, "self").shape))


def _rhs(a: TensorMeta, b: TensorMeta, left: bool) -> Tuple[int, int]:
    """(n, right-hand sides) of a solve with A (*, n, n) and B (*, n, k) or (*, n)."""
    n = a.shape[-1]
    if b.ndim == 1 or (b.ndim == a.ndim - 1 and b.shape == a.shape[:-1]):
        return n, 1
    return n, (b.shape[-1] if left else b.shape[-2])


def _solve_batch(a: TensorMeta, b: TensorMeta) -> int:
    if b.ndim >= 2 and not (b.ndim == a.ndim - 1 and b.shape == a.shape[:-1]):
        return prod(broadcast(a.shape[:-2], b.shape[:-2]))
    return prod(broadcast(a.shape[:-2], b.shape[:-1]))


def _solver(matrix: str, flops: Callable[[int, int], float]) -> Callable[[OpCall], Cost]:
    """A solve with the n x n ``matrix`` and right-hand sides ``B``: ``flops(n, nrhs)`` per matrix."""

    def handler(call: OpCall) -> Cost:
        a, b = call.tensor(matrix), call.tensor("B")
        n, k = _rhs(a, b, call.arg("left", True) is not False)
        return _scale(call, flops(n, k), _solve_batch(a, b))

    handler.__doc__ = flops.__doc__
    return handler


def lu_solve_flops(n: int, nrhs: int) -> float:
    """getrs: two triangular solves, 2 n^2 nrhs."""
    return 2 * triangular_solve_flops(n, nrhs)


def _solver_of_self(matrix: str, flops: Callable[[int, int], float]) -> Callable[[OpCall], Cost]:
    """The older spelling, ``op(B, matrix)`` with the right-hand sides ``self`` (n, nrhs):
    triangular_solve(b, A) n^2 nrhs, cholesky_solve(B, L) two triangular solves, 2 n^2 nrhs."""

    def handler(call: OpCall) -> Cost:
        b, a = call.tensor("self"), call.tensor(matrix)
        return _scale(call, flops(a.shape[-1], b.shape[-1]), _solve_batch(a, b))

    return handler


def _qr(call: OpCall) -> Cost:
    """geqrf, plus orgqr to form Q unless ``mode='r'`` (reduced: m x k, complete: m x m)."""
    a = _mat(call, "A", "self")
    m, n = a.shape[-2], a.shape[-1]
    k = min(m, n)
    mode = call.arg("mode", "reduced")
    flops = qr_flops(m, n)
    if mode != "r":
        flops += orgqr_flops(m, m if mode == "complete" else k, k)
    return _scale(call, flops, _batch(a.shape))


def _householder_product(call: OpCall) -> Cost:
    """orgqr: 4 m n k - 2 (m + n) k^2 + 4 k^3 / 3, k = number of reflectors."""
    a, tau = call.tensor("input"), call.tensor("tau")
    return _scale(call, orgqr_flops(a.shape[-2], a.shape[-1], tau.shape[-1]), _batch(a.shape))


def _ormqr(call: OpCall) -> Cost:
    """ormqr: apply k reflectors to C (m x n): 4 m n k - 2 n k^2 (left), 4 m n k - 2 m k^2 (right)."""
    tau, c = call.tensor("input2"), call.tensor("input3")
    m, n, k = c.shape[-2], c.shape[-1], tau.shape[-1]
    flops = 4 * m * n * k - (2 * n * k * k if call.arg("left", True) is not False else 2 * m * k * k)
    return _scale(call, flops, _batch(c.shape))


def _svd(call: OpCall) -> Cost:
    a = _mat(call, "A", "self", "input")
    compute_uv = call.op != "aten::linalg_svdvals" and call.arg("compute_uv", True) is not False
    full = call.arg("some", True) is False if call.op == "aten::svd" else bool(call.arg("full_matrices", False))
    return _scale(call, svd_flops(a.shape[-2], a.shape[-1], compute_uv, full), _batch(a.shape))


def _eigh(call: OpCall) -> Cost:
    a = _mat(call, "A", "self")
    vectors = call.op != "aten::linalg_eigvalsh" and call.arg("compute_v", True) is not False
    return _scale(call, eigh_flops(a.shape[-1], vectors), _batch(a.shape))


def _eig(call: OpCall) -> Cost:
    a = _mat(call, "self", "A")
    return _scale(call, eig_flops(a.shape[-1], call.op != "aten::linalg_eigvals"), _batch(a.shape))


def _values(a: TensorMeta, rows: int, cols: int, hermitian: bool = False) -> Tuple[str, Cost]:
    """The singular values (the eigenvalues when ``hermitian``) of each ``rows`` x ``cols``
    matrix of ``a``, as the C++ matrix functions compute them (``linalg_svdvals`` /
    ``linalg_eigvalsh``: values only, docs/conventions.md "Values only")."""
    batch = a.numel // (rows * cols) if rows * cols else 0
    factor = COMPLEX if is_complex(a) else 1
    if hermitian:
        return "aten::linalg_eigvalsh", Cost.from_flops(round(eigh_flops(rows, False) * batch * factor))
    return "aten::linalg_svdvals", Cost.from_flops(round(svd_flops(rows, cols, False, False) * batch * factor))


def _matrix_norm_parts(a: TensorMeta, ord: object, dims: Sequence[int] = (-2, -1)) -> Tuple[Tuple[str, Cost], ...]:
    """``linalg.matrix_norm`` (LinearAlgebra.cpp) over dims (rows, cols), b matrices of k = min
    singular values: 2 / -2 singular values + amax / amin (b k); "nuc" + sum (b k); "fro" the
    2-norm over both dims; 1 / -1 the 1-norm of each column + amax / amin over the columns;
    inf / -inf the same over the rows."""
    rows, cols = (a.shape[d % a.ndim] for d in dims)
    n, k = a.numel, min(rows, cols)
    batch = n // (rows * cols) if rows * cols else 0
    if ord == "fro":
        return (("aten::linalg_vector_norm", Cost.from_flops(norm_flops(n, batch, 2))),)
    if ord in (2, -2, "nuc"):
        reduce = {2: "aten::amax", -2: "aten::amin", "nuc": "aten::sum"}[ord]
        return _values(a, rows, cols), (reduce, Cost.from_flops(batch * k))
    summed = rows if ord in (1, -1) else cols  # 1 / -1: each column's 1-norm, inf / -inf: each row's
    out = n // summed if summed else 0
    reduce = "aten::amax" if ord in (1, float("inf")) else "aten::amin"
    return ("aten::linalg_vector_norm", Cost.from_flops(norm_flops(n, out, 1))), (reduce, Cost.from_flops(out))


def _matrix_norm(call: OpCall) -> Cost:
    return Cost.split(*_matrix_norm_parts(call.tensor("self"), call.arg("ord", "fro"), call.arg("dim") or (-2, -1)))


def _linalg_norm(call: OpCall) -> Cost:
    """``linalg.norm``: a matrix norm when ``dim`` names two dims (or, with an ``ord``, the input
    is 2-D), else a vector norm (of the flattened input without ``dim``)."""
    a, ord, dim = call.tensor("self"), call.arg("ord"), call.arg("dim")
    dims = (dim,) if isinstance(dim, int) else dim
    if (dims is not None and len(dims) == 2) or (dims is None and ord is not None and a.ndim == 2):
        return Cost.split(*_matrix_norm_parts(a, "fro" if ord is None else ord, dims or (-2, -1)))
    return Cost.split(("aten::linalg_vector_norm", _norm(call)))


def _cond(call: OpCall) -> Cost:
    """``linalg.cond`` (LinearAlgebra.cpp): p None / 2 / -2: the singular values and one divide
    per matrix; "nuc": the singular values, their reciprocals and two sums (3 b k) and a
    product per matrix; any other p: the inverse (``linalg_inv_ex``, 2 n^3), a ``masked_fill_`` of it
    (N), the p-norm of A and of its inverse, their product and ``nan_to_num_`` (one each per
    matrix)."""
    a = call.tensor("self")
    p = call.arg("p")
    n = a.shape[-1]
    batch = _batch(a.shape)
    if p in (None, 2, -2):
        return Cost.split(_values(a, a.shape[-2], n), ("aten::div", Cost.from_flops(batch)))
    if p == "nuc":
        k = batch * min(a.shape[-2], n)
        sums = (("aten::sum", Cost.from_flops(k)),) * 2
        return Cost.split(_values(a, a.shape[-2], n), ("aten::reciprocal", Cost.from_flops(k)), *sums, ("aten::mul", Cost.from_flops(batch)))
    inverse = ("aten::linalg_inv_ex", _scale(call, 2 * n**3, batch))
    norms = _matrix_norm_parts(a, p) * 2
    tail = (("aten::mul", Cost.from_flops(batch)), ("aten::nan_to_num_", Cost.from_flops(batch)))
    return Cost.split(inverse, ("aten::masked_fill_", Cost.from_flops(a.numel)), *norms, *tail)


def _matrix_rank(call: OpCall) -> Cost:
    """``linalg.matrix_rank`` (LinearAlgebra.cpp), b matrices, k values each: the singular values
    (sorted: the largest is read, not searched), rtol x the largest and the maximum with atol
    (b each), the values above it counted (gt, sum: 2 b k); hermitian: the eigenvalues, their
    abs and amax (2 b k) first."""
    a = _mat(call, "self", "input")
    rows, cols = a.shape[-2], a.shape[-1]
    batch, k = _batch(a.shape), min(rows, cols)
    hermitian = bool(call.arg("hermitian", False))
    parts = [_values(a, rows, cols, hermitian)]
    if hermitian:
        parts += [("aten::abs", Cost.from_flops(batch * k)), ("aten::amax", Cost.from_flops(batch * k))]
    parts += [("aten::mul", Cost.from_flops(batch)), ("aten::maximum", Cost.from_flops(batch))]
    parts += [("aten::gt", Cost.from_flops(batch * k)), ("aten::sum", Cost.from_flops(batch * k))]
    return Cost.split(*parts)


def _pinv(call: OpCall) -> Cost:
    """Thin SVD (eigh when hermitian) + V diag(1/s) U^H: a divide per singular value and
    n k m multiply-adds (2 n k m FLOPs), k = min(m, n)."""
    a = _mat(call, "self", "input")
    m, n = a.shape[-2], a.shape[-1]
    k = min(m, n)
    decomposition = eigh_flops(n, True) if call.arg("hermitian") else svd_flops(m, n, True, False)
    return _scale(call, decomposition + k + 2 * n * k * m, _batch(a.shape))


def svd_lstsq_flops(m: int, n: int, nrhs: int) -> float:
    """SVD-based least squares (LAPACK gelss, gelsd), M = max(m, n), k = min(m, n): the
    Golub-Reinsch count for Sigma and V (G&VL 5.5, 8.6.3: 4 M k^2 + 8 k^3), U^H applied to B
    as its k reflectors (4 M k nrhs - 2 k^2 nrhs), then V diag(1/s) (k nrhs + 2 k^2 nrhs)."""
    big, k = max(m, n), min(m, n)
    return 4 * big * k * k + 8 * k**3 + (4 * big * k * nrhs - 2 * k * k * nrhs) + k * nrhs + 2 * k * k * nrhs


def qr_lstsq_flops(m: int, n: int, nrhs: int) -> float:
    """QR-based least squares (LAPACK gels, gelsy), k = min(m, n): geqrf (m x n) + Q^H
    applied to B (ormqr with k reflectors: 4 m nrhs k - 2 nrhs k^2) + trsm (k^2 nrhs)."""
    k = min(m, n)
    return qr_flops(m, n) + 4 * m * nrhs * k - 2 * nrhs * k * k + triangular_solve_flops(k, nrhs)


#: the drivers that solve through the SVD; gels (QR), gelsy (pivoted QR, torch's CPU default)
#: and the CUDA path (gels) are QR-based
_SVD_DRIVERS = frozenset({"gelsd", "gelss"})


def _lstsq(call: OpCall) -> Cost:
    """Least squares by its driver: gelsd/gelss through the SVD (svd_lstsq_flops), the
    others through QR (qr_lstsq_flops)."""
    a, b = call.tensor("self"), call.tensor("b")
    m, n = a.shape[-2], a.shape[-1]
    nrhs = 1 if b.ndim == a.ndim - 1 else b.shape[-1]
    flops = (svd_lstsq_flops if call.arg("driver") in _SVD_DRIVERS else qr_lstsq_flops)(m, n, nrhs)
    return _scale(call, flops, _solve_batch(a, b))


def _matrix_power(call: OpCall) -> Cost:
    """torch's binary powering: (bit_length(|n|) - 1) squarings + (popcount(|n|) - 1)
    products, each a k x k matmul (k^3 MACs); a negative power inverts first (2 k^3)."""
    a = call.tensor("self")
    n = int(call.arg("n"))
    k, batch = a.shape[-1], _batch(a.shape)
    power = abs(n)
    matmuls = (power.bit_length() - 1) + (bin(power).count("1") - 1) if power > 1 else 0
    factor = COMPLEX if is_complex(a) else 1
    cost = Cost.from_macs(matmuls * k**3 * batch * factor)
    if n < 0:
        cost += _scale(call, 2 * k**3, batch)
    return cost


# -- distances -------------------------------------------------------------------------------


def _per_coordinate(p: Optional[float]) -> Tuple[int, int]:
    """(FLOPs per coordinate, FLOPs per pair) of a p-norm distance: subtract, |.| or square,
    accumulate (3) and a square root per pair for p = 2; p in {0, 1, inf}: 3 and 0;
    other p: subtract, |.|, pow, accumulate (4) and a root per pair."""
    if p is None or p == 2:
        return 3, 1
    return (3, 0) if p in (0, 1) or p == float("inf") else (4, 1)


def _cdist(call: OpCall) -> Cost:
    """cdist(x1 (*, r1, m), x2 (*, r2, m), p): for p = 2 with more than 25 rows on either
    side (or compute_mode 1) torch uses a matmul: B r1 r2 (m + 2) MACs, the row norms
    (2 r1 m + 2 r2 m), the -2 x1 scale (r1 m), clamp and sqrt (2 r1 r2);
    otherwise B r1 r2 (per-coordinate m + per-pair) FLOPs."""
    batch, r1, r2, m = _pairs(call)
    p = call.arg("p", 2.0)
    mode = call.arg("compute_mode")
    use_mm = (p is None or p == 2) and (mode == 1 or (mode in (None, 0) and (r1 > 25 or r2 > 25)))
    if use_mm:
        return _euclidean_cost(batch, r1, r2, m)
    coord, pair = _per_coordinate(p)
    return Cost.from_flops(batch * r1 * r2 * (coord * m + pair))


def _euclidean_dist(call: OpCall) -> Cost:
    """_euclidean_dist(x1, x2): the matmul form of cdist (see :func:`_cdist`)."""
    return _euclidean_cost(*_pairs(call))


def _pairs(call: OpCall) -> Tuple[int, int, int, int]:
    """(batch, rows of x1, rows of x2, coordinates) of x1 (*, r1, m) and x2 (*, r2, m)."""
    x1, x2 = call.tensor("x1"), call.tensor("x2")
    return prod(broadcast(x1.shape[:-2], x2.shape[:-2])), x1.shape[-2], x2.shape[-2], x1.shape[-1]


def _euclidean_cost(batch: int, r1: int, r2: int, m: int) -> Cost:
    return Cost.from_macs(batch * r1 * r2 * (m + 2)) + Cost.from_flops(
        batch * (2 * r1 * m + 2 * r2 * m + r1 * m + 2 * r1 * r2)
    )


def _pdist(call: OpCall) -> Cost:
    """pdist(x (n, m), p): n (n - 1) / 2 pairs, each a p-norm distance as in cdist."""
    x = call.tensor("self")
    n, m = x.shape[-2], x.shape[-1]
    coord, pair = _per_coordinate(call.arg("p", 2.0))
    return Cost.from_flops(n * (n - 1) // 2 * (coord * m + pair))


def _cdist_backward(call: OpCall) -> Cost:
    """_cdist_backward(grad, x1, x2, p, cdist): the gradient for x1 (torch calls it once per
    input): per pair g / d (1) and per coordinate subtract, multiply, accumulate (3):
    B r1 r2 (3m + 1)."""
    batch, r1, r2, m = _pairs(call)
    return Cost.from_flops(batch * r1 * r2 * (3 * m + 1))


def _pdist_backward(call: OpCall) -> Cost:
    """_pdist_backward: each pair's gradient (3m + 1, as cdist's) goes to both of its points."""
    x = call.tensor("self")
    n, m = x.shape[-2], x.shape[-1]
    return Cost.from_flops(n * (n - 1) * (3 * m + 1))


def pairwise_distance_cost(a: Sequence[int], b: Sequence[int], p: object) -> Cost:
    """pairwise_distance(x1, x2, p, eps): x1 - x2 + eps (2 per element), then the p-norm
    over the last dim, exactly its decomposition (sub, add, norm)."""
    shape = broadcast(a, b)
    out_shape = shape[:-1] if shape else ()
    norm = _norm(OpCall("aten::norm", {"self": TensorMeta(shape), "p": p}, (TensorMeta(out_shape),)))
    return Cost.from_flops(2 * prod(shape)) + norm


def _pairwise_distance(call: OpCall) -> Cost:
    return pairwise_distance_cost(call.tensor("x1").shape, call.tensor("x2").shape, call.arg("p", 2.0))


def _cosine_similarity(call: OpCall) -> Cost:
    """cosine_similarity(x1, x2, dim, eps), as ATen decomposes it on the broadcast shape
    (N elements, M outputs): two 2-norms over ``dim`` (2N + M each), two clamp_min (M
    each), x / ||x|| for both (N each), their product (N), the sum over ``dim`` (N):
    8N + 4M."""
    x1, x2 = call.tensor("x1"), call.tensor("x2")
    shape = broadcast(x1.shape, x2.shape)
    n = prod(shape)
    out = first_output(call)
    m = out.numel if out is not None else (n // shape[int(call.arg("dim", 1)) % len(shape)] if shape else 1)
    return Cost.from_flops(8 * n + 4 * m)


#: the scalar checks and sums of cov's weights, as its decomposition runs them: fweights
#: (min, equal, sum, equal: 2 O + 2), aweights (min, ge, equal, sum, ne, equal, le: 2 O + 5,
#: one check fewer with both), and for aweights with correction != 0 the sum of w * a and
#: its scalar arithmetic (2 O + 3)
def _cov_weights(observations: int, fweights: bool, aweights: bool, correction: object) -> int:
    flops = 0
    if fweights:
        flops += 2 * observations + 2
    if aweights:
        flops += 2 * observations + 5 - (1 if fweights else 0)
        if correction not in (0, None):
            flops += 2 * observations + 3
    return flops


def _cov(call: OpCall) -> Cost:
    """cov(x (V variables, O observations)), its decomposition: mean (sum N, divide V),
    a check (1), centre (N), (x - mean) (x - mean)^H: V^2 O MACs, divide V^2. Weights add
    the weighted-mean and weighting multiplies (2N) and their checks and sums
    (:func:`_cov_weights`). corrcoef adds sqrt (V), two divides and a clamp (3 V^2)."""
    x = call.tensor("self")
    variables = x.shape[0] if x.ndim == 2 else 1
    observations = x.shape[-1] if x.ndim else 1
    n = x.numel
    flops = 2 * n + variables + 1 + variables * variables
    fweights, aweights = maybe_tensor(call, "fweights") is not None, maybe_tensor(call, "aweights") is not None
    if fweights or aweights:
        flops += 2 * n + _cov_weights(observations, fweights, aweights, call.arg("correction", 1))
    if call.op == "aten::corrcoef":
        flops += variables + 3 * variables * variables
    return Cost.from_macs(variables * variables * observations) + Cost.from_flops(flops)


def _cross(call: OpCall) -> Cost:
    """Cross product of 3-vectors: 6 multiplies and 3 subtracts per vector, 3 per output element."""
    return Cost.from_flops(3 * output_numel(call))


def register(registry: HandlerRegistry) -> None:
    registry.register(["aten::linalg_cholesky", "aten::linalg_cholesky_ex", "aten::cholesky"], _dense(cholesky_flops))
    registry.register(["aten::linalg_lu", "aten::linalg_lu_factor", "aten::linalg_lu_factor_ex", "aten::lu"], _dense(lu_flops, square=False))
    # LU + the product of the diagonal (n)
    registry.register(["aten::linalg_det", "aten::_linalg_det", "aten::det"], _dense(lambda n: lu_flops(n, n) + n))
    registry.register(["aten::linalg_slogdet", "aten::_linalg_slogdet", "aten::slogdet"], _slogdet)
    registry.register("aten::logdet", _logdet)
    # getrf + getri: 2 n^3 / 3 + 4 n^3 / 3 = 2 n^3
    registry.register(["aten::linalg_inv", "aten::linalg_inv_ex", "aten::inverse"], _dense(lambda n: 2 * n**3))
    registry.register(["aten::linalg_solve", "aten::_linalg_solve_ex", "aten::linalg_solve_ex"], _solver("A", solve_flops))
    registry.register("aten::linalg_lu_solve", _solver("LU", lu_solve_flops))
    registry.register("aten::linalg_solve_triangular", _solver("self", triangular_solve_flops))
    registry.register("aten::triangular_solve", _solver_of_self("A", triangular_solve_flops))
    registry.register("aten::cholesky_solve", _solver_of_self("input2", lu_solve_flops))  # L L^H: 2 triangular solves
    registry.register("aten::cholesky_inverse", _dense(lambda n: 2 * n**3 / 3))  # potri: 2 n^3 / 3
    registry.register("aten::linalg_qr", _qr)
    registry.register("aten::geqrf", _dense(qr_flops, square=False))
    registry.register(["aten::linalg_householder_product", "aten::orgqr"], _householder_product)
    registry.register("aten::ormqr", _ormqr)
    registry.register(["aten::linalg_svd", "aten::_linalg_svd", "aten::linalg_svdvals", "aten::svd"], _svd)
    registry.register(["aten::linalg_eigh", "aten::_linalg_eigh", "aten::linalg_eigvalsh"], _eigh)
    registry.register(["aten::linalg_eig", "aten::linalg_eigvals"], _eig)
    registry.register(["aten::linalg_pinv", "aten::pinverse"], _pinv)
    registry.register("aten::linalg_matrix_norm", _matrix_norm)
    registry.register("aten::linalg_cond", _cond)
    registry.register("aten::linalg_norm", _linalg_norm)
    registry.register("aten::linalg_matrix_rank", _matrix_rank)
    registry.register("aten::linalg_lstsq", _lstsq)
    registry.register("aten::linalg_matrix_power", _matrix_power)
    registry.register(["aten::cdist", "aten::_cdist_forward"], _cdist)
    registry.register("aten::_euclidean_dist", _euclidean_dist)
    registry.register(["aten::pdist", "aten::_pdist_forward"], _pdist)
    registry.register("aten::_cdist_backward", _cdist_backward)
    registry.register("aten::_pdist_backward", _pdist_backward)
    registry.register("aten::pairwise_distance", _pairwise_distance)
    registry.register("aten::cosine_similarity", _cosine_similarity)
    registry.register(["aten::cov", "aten::corrcoef"], _cov)
    registry.register(["aten::linalg_cross", "aten::cross"], _cross)
    # reads the info tensor of a factorization; unpacking an LU is a copy
    registry.register_zero(["aten::_linalg_check_errors", "aten::lu_unpack"])
