"""Handlers the seventh silent-error sweep (branch wild7, ``benchmarks/silent_errors_wild7.py``) found
pricing what torch does not run.

* ``cosine_embedding_loss`` and ``hinge_embedding_loss`` under jit (recorded whole): the formula
  counted the two comparisons of the target with +-1 (``target == 1``, ``target != -1``) as one FLOP
  per element, also for an integer target (``torch.tensor([1, -1])``, the usual spelling), whose
  comparisons are integer arithmetic and cost 0 (docs/conventions.md), as the dispatch tracers book
  the same ops: jit was 2B (cosine) or 2N (hinge) FLOPs above them.

Oracle: hand counts of torch's decomposition (aten/src/ATen/native/Loss.cpp), the comparisons at 0
for an integer target and 1 for a floating one."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from flopcount import count_flops
from tests.handlers._fn import TRACERS

B, D = 4, 8
N = 4 * 5
INT_TARGET = torch.tensor([1, -1, 1, -1])
#: the reduction of n losses as docs/conventions.md prices it: sum n, mean n + 1 (the divide)
REDUCTION = {"mean": lambda n: n + 1, "sum": lambda n: n, "none": lambda n: 0}


def _cosine_hand(target: torch.Tensor, reduction: str) -> int:
    """Three products and sums over x1 x2, x1 x1, x2 x2 (6 B D), + eps twice (2B), the denominator's
    mul and sqrt (2B), the divide (B), 1 - cos (B), cos - margin and its clamp (2B), two wheres (2B),
    the two target comparisons (2B if the target is floating), the add (B); the reduction."""
    compares = 0 if target.dtype in (torch.int64, torch.int32) else 2 * B
    return 6 * B * D + 11 * B + compares + REDUCTION[reduction](B)


def _hinge_hand(target: torch.Tensor, reduction: str) -> int:
    """margin - x and its clamp (2N), two wheres (2N), the comparisons (2N if floating), the add (N)."""
    compares = 0 if target.dtype in (torch.int64, torch.int32) else 2 * N
    return 5 * N + compares + REDUCTION[reduction](N)


@pytest.mark.parametrize("tracer", TRACERS)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("floating", [False, True], ids=["int target", "float target"])
def test_cosine_embedding_loss_counts_an_integer_targets_comparisons_as_zero(tracer, reduction, floating):
    target = INT_TARGET.float() if floating else INT_TARGET
    args = (torch.randn(B, D), torch.randn(B, D), target)
    result = count_flops(nn.CosineEmbeddingLoss(reduction=reduction), args, tracer=tracer)
    assert result.complete and result.flops == _cosine_hand(target, reduction)


@pytest.mark.parametrize("tracer", TRACERS)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("floating", [False, True], ids=["int target", "float target"])
def test_hinge_embedding_loss_counts_an_integer_targets_comparisons_as_zero(tracer, reduction, floating):
    target = torch.tensor([[1, -1, 1, -1, 1]] * 4)
    target = target.float() if floating else target
    result = count_flops(nn.HingeEmbeddingLoss(reduction=reduction), (torch.randn(4, 5), target), tracer=tracer)
    assert result.complete and result.flops == _hinge_hand(target, reduction)
