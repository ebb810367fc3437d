"""The jit tracer on a meta model with a convolution (issue #27's review).

While jit traces, ``tensor.size()`` gives 0-d tensors; torch's meta kernel for convolutions
(``meta_conv``, in Python) tests the output size with ``torch._check``, which refuses a tensor
("cond must be a bool"). The jit tracer cannot change that kernel, so it refuses clearly,
naming the module, the kernel and the tracers that count a meta model; the dispatch tracer
counts the same meta model, checked here against the hand formula
MACs = B x C_out x prod(out spatial) x C_in / groups x prod(kernel).
"""

from __future__ import annotations

from typing import Callable

import pytest
import torch
from torch import nn

from flopcount import TraceError, count_flops

B = 2


def _conv2d() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 4, 3))


def _conv1d() -> nn.Module:
    return nn.Sequential(nn.Conv1d(3, 4, 3))


def _conv_transpose() -> nn.Module:
    return nn.Sequential(nn.ConvTranspose2d(3, 4, 3))


# model, input shape, MACs by hand:
# conv2d: 16x16 -> 14x14 (8 x 3 x 3 x 3 per output) -> 12x12 (4 x 8 x 3 x 3 per output)
# conv1d: 10 -> 8, 4 outputs x 3 x 3 per position
# transposed: each of the 8 x 8 inputs scatters 3 x 4 x 3 x 3 products
CASES = {
    "conv2d": (_conv2d, (B, 3, 16, 16), B * (8 * 14 * 14 * 3 * 9 + 4 * 12 * 12 * 8 * 9)),
    "conv1d": (_conv1d, (B, 3, 10), B * 4 * 8 * 3 * 3),
    "conv_transpose2d": (_conv_transpose, (B, 3, 8, 8), B * 8 * 8 * 3 * 4 * 9),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("train", [False, True])
def test_jit_refuses_a_meta_convolution_by_name_and_dispatch_counts_it(case: str, train: bool) -> None:
    make, shape, macs = CASES[case]
    model: nn.Module = make().to("meta").train(train)
    x = torch.empty(shape, device="meta")
    flags = [m.training for m in model.modules()]
    with pytest.raises(TraceError) as caught:
        count_flops(model, x, tracer="jit")
    message = str(caught.value)
    # before: "forward failed ... TypeError: cond must be a bool, but got a Tensor"
    assert "cannot trace module '0' on meta tensors" in message and "meta_conv" in message
    assert "tracer='dispatch' or 'auto'" in message and isinstance(caught.value.__cause__, TypeError)
    assert [m.training for m in model.modules()] == flags
    for tracer in ("dispatch", "auto"):
        assert count_flops(model, x, tracer=tracer).macs == macs


def test_jit_counts_the_same_convolutions_on_real_tensors() -> None:
    for make, shape, macs in CASES.values():
        builder: Callable[[], nn.Module] = make
        assert count_flops(builder().eval(), torch.randn(shape), tracer="jit").macs == macs
