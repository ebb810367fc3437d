"""nn.TransformerEncoder in eval with a key-padding mask (issue #9, finding 6).

Eager PyTorch takes the nested-tensor fast path there: jit records it with nested tensors
(no sizes), and on meta tensors the mask check ``_nested_tensor_from_mask_left_aligned``
has no kernel. Every tracer, on CPU and on meta, counts it at the padded shape, as the
dispatch tracer runs it; the MACs are the formula written out below.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from torch import nn

from flopcount import count_flops

B, L, E, H, FF, LAYERS = 3, 6, 8, 2, 16, 2


def _encoder() -> nn.Module:
    torch.manual_seed(0)
    return nn.TransformerEncoder(nn.TransformerEncoderLayer(E, H, FF, batch_first=True), LAYERS)


def _inputs(device: str = "cpu") -> Any:
    x = torch.randn(B, E, L).transpose(1, 2)  # (B, L, E), non-contiguous
    mask = torch.zeros(B, L, dtype=torch.bool)
    mask[1, 4:] = True  # the second sequence has 4 valid tokens, the third 5
    mask[2, 5:] = True
    return x.to(device), mask.to(device)


def _macs() -> int:
    """Per layer: q/k/v and output projections, the two feed-forward linears on every
    (padded) token, and QK^T + AV per head."""
    tokens = B * L
    return LAYERS * (tokens * (4 * E * E + 2 * E * FF) + B * H * L * L * 2 * (E // H))


def _count(model: nn.Module, x: torch.Tensor, mask: torch.Tensor, tracer: str) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's nested-tensor prototype warning
        return count_flops(model, (x,), kwargs={"src_key_padding_mask": mask}, tracer=tracer)


@pytest.mark.parametrize("tracer", ["jit", "dispatch", "auto"])
@pytest.mark.parametrize("train", [False, True])
def test_padding_mask_counted_by_every_tracer(tracer: str, train: bool) -> None:
    model = _encoder().train(train)
    x, mask = _inputs()
    x0, mask0 = x.clone(), mask.clone()
    result = _count(model, x, mask, tracer)
    reference = _count(model, x, mask, "dispatch")
    assert result.macs == _macs()
    if tracer == "jit" and not train:
        # jit sees inside the fast path's left-aligned mask check (a kernel dispatch books as
        # one zero-cost op): on the B x L mask a logical_not (N) and a cumsum (N), and an argmin
        # over the mask with a column of zeros appended (B x (L + 1)); nothing else
        extra = {
            op: flops - reference.by_operator().get(op, 0)
            for op, flops in result.by_operator().items()
            if flops != reference.by_operator().get(op, 0)
        }
        rows, cols = mask.shape
        assert extra == {"aten::logical_not": rows * cols, "aten::cumsum": rows * cols, "aten::argmin": rows * (cols + 1)}
        assert result.flops - reference.flops == sum(extra.values())
    else:
        assert (result.macs, result.flops) == (reference.macs, reference.flops)
    assert result.unsupported_ops() == {}
    assert torch.equal(x, x0) and torch.equal(mask, mask0)
    assert model.training is train


def test_padding_mask_on_meta_equals_cpu() -> None:
    cpu = _count(_encoder().eval(), *_inputs(), "dispatch")
    with torch.device("meta"):
        model = _encoder().eval()
    meta = _count(model, *_inputs("meta"), "auto")
    assert (meta.macs, meta.flops) == (cpu.macs, cpu.flops) == (_macs(), cpu.flops)
    assert meta.complete
    # since #32.1 the meta model runs on fake CPU copies (the default path), not as given
    assert not any("as given" in w for w in meta.warnings)
