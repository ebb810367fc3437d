"""Live cross-checks of single handlers against independent tools run in the test:
torch.utils.flop_counter.FlopCounterMode (FLOPs) and fvcore's FlopCountAnalysis (MACs).
The OpCalls are built by hand from the shapes the real ops produced."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from flopcount.handlers import build_default_registry
from flopcount.types import OpCall, TensorMeta

REG = build_default_registry()


def meta(t):
    return TensorMeta(tuple(t.shape), str(t.dtype).replace("torch.", ""))


def handler_cost(op, outputs=(), **args):
    return REG.resolve(op)(OpCall(op, args, tuple(outputs)))


def torch_flops(fn, *args, **kwargs):
    counter = FlopCounterMode(display=False)
    with counter:
        out = fn(*args, **kwargs)
    return int(counter.get_total_flops()), out


@settings(max_examples=30, deadline=None)
@given(
    dims=st.integers(1, 3), groups=st.sampled_from([1, 2]), cin=st.integers(1, 3), cout=st.integers(1, 3),
    k=st.integers(1, 3), stride=st.integers(1, 2), padding=st.integers(0, 1), dilation=st.integers(1, 2),
    transposed=st.booleans(), bias=st.booleans(),
)
def test_conv_matches_flop_counter(dims, groups, cin, cout, k, stride, padding, dilation, transposed, bias):
    cin, cout = cin * groups, cout * groups
    x = torch.randn((2, cin) + (6,) * dims)
    w = torch.randn((cin, cout // groups) + (k,) * dims) if transposed else torch.randn((cout, cin // groups) + (k,) * dims)
    b = torch.randn(cout) if bias else None
    fn = getattr(F, f"conv_transpose{dims}d" if transposed else f"conv{dims}d")
    kwargs = dict(stride=stride, padding=padding, dilation=dilation, groups=groups)
    if transposed and padding >= dilation * (k - 1) + 1:
        return  # negative output size
    flops, out = torch_flops(fn, x, w, b, **kwargs)
    ours = handler_cost(
        "aten::convolution", outputs=(meta(out),), input=meta(x), weight=meta(w), bias=meta(b) if bias else None,
        stride=(stride,) * dims, padding=(padding,) * dims, dilation=(dilation,) * dims, transposed=transposed,
        output_padding=(0,) * dims, groups=groups,
    )
    assert ours.flops == flops and ours.flops == 2 * ours.macs


@pytest.mark.parametrize("transposed", [False, True])
def test_conv_backward_matches_flop_counter_without_groups(transposed):
    # torch's backward formula ignores groups; with groups=1 both must agree (bias grad not counted by torch)
    x = torch.randn(2, 3, 7, 7, requires_grad=True)
    w = torch.randn((3, 4, 3, 3) if transposed else (4, 3, 3, 3), requires_grad=True)
    conv = F.conv_transpose2d if transposed else F.conv2d
    out = conv(x, w, stride=2, padding=1)
    counter = FlopCounterMode(display=False)
    with counter:
        out.sum().backward()
    ours = handler_cost(
        "aten::convolution_backward", outputs=(meta(x), meta(w), None), grad_output=meta(out), input=meta(x),
        weight=meta(w), bias_sizes=None, stride=(2, 2), padding=(1, 1), dilation=(1, 1), transposed=transposed,
        output_padding=(0, 0), groups=1, output_mask=(True, True, False),
    )
    assert ours.flops == counter.get_total_flops()


@settings(max_examples=30, deadline=None)
@given(b=st.integers(1, 3), n=st.integers(1, 6), k=st.integers(1, 6), m=st.integers(1, 6))
def test_mm_family_matches_flop_counter(b, n, k, m):
    A, B = torch.randn(n, k), torch.randn(k, m)
    flops, out = torch_flops(torch.mm, A, B)
    assert handler_cost("aten::mm", self=meta(A), mat2=meta(B)).flops == flops
    flops, _ = torch_flops(torch.addmm, torch.randn(m), A, B)
    assert handler_cost("aten::addmm", self=TensorMeta((m,)), mat1=meta(A), mat2=meta(B)).flops == flops
    X, Y = torch.randn(b, n, k), torch.randn(b, k, m)
    flops, _ = torch_flops(torch.bmm, X, Y)
    assert handler_cost("aten::bmm", self=meta(X), mat2=meta(Y)).flops == flops
    flops, _ = torch_flops(torch.baddbmm, torch.randn(b, n, m), X, Y)
    assert handler_cost("aten::baddbmm", self=TensorMeta((b, n, m)), batch1=meta(X), batch2=meta(Y)).flops == flops
    Z = torch.randn(2, 1, n, k)
    flops, _ = torch_flops(torch.matmul, Z, Y)
    assert handler_cost("aten::matmul", self=meta(Z), other=meta(Y)).flops == flops
    flops, _ = torch_flops(F.linear, X, torch.randn(m, k), torch.randn(m))
    assert handler_cost("aten::linear", input=meta(X), weight=TensorMeta((m, k)), bias=TensorMeta((m,))).flops == flops


@pytest.mark.parametrize(
    "equation, shapes",
    [
        ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
        ("bhqd,bhkd->bhqk", [(2, 3, 4, 5), (2, 3, 6, 5)]),
        ("...ij,...jk->...ik", [(2, 3, 4), (2, 4, 5)]),
        ("ij,jk,kl->il", [(3, 4), (4, 5), (5, 2)]),
        ("i,i->", [(7,), (7,)]),
    ],
)
def test_einsum_matches_flop_counter(equation, shapes):
    # torch decomposes einsum into bmm, which FlopCounterMode counts
    tensors = [torch.randn(s) for s in shapes]
    flops, _ = torch_flops(torch.einsum, equation, *tensors)
    ours = handler_cost("aten::einsum", equation=equation, tensors=tuple(meta(t) for t in tensors), path=None)
    assert ours.flops == flops


@pytest.mark.parametrize("gqa", [False, True])
@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_matches_flop_counter_on_meta(gqa, causal):
    q = torch.randn(2, 8, 16, 32, device="meta")
    hkv = 2 if gqa else 8
    k, v = torch.randn(2, hkv, 24, 32, device="meta"), torch.randn(2, hkv, 24, 16, device="meta")
    if causal:
        k, v = k[:, :, :16], v[:, :, :16]
    kwargs = {"enable_gqa": True} if gqa else {}
    flops, out = torch_flops(F.scaled_dot_product_attention, q, k, v, is_causal=causal, **kwargs)
    if flops == 0:
        pytest.skip("this torch does not count SDPA on meta tensors")
    ours = handler_cost(
        "aten::scaled_dot_product_attention", query=meta(q), key=meta(k), value=meta(v), attn_mask=None,
        dropout_p=0.0, is_causal=causal, scale=None, enable_gqa=gqa,
    )
    assert ours.flops == flops and ours.flops == 2 * ours.macs


def test_sdpa_backward_matches_flop_counter_on_meta():
    q = torch.randn(2, 4, 16, 32, device="meta", requires_grad=True)
    k = torch.randn(2, 4, 24, 32, device="meta", requires_grad=True)
    v = torch.randn(2, 4, 24, 16, device="meta", requires_grad=True)
    out = F.scaled_dot_product_attention(q, k, v)
    counter = FlopCounterMode(display=False)
    with counter:
        out.sum().backward()
    if counter.get_total_flops() == 0:
        pytest.skip("this torch does not count SDPA backward on meta tensors")
    # meta runs the math path: its backward is 4 bmm of the forward's sizes (2x the forward)
    forward = 2 * 8 * 16 * 24 * (32 + 16)
    assert counter.get_total_flops() == 2 * forward
    # a fused kernel recomputes the scores: torch's formula for the fused backward kernels
    from torch.utils.flop_counter import sdpa_backward_flop_count

    ours = handler_cost(
        "aten::_scaled_dot_product_efficient_attention_backward", grad_out_=meta(out), query=meta(q), key=meta(k), value=meta(v)
    )
    assert ours.flops == sdpa_backward_flop_count(out.shape, q.shape, k.shape, v.shape)


class _Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, stride=2, padding=1, bias=True)
        self.dw = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.fc = nn.Linear(8 * 4 * 4, 10)

    def forward(self, x):
        return self.fc(self.dw(self.conv(x)).flatten(1))


def test_macs_match_fvcore():
    fvcore_nn = pytest.importorskip("fvcore.nn")
    model, x = _Tiny(), torch.randn(2, 3, 8, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        analysis = fvcore_nn.FlopCountAnalysis(model, (x,))
        analysis.unsupported_ops_warnings(False)
        expected = int(analysis.total())  # fvcore calls one MAC a "flop"
    h1 = model.conv(x)
    h2 = model.dw(h1)
    conv = lambda inp, layer, out: handler_cost(
        "aten::_convolution", outputs=(meta(out),), input=meta(inp), weight=meta(layer.weight), bias=meta(layer.bias),
        stride=layer.stride, padding=layer.padding, dilation=layer.dilation, transposed=False, output_padding=(0, 0),
        groups=layer.groups, benchmark=False, deterministic=False, cudnn_enabled=True, allow_tf32=True,
    )
    total = conv(x, model.conv, h1).macs + conv(h1, model.dw, h2).macs
    total += handler_cost("aten::linear", input=TensorMeta((2, 128)), weight=meta(model.fc.weight), bias=meta(model.fc.bias)).macs
    assert total == expected


def test_bmm_einsum_macs_match_fvcore():
    fvcore_nn = pytest.importorskip("fvcore.nn")

    class M(nn.Module):
        def forward(self, a, b):
            return torch.einsum("bij,bjk->bik", a, b) + torch.bmm(a, b)

    a, b = torch.randn(2, 3, 4), torch.randn(2, 4, 5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        analysis = fvcore_nn.FlopCountAnalysis(M(), (a, b))
        analysis.unsupported_ops_warnings(False)
        expected = int(analysis.total())
    ours = handler_cost("aten::einsum", equation="bij,bjk->bik", tensors=(meta(a), meta(b)), path=None).macs
    ours += handler_cost("aten::bmm", self=meta(a), mat2=meta(b)).macs
    assert ours == expected
