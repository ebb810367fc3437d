"""The README's headline figures, each from an independent source: the published
ResNet-50 MACs and parameter count (torchvision's weights metadata, REFERENCES.md),
``torch.utils.flop_counter`` run live for the contraction FLOPs, and the per-element
formulas of docs/conventions.md applied by hand (through forward hooks) for the rest."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from examples.resnet import Bottleneck, resnet50
from flopcount import count_flops

PUBLISHED_MACS = 4_089_184_256  # torchvision resnet50 `_ops` (GMAC), exact conv + linear count
PUBLISHED_PARAMS = 25_557_032


def _elementwise_flops_by_hand(model: nn.Module, x: torch.Tensor) -> int:
    """BatchNorm (eval, affine): 4N + 2C; ReLU: N; 3x3 max pool: 9 per output; the
    residual add: N; global average pool: inputs + outputs (docs/conventions.md)."""
    total = 0

    def hook(module: nn.Module, args, out) -> None:
        nonlocal total
        if isinstance(module, nn.BatchNorm2d):
            total += 4 * out.numel() + 2 * out.shape[1]
        elif isinstance(module, nn.ReLU):
            total += out.numel()
        elif isinstance(module, nn.MaxPool2d):
            total += 9 * out.numel()
        elif isinstance(module, Bottleneck):
            total += out.numel()
        elif isinstance(module, nn.AdaptiveAvgPool2d):
            total += args[0].numel() + out.numel()

    handles = [m.register_forward_hook(hook) for m in model.modules()]
    try:
        with torch.no_grad():
            model(x)
    finally:
        for h in handles:
            h.remove()
    return total


def test_resnet50_headline_figures():
    model = resnet50().eval()
    x = torch.randn(1, 3, 224, 224)
    with FlopCounterMode(display=False) as peer:
        with torch.no_grad():
            model(x)
    contraction_flops = peer.get_total_flops()
    r = count_flops(model, x)
    assert r.macs == PUBLISHED_MACS
    assert r.params == PUBLISHED_PARAMS
    assert contraction_flops == 2 * PUBLISHED_MACS
    assert r.flops == contraction_flops + _elementwise_flops_by_hand(model, x)
