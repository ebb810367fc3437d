"""DTensor's shape propagation is not rank work (issue #27 item 4).

DTensor learns an op's global output shape by running it once on global-shape fakes. In
plan's fake world that run shares the step's fake mode; flopcount used to recognise it by
walking up to 8 Python frames per op looking for one method's code object, so a torch that
moved the run elsewhere booked it silently as rank-0 work. Now the step tells it by the
fake mode's depth (DTensor enters it once more), whatever torch calls the method.

Oracle: a hand count of a tensor-parallel MLP's per-rank matmuls. Before: the
"relocated propagation" case failed (global-shape mms booked on top).
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from torch import nn

import flopcount

dtensor_debug = pytest.importorskip("torch.distributed.tensor.debug")


def _clear_fast_path_sharding_prop_cache() -> None:
    dtensor_debug._clear_fast_path_sharding_prop_cache()

pytest.importorskip("torch.distributed.tensor.parallel")
B, D, H, TP = 4, 16, 32, 2


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(D, H, bias=False), nn.Linear(H, D, bias=False))


def _plan() -> Any:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    # DTensor caches each op's propagation (in C++ and in Python): emptied, every op's shape
    # run happens in this plan, as in a process's first one
    _clear_fast_path_sharding_prop_cache()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return flopcount.plan(
            mlp, (torch.randn(B, D),), tp=TP, optimizer="none", device=None,
            tp_plan={"0": ColwiseParallel(), "1": RowwiseParallel()},
        )


def _hand_mm_flops() -> int:
    # One rank holds W1[H/TP, D] (column shard) and W2[D, H/TP] (row shard); x (B, D) needs no grad.
    # forward:  h = x @ W1^T (B x D x H/TP MACs), y_partial = h @ W2^T (B x H/TP x D), then all-reduce
    # backward: grad W2 = g^T @ h (D x B x H/TP), grad h = g @ W2 (B x D x H/TP), grad W1 = gh^T @ x (H/TP x B x D)
    # five matmuls of B * D * H/TP MACs each, 2 FLOPs per MAC
    return 5 * 2 * B * D * (H // TP)


def test_a_tp_rank_books_only_its_shard_matmuls() -> None:
    dtensor_debug._clear_python_sharding_prop_cache()
    result = _plan()
    assert result.by_operator["aten::mm"] == _hand_mm_flops()
    assert result.macs["forward"] == 2 * B * D * (H // TP)


def test_a_relocated_propagation_is_still_not_rank_work(monkeypatch: Any) -> None:
    """A torch whose propagation runs its fake op from another function (a refactor): the
    same run, a different code object. Simulated by a propagator that runs the op itself
    before torch's own propagation (per call, so no cache hides it)."""
    from torch._guards import detect_fake_mode
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed.tensor import DTensor

    propagator = DTensor._op_dispatcher.sharding_propagator
    dtensor_debug._clear_python_sharding_prop_cache()
    original = propagator.propagate_op_sharding_non_cached

    def relocated(op_schema: Any) -> Any:
        with detect_fake_mode() or FakeTensorMode():
            op_schema.op(*op_schema.gen_fake_args(), **op_schema.gen_fake_kwargs())
        return original(op_schema)

    # DTensor's dispatch calls one or the other (its C++ fast path: the non-cached one)
    monkeypatch.setattr(propagator, "propagate_op_sharding", relocated)
    monkeypatch.setattr(propagator, "propagate_op_sharding_non_cached", relocated)
    result = _plan()
    assert result.by_operator["aten::mm"] == _hand_mm_flops()
