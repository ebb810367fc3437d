"""In-place dropout in train mode under every tracer (found by benchmarks/jit_private_random.py:
torchvision's EfficientNet-B0, MNASNet and MobileNetV3 heads use ``nn.Dropout(inplace=True)``).

jit records ``aten::dropout_(Tensor(a!) self, float p, bool train)``, whose tensor argument is
``self``: the dropout handler asked for ``input`` and the count failed with a HandlerError.
Oracle: hand counts (docs/conventions.md: dropout in training costs 2 FLOPs per element, the
mask scaled by 1/(1-p) and multiplied; feature dropout one mask element per (sample, channel)
plus one multiply per element; eval-mode dropout is free)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from flopcount import count_flops

B, T, D = 3, 4, 8
LINEAR_MACS = B * T * D * D  # Linear(8, 8) on B*T rows
N = B * T * D  # elements the dropout sees


@pytest.mark.parametrize("tracer", ["auto", "dispatch", "jit"])
@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize(
    "layer, dropout_flops",
    [(nn.Dropout, 2 * N), (nn.Dropout2d, B * T + N)],  # Dropout2d on (B, T, D): T is the channel dim
    ids=["Dropout", "Dropout2d"],
)
def test_inplace_dropout_counts_under_every_tracer(tracer: str, train: bool, layer: type, dropout_flops: int) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(D, D), layer(0.5, inplace=True)).train(train)
    result = count_flops(model, torch.randn(B, T, D), tracer=tracer)
    assert result.macs == LINEAR_MACS
    assert result.flops == 2 * LINEAR_MACS + (dropout_flops if train else 0)
