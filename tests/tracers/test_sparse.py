"""Sparse x dense products: one nnz-based formula whichever spelling and tracer (issue #29.2).

A 200 x 200 COO matrix with 987 stored values times a dense 200 x 32 was counted as dense
(1,280,000 MACs) through ``@``/``torch.matmul``, unsupported through ``torch.sparse.mm``;
CSR operands crashed ``dispatch``/``jit`` ("Sparse CSR tensors do not have strides", then
``aten::equal`` on the sparse buffer), a COO operand gave jit a ``KeyError``, and ``auto``
counted fake copies, which keep no non-zeros.

The formula, derived by hand (docs/conventions.md, "Sparse layouts"): a sparse kernel visits
each stored value a[i, k] once and multiplies it into row k of the dense operand, one
multiply-add per column: sparse (M x K, S stored) @ dense (K x N) = S x N MACs; dense
(M x K) @ sparse (K x N, S stored) = M x S. S is what the tensor stores: nnz for COO, CSR
and CSC, blocks x block area for BSR. The oracle below reads S from the real tensor.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, Dict

import pytest
import torch
from torch import nn

from flopcount import count_flops

TRACERS = ("auto", "dispatch", "jit")
M = K = 200
pytestmark = pytest.mark.filterwarnings("ignore:Sparse (BSR|CSR) tensor support is in beta")
N = 32


def _matrix() -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    dense = torch.zeros(M, K)
    dense.view(-1)[torch.randperm(M * K, generator=generator)[:987]] = 1.5
    return dense


LAYOUTS: Dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "coo": lambda d: d.to_sparse(),
    "csr": lambda d: d.to_sparse_csr(),
    "csc": lambda d: d.to_sparse_csc(),
    "bsr": lambda d: d.to_sparse_bsr((4, 4)),
}


def _stored(sparse: torch.Tensor) -> int:
    """S: the element count of the values the sparse tensor stores."""
    values = sparse._values() if sparse.layout == torch.sparse_coo else sparse.values()
    return values.numel()


SPELLINGS: Dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "@": lambda a, x: a @ x,
    "matmul": torch.matmul,
    "sparse.mm": torch.sparse.mm,
    "mm": torch.mm,
    "addmm": lambda a, x: torch.addmm(torch.zeros(M, N), a, x),
}


class SparseTimesDense(nn.Module):
    def __init__(self, sparse: torch.Tensor, spelling: str) -> None:
        super().__init__()
        self.register_buffer("a", sparse)
        self.spelling = spelling

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return SPELLINGS[self.spelling](self.a, x)


def _count(model: nn.Module, x: Any, tracer: str) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return count_flops(model, x, tracer=tracer)


def test_the_issue_figure() -> None:
    coo = _matrix().to_sparse()
    assert coo._nnz() == 987
    r = _count(SparseTimesDense(coo, "@"), torch.randn(K, N), "auto")
    assert r.macs == 987 * 32 == 31_584
    assert any("sparse tensors" in w for w in r.warnings)


@pytest.mark.parametrize("spelling", sorted(SPELLINGS))
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("tracer", TRACERS)
def test_sparse_times_dense_every_spelling(tracer: str, layout: str, spelling: str) -> None:
    sparse = LAYOUTS[layout](_matrix())
    model = SparseTimesDense(sparse, spelling).train(spelling == "mm")
    x = torch.randn(K, N)
    out = model(x)  # the real call runs (the oracle's shapes)
    assert torch.allclose(out, _matrix() @ x, atol=1e-4)
    r = _count(model, x, tracer)
    assert r.macs == _stored(sparse) * N
    assert r.flops == 2 * r.macs
    assert r.complete
    if tracer == "auto":  # fake copies keep no non-zeros: one real run, said in the warnings
        assert any("sparse tensors" in w for w in r.warnings)
    # the sparse buffer is the same object, with the same values
    assert model.a is sparse and torch.equal(model.a.to_dense(), _matrix())


class DenseTimesSparse(nn.Module):
    def __init__(self, sparse: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("b", sparse)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.b


@pytest.mark.parametrize("layout", ["coo", "csr", "csc"])
@pytest.mark.parametrize("tracer", TRACERS)
def test_dense_times_sparse(tracer: str, layout: str) -> None:
    sparse = LAYOUTS[layout](_matrix())
    x = torch.randn(3, M)  # 3 rows: each meets every stored value once -> 3 x S
    DenseTimesSparse(sparse)(x)
    r = _count(DenseTimesSparse(sparse), x, tracer)
    assert r.macs == 3 * _stored(sparse)


class SparseInput(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(K, N))

    def forward(self, a: torch.Tensor) -> torch.Tensor:
        return torch.sparse.mm(a, self.w)


@pytest.mark.parametrize("layout", ["coo", "csr", "csc"])
@pytest.mark.parametrize("tracer", TRACERS)
def test_sparse_input(tracer: str, layout: str) -> None:
    """A sparse input tensor: no raw "do not have strides" from the input bookkeeping."""
    a = LAYOUTS[layout](_matrix())
    r = _count(SparseInput(), a, tracer)
    assert r.macs == _stored(a) * N
    assert f"Tensor[{M}, {K}] float32 sparse_{layout}" in r.input_description
    assert torch.equal(a.to_dense(), _matrix())


class MadeSparse(nn.Module):
    """A sparse tensor made inside the forward (fake tensors cannot know its non-zeros)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(K, N))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.to_sparse() @ self.w


@pytest.mark.parametrize("tracer", TRACERS)
def test_sparse_made_in_forward(tracer: str) -> None:
    x = _matrix()
    r = _count(MadeSparse(), x, tracer)
    if tracer == "jit":
        # jit's graph has neither the shape nor the values of a tensor made sparse in the
        # forward: the product is reported unsupported, not guessed
        assert not r.complete and "aten::matmul" in r.unsupported_ops()
        return
    assert r.macs == 987 * N and r.complete
    if tracer == "auto":
        assert any("makes sparse tensors" in w for w in r.warnings)


class SparseTimesSparse(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("a", _matrix().to_sparse())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sparse.mm(self.a, x.to_sparse())


@pytest.mark.parametrize("tracer", ["auto", "dispatch"])
def test_sparse_times_sparse_is_unsupported(tracer: str) -> None:
    """The work of sparse @ sparse depends on where the non-zeros meet: no formula, so it
    is reported as unsupported (never counted as dense, never zero)."""
    r = _count(SparseTimesSparse(), _matrix(), tracer)
    assert not r.complete
    assert r.unsupported_ops()
