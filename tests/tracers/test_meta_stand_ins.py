"""Ops with no meta kernel (issue #9, the nn zoo's meta runs of CTCLoss and AdaptiveLogSoftmaxWithLoss).

``_ctc_loss`` and its backward have none; their cost is a function of shapes and lengths,
so a shapes-only stand-in gives the CPU count: checked against the lattice formula written
out here (13 FLOPs per cell of T_b x (2 S_b + 1), docs/conventions.md) and against the CPU
run. ``nonzero`` (AdaptiveLogSoftmaxWithLoss picks each cluster's rows with it) has an
output size that is data: no stand-in, a clear error.
"""

from __future__ import annotations

from typing import Any, Tuple

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from flopcount import TraceError, count_flops

T, B, C, S = 7, 3, 5, 2


def _ctc_inputs(device: str, grad: bool = False) -> Tuple[Any, ...]:
    torch.manual_seed(0)
    log_probs = F.log_softmax(torch.randn(T, C, B), 1).transpose(1, 2).to(device)  # (T, B, C), non-contiguous
    if grad:
        log_probs = log_probs.detach().requires_grad_()
    targets = torch.randint(1, C, (B, S)).to(device)
    return log_probs, targets, torch.full((B,), T).to(device), torch.full((B,), S).to(device)


def _meta(build: Any) -> nn.Module:
    with torch.device("meta"):
        return build()


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_ctc_loss_on_meta_equals_cpu(reduction: str) -> None:
    cpu = count_flops(nn.CTCLoss(reduction=reduction), _ctc_inputs("cpu"), tracer="dispatch")
    meta = count_flops(_meta(lambda: nn.CTCLoss(reduction=reduction)), _ctc_inputs("meta"))
    assert meta.by_operator() == cpu.by_operator() and meta.flops == cpu.flops
    # the alpha recursion: 13 FLOPs per lattice cell, B sequences of T x (2S + 1) cells
    assert meta.by_operator()["aten::_ctc_loss"] == 13 * B * T * (2 * S + 1)
    assert meta.complete and meta.unsupported_ops() == {}
    assert any("_ctc_loss" in w for w in meta.warnings)


def test_ctc_loss_backward_on_meta_equals_cpu() -> None:
    cpu = count_flops(nn.CTCLoss(), _ctc_inputs("cpu", grad=True), tracer="dispatch", backward=True)
    meta = count_flops(_meta(nn.CTCLoss), _ctc_inputs("meta", grad=True), backward=True)
    assert meta.by_operator() == cpu.by_operator() and meta.flops == cpu.flops
    assert meta.by_operator()["aten::_ctc_loss_backward"] == 16 * B * T * (2 * S + 1)


def test_adaptive_log_softmax_on_meta_is_a_clear_error() -> None:
    model = _meta(lambda: nn.AdaptiveLogSoftmaxWithLoss(6, 10, cutoffs=[4]))
    x, target = torch.randn(8, 6, device="meta"), torch.arange(8, device="meta")
    with pytest.raises(TraceError, match=r"nonzero\(\) on a meta/fake tensor: its output size depends on the tensor's values"):
        count_flops(model, (x, target))
