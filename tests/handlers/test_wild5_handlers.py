"""Composites jit records whole and priced as one element-wise op, and ops that left a real
model's count incomplete (branch wild5).

* ``torch.isclose`` / ``torch.allclose`` (``torch.distributions``' symmetric-matrix check,
  a model's own tolerance test): torch runs isclose as a composite (TensorCompare.cpp):
  ``self == other``; with ``equal_nan`` ``isnan`` of each input; unless rtol = atol = 0,
  ``atol + |rtol * other|`` (mul, abs, add over other's O elements) and
  ``|self - other| <= it`` where finite (sub, abs; isfinite's abs, ne, eq; le over the N
  broadcast elements): 7 N + 3 O. jit priced it 1 per element (N); the dispatch tracer sees
  the ops. ``allclose`` is one kernel (nothing below it reaches a dispatch mode): it was
  unsupported under auto and dispatch.
* ``torch.nanmean``: ``nansum(x) / (x == x).sum()`` (ReduceOps.cpp): ne, sum, nansum over N
  and a divide per output: 3 N + M. jit priced it as ``mean`` (N + M).
* ``torch.distributions``' argument checks end in ``torch._is_all_true`` (an ``all`` over a
  bool tensor: N), unsupported before; ``index_reduce`` and ``segment_reduce`` unsupported.

Oracle: the hand counts above, derived from torch's source (FlopCounterMode counts none of
these ops), and the invariant that every tracer books the same operators."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from flopcount import count_flops
from tests.handlers._fn import TRACERS, Fn


def _isclose_hand(n: int, o: int, equal_nan: bool = False, zero_tol: bool = False, integral: bool = False, n_self: int = 0) -> int:
    flops = 0 if integral else n  # self == other (integers compare as integers)
    if equal_nan and not integral:
        flops += n_self + o  # isnan(self), isnan(other)
    if zero_tol:
        return flops
    return flops + 3 * o + 6 * n


A, B = torch.randn(3, 4), torch.randn(4)
ISCLOSE = [
    ("broadcast other", lambda a, b: torch.isclose(a, b), (A, B), _isclose_hand(12, 4)),
    ("broadcast self", lambda a, b: torch.isclose(b, a), (A, B), _isclose_hand(12, 12)),
    ("equal_nan", lambda a, b: torch.isclose(a, b, equal_nan=True), (A, B), _isclose_hand(12, 4, equal_nan=True, n_self=12)),
    ("rtol = atol = 0", lambda a, b: torch.isclose(a, b, rtol=0.0, atol=0.0), (A, B), _isclose_hand(12, 4, zero_tol=True)),
    ("atol only", lambda a, b: torch.isclose(a, b, rtol=0.0, atol=1e-3), (A, B), _isclose_hand(12, 4)),
    ("int64", lambda a, b: torch.isclose(a, b), (torch.arange(6), torch.arange(6)), _isclose_hand(6, 6, integral=True)),
]


@pytest.mark.parametrize("tracer", TRACERS)
@pytest.mark.parametrize("name,fn,args,hand", ISCLOSE, ids=[c[0] for c in ISCLOSE])
def test_isclose_priced_as_torch_runs_it(tracer, name, fn, args, hand):
    r = count_flops(Fn(fn), args, tracer=tracer)
    assert r.complete
    assert r.flops == hand


def test_isclose_books_the_same_operators_under_every_tracer():
    tables = {tr: count_flops(Fn(torch.isclose), (A, B), tracer=tr).by_operator("flops") for tr in TRACERS}
    expected = {"aten::eq": 24, "aten::mul": 4, "aten::abs": 4 + 24, "aten::add": 4, "aten::sub": 12, "aten::ne": 12, "aten::le": 12}
    for tracer, table in tables.items():
        assert {k: v for k, v in table.items() if v} == expected, tracer


class CloseOrNot(nn.Module):
    """A forward that branches on ``allclose`` (the value is needed: one real run)."""

    def forward(self, a, b):
        return a * 2 if torch.allclose(a, b) else a - b


@pytest.mark.parametrize("tracer", TRACERS)
def test_allclose(tracer):
    a = torch.randn(5, 3)
    r = count_flops(CloseOrNot(), (a, a.clone()), tracer=tracer)
    assert r.complete
    assert r.flops == _isclose_hand(15, 15) + 15 + 15  # + all over N, + the multiply taken


NANMEAN = [
    ("dim", lambda x: torch.nanmean(x, 1), (3, 4), 3 * 12 + 3),
    ("all", lambda x: torch.nanmean(x), (3, 4), 3 * 12 + 1),
    ("keepdim dim 0", lambda x: torch.nanmean(x, (0,), keepdim=True), (3, 4), 3 * 12 + 4),
]


@pytest.mark.parametrize("tracer", TRACERS)
@pytest.mark.parametrize("name,fn,shape,hand", NANMEAN, ids=[c[0] for c in NANMEAN])
def test_nanmean(tracer, name, fn, shape, hand):
    r = count_flops(Fn(fn), (torch.randn(*shape),), tracer=tracer)
    assert r.flops == hand
    assert {k: v for k, v in r.by_operator("flops").items() if v} == {
        "aten::ne": 12, "aten::sum": 12, "aten::nansum": 12, "aten::div": hand - 36,
    }


@pytest.mark.parametrize("tracer", TRACERS)
def test_normal_log_prob_complete(tracer):
    """Normal(loc, scale).log_prob(value), N = 15: -(value - loc)^2 / (2 scale^2) - log(scale)
    - log(sqrt(2 pi)): pow, sub, pow, neg, mul, div, log, sub, sub (9 N); the checks loc == loc,
    scale > 0, value == value (3 N), each followed by _is_all_true (3 N). The checks are asked for
    explicitly: torch's default (``__debug__``) is switched off process-wide once torch._dynamo has
    patched torch (``set_default_validate_args(False)``), as any earlier torch.compile test does;
    without them the user's run computes the 9 N alone."""
    loc, scale, value = torch.randn(5, 3), torch.rand(5, 3) + 0.5, torch.randn(5, 3)
    dist = torch.distributions
    r = count_flops(Fn(lambda m, s, y: dist.Normal(m, s, validate_args=True).log_prob(y)), (loc, scale, value), tracer=tracer)
    assert r.complete and r.unsupported_ops() == {}
    assert r.flops == 15 * 15
    assert r.by_operator("flops")["aten::_is_all_true"] == 3 * 15
    unchecked = count_flops(Fn(lambda m, s, y: dist.Normal(m, s, validate_args=False).log_prob(y)), (loc, scale, value), tracer=tracer)
    assert unchecked.flops == 9 * 15 and "aten::_is_all_true" not in unchecked.by_operator("flops")


