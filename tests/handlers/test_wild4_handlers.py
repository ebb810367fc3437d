"""Ops real code reaches that had no handler, so the count was incomplete (wild4): a spatial
transformer's ``F.affine_grid`` (``aten::affine_grid_generator``, every tracer), int8
``torch._int_mm``, ``torch.kron`` under jit, the backward of ``Tensor.unfold`` sliding windows,
the per-sample-weights gradient of ``nn.EmbeddingBag``, and ``pack_sequence``'s
``pad_sequence`` under jit. Oracles: hand counts of the kernels (docs/conventions.md) and
FlopCounterMode live where torch runs the same product as a ``bmm`` it counts."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import Fn
from torch import nn
from torch.nn.utils.rnn import pack_sequence
from torch.utils.flop_counter import FlopCounterMode

from flopcount import count_flops

TRACERS = ["auto", "dispatch", "jit"]


def _complete(model: nn.Module, args: tuple, tracer: str, backward: bool = False):  # type: ignore[no-untyped-def]
    r = count_flops(model, args, tracer=tracer, backward=backward)
    assert r.unsupported_ops() == {}, r.unsupported_ops()
    return r


@pytest.mark.parametrize("tracer", TRACERS)
@pytest.mark.parametrize("align_corners", [False, True])
def test_affine_grid(tracer: str, align_corners: bool) -> None:
    theta, size = torch.randn(2, 2, 3), (2, 3, 5, 7)
    model = Fn(lambda t: F.affine_grid(t, size, align_corners=align_corners))
    r = _complete(model, (theta,), tracer)
    # the kernel's bmm of the base grid (N, H*W, 3) by theta^T (N, 3, 2); its backward runs
    # the transposed product of the same size as a bmm FlopCounterMode counts
    t = theta.clone().requires_grad_()
    with FlopCounterMode(display=False) as counter:
        model(t).sum().backward()
    assert 2 * r.macs == counter.get_total_flops() == 2 * 2 * 35 * 3 * 2
    # without align_corners each axis' linspace is rescaled: a multiply and a divide per point
    assert r.flops == 2 * r.macs + (0 if align_corners else 2 * (5 + 7))


@pytest.mark.parametrize("tracer", TRACERS)
def test_affine_grid_volumetric(tracer: str) -> None:
    model = Fn(lambda t: F.affine_grid(t, (2, 3, 4, 5, 6), align_corners=True))
    r = _complete(model, (torch.randn(2, 3, 4),), tracer)
    assert (r.macs, r.flops) == (2 * 120 * 4 * 3, 2 * 2 * 120 * 4 * 3)


@pytest.mark.parametrize("tracer", ["auto", "dispatch"])
def test_spatial_transformer_backward_complete(tracer: str) -> None:
    model = Fn(lambda x, t: F.grid_sample(x, F.affine_grid(t, x.shape, align_corners=False), align_corners=False))
    r = _complete(model, (torch.randn(2, 3, 6, 8), torch.randn(2, 2, 3).requires_grad_()), tracer, backward=True)
    assert r.complete


@pytest.mark.parametrize("tracer", TRACERS)
def test_int_mm(tracer: str) -> None:
    a = torch.randint(-128, 127, (32, 64), dtype=torch.int8)
    b = torch.randint(-128, 127, (64, 16), dtype=torch.int8)
    r = _complete(Fn(torch._int_mm), (a, b), tracer)
    assert r.macs == 32 * 64 * 16  # one MAC per int8 product (conventions.md, quantized models)


@pytest.mark.parametrize("tracer", TRACERS)
@pytest.mark.parametrize("shapes, out", [(((2, 3), (4, 5)), 8 * 15), (((2, 3, 2), (4, 5)), 2 * 12 * 10)])
def test_kron(tracer: str, shapes: tuple, out: int) -> None:
    r = _complete(Fn(torch.kron), tuple(torch.randn(*s) for s in shapes), tracer)
    assert (r.macs, r.flops) == (0, out)  # one multiply per output element


@pytest.mark.parametrize("tracer", ["auto", "dispatch"])
def test_unfold_backward(tracer: str) -> None:
    x, w = torch.randn(2, 3, 20, requires_grad=True), torch.randn(5)
    r = _complete(Fn(lambda x, w: x.unfold(-1, 5, 2) @ w), (x, w), tracer, backward=True)
    windows = 2 * 3 * 8 * 5  # 8 windows of 5 per row
    # forward and backward products (FlopCounterMode's), then each window element added back
    assert r.by_operator("flops")["aten::unfold_backward"] == windows
    assert r.macs == 2 * windows


@pytest.mark.parametrize("tracer", ["auto", "dispatch"])
def test_embedding_bag_per_sample_weights_backward(tracer: str) -> None:
    bag = nn.EmbeddingBag(20, 8, mode="sum")
    idx, offsets, weights = torch.randint(0, 20, (12,)), torch.tensor([0, 5, 9]), torch.rand(12, requires_grad=True)
    r = _complete(Fn(lambda i, o, p: bag(i, o, per_sample_weights=p)), (idx, offsets, weights), tracer, backward=True)
    # each weight's gradient: its bag's gradient row . the looked-up row, 8 multiplies and 8 adds
    assert r.by_operator("flops")["aten::_embedding_bag_per_sample_weights_backward"] == 2 * 12 * 8


class Packed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gru = nn.GRU(5, 8, bidirectional=True)

    def forward(self, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        return self.gru(pack_sequence([a, b, c], enforce_sorted=False))[1]


@pytest.mark.parametrize("tracer", TRACERS)
def test_pack_sequence(tracer: str) -> None:
    model = Packed()
    seqs = (torch.randn(4, 5), torch.randn(6, 5), torch.randn(2, 5))
    r = _complete(model, seqs, tracer)
    assert r.macs == 2 * 12 * (3 * 8 * 5 + 3 * 8 * 8)  # 12 steps, 2 directions


class TimeBatchConv(nn.Module):
    """fairseq's ConvTBC: input (T, B, C_in), weight (K, C_in, C_out), padding on time."""

    def __init__(self) -> None:
        super().__init__()
        self.weight, self.bias = nn.Parameter(torch.randn(3, 4, 6)), nn.Parameter(torch.randn(6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.conv_tbc(x, self.weight, self.bias, 1)


@pytest.mark.parametrize("tracer", TRACERS)
def test_conv_tbc(tracer: str) -> None:
    model, x = TimeBatchConv(), torch.randn(5, 2, 4)
    r = _complete(model, (x,), tracer)
    # the same convolution as conv1d on (B, C_in, T) with weight (C_out, C_in, K), which
    # FlopCounterMode counts: T_out = 5 + 2 - 3 + 1 positions x B x C_out x C_in x K
    with FlopCounterMode(display=False) as counter:
        F.conv1d(x.permute(1, 2, 0), model.weight.detach().permute(2, 1, 0), padding=1)
    assert 2 * r.macs == counter.get_total_flops() == 2 * 5 * 2 * 6 * 4 * 3


class SpatialTransformer(nn.Module):
    """The localisation net's theta and ``x.size()`` (traced by jit: the sizes are not constants)."""

    def __init__(self) -> None:
        super().__init__()
        self.loc = nn.Linear(3 * 6 * 8, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        theta = self.loc(x.flatten(1)).view(-1, 2, 3)
        return F.grid_sample(x, F.affine_grid(theta, x.size(), align_corners=False), align_corners=False)


@pytest.mark.parametrize("tracer", TRACERS)
def test_spatial_transformer(tracer: str) -> None:
    r = _complete(SpatialTransformer(), (torch.randn(2, 3, 6, 8),), tracer)
    # the localisation Linear and affine_grid's bmm (2 x 48 locations x 3 x 2)
    assert r.macs == 2 * 144 * 6 + 2 * 48 * 3 * 2