@pytest.mark.filterwarnings("ignore:index_reduce")
@pytest.mark.parametrize("tracer", TRACERS)
@pytest.mark.parametrize("reduce,hand", [("prod", 40), ("amax", 40), ("amin", 40), ("mean", 40 + 30)])
def test_index_reduce(tracer, reduce, hand):
    """One op per source element (4 x 10); mean + a divide per element of self (3 x 10)."""
    fn = Fn(lambda s, i, x: s.index_reduce(0, i, x, reduce))
    r = count_flops(fn, (torch.randn(3, 10), torch.tensor([0, 2, 2, 1]), torch.randn(4, 10)), tracer=tracer)
    assert r.complete and r.flops == hand


@pytest.mark.parametrize("tracer", TRACERS)
@pytest.mark.parametrize("reduce,hand", [("sum", 40), ("max", 40), ("mean", 40 + 12)])
def test_segment_reduce(tracer, reduce, hand):
    """One op per data element (10 x 4) into its segment; mean + a divide per output (3 x 4)."""
    fn = Fn(lambda d, lengths: torch.segment_reduce(d, reduce, lengths=lengths))
    r = count_flops(fn, (torch.randn(10, 4), torch.tensor([3, 3, 4])), tracer=tracer)
    assert r.complete and r.flops == hand

