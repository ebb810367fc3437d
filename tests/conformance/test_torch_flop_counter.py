"""Conformance with PyTorch's ``test/test_flop_counter.py`` (torch.utils.flop_counter).

Each case names its source test. FLOPs are compared with ``FlopCounterMode`` run live on
the same function and inputs, and with the figure torch's test publishes. torch counts
contractions only, so where other ops run the comparison is ``2 * macs`` (flopcount's
contraction FLOPs); ``flops`` additionally holds the documented elementwise costs.
"""

from __future__ import annotations

from typing import Any, Callable, Tuple

import pytest
import torch
import torch.nn.functional as F
from _conformance import BACKWARD_TRACERS, TRACERS, Fn, count, torch_flops
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count

from flopcount import Cost


def T(*shape: int, grad: bool = False) -> torch.Tensor:
    return torch.randn(*shape, requires_grad=grad)


# -- test_flop_counter_variety ------------------------------------------------------------


class _Variety(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(9, 10)

    def forward(self, *xs: torch.Tensor) -> torch.Tensor:
        a, b, c, d, e, f, g, x = xs
        torch.mm(a, b)
        torch.addmm(c, a, b, beta=0.5, alpha=0.5)
        torch.matmul(d, e)
        torch.einsum("ab,bc->ac", f, g)
        return self.lin(x)  # only the last result is returned


@pytest.mark.parametrize("tracer", TRACERS)
def test_flop_counter_variety(tracer: str) -> None:
    # torch: test_flop_counter_variety (published total 3012)
    model = _Variety()
    xs = (T(4, 5), T(5, 6), T(4, 6), T(5, 6), T(6, 7), T(6, 7), T(7, 8), T(8, 9))
    expected, _ = torch_flops(lambda: model(*xs))
    assert expected == 3012
    result = count(model, xs, tracer)
    # four of the five results are discarded: every tracer counts them all (#9.1)
    assert result.flops == 2 * result.macs == expected and result.complete


# -- test_op ---------------------------------------------------------------------------------

_OPS = {
    # name: (function, input shapes, torch's published FLOPs)
    "mm": (torch.mm, ((4, 5), (5, 6)), 240),
    "bmm": (torch.bmm, ((3, 4, 5), (3, 5, 6)), 720),
    "addmm": (torch.addmm, ((4, 6), (4, 5), (5, 6)), 240),
    "addmm_column_bias": (torch.addmm, ((4, 1), (4, 5), (5, 6)), 240),
    "addmm_row_bias": (torch.addmm, ((6,), (4, 5), (5, 6)), 240),
    "baddbmm": (torch.baddbmm, ((3, 4, 6), (3, 4, 5), (3, 5, 6)), 720),
    "conv2d": (lambda x, w: torch.conv2d(x, w, padding=1), ((2, 3, 6, 6), (6, 3, 4, 4)), 28800),
    "conv1d": (lambda x, w: torch.conv1d(x, w, padding=1), ((2, 3, 6), (6, 3, 4)), 1440),
}


@pytest.mark.parametrize("tracer", TRACERS)
@pytest.mark.parametrize("name", sorted(_OPS))
def test_op(name: str, tracer: str) -> None:
    # torch: test_op (one op per block; the three addmm bias shapes share the figure 720)
    fn, shapes, published = _OPS[name]
    xs = tuple(T(*s) for s in shapes)
    expected, _ = torch_flops(lambda: fn(*xs))
    assert expected == published
    result = count(Fn(fn), xs, tracer)
    assert result.flops == 2 * result.macs == expected  # bias adds are not counted, as in torch


# -- test_backward / test_backward_reset -----------------------------------------------------


@pytest.mark.parametrize("tracer", BACKWARD_TRACERS)
def test_backward(tracer: str) -> None:
    # torch: test_backward (published 5184)
    def f(a: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
        h = torch.mm(a, w1).unsqueeze(0).expand(7, 4, 6)
        return torch.bmm(h, w2)

    a, w1, w2 = T(4, 5, grad=True), T(5, 6), T(7, 6, 7)
    expected, _ = torch_flops(lambda: f(a, w1, w2).sum().backward())
    assert expected == 5184
    a.grad = None
    result = count(Fn(f), (a, w1, w2), tracer, backward=True)
    assert 2 * result.macs == expected
    assert a.grad is None  # the user's tensors keep no gradient


@pytest.mark.parametrize("tracer", BACKWARD_TRACERS)
def test_backward_reset(tracer: str) -> None:
    # torch: test_backward_reset runs forward + backward of a @ a.T twice (published 960);
    # one count is one step
    def f(a: torch.Tensor) -> torch.Tensor:
        return a.mm(a.t())

    a = T(4, 5, grad=True)
    twice, _ = torch_flops(lambda: (f(a).sum().backward(), f(a).sum().backward()))
    assert twice == 960
    result = count(Fn(f), (a,), tracer, backward=True)
    assert 2 * result.macs == twice // 2


# -- test_torchscript --------------------------------------------------------------------------


def _square(x: torch.Tensor) -> torch.Tensor:
    return torch.mm(x, x)


@pytest.mark.parametrize("tracer", TRACERS)
def test_torchscript(tracer: str) -> None:
    # torch: test_torchscript -- a scripted function counts what the plain one counts
    scripted = torch.jit.script(_square)
    x = T(5, 5)
    expected, _ = torch_flops(lambda: _square(x))
    scripted_torch, _ = torch_flops(lambda: scripted(x))
    assert expected == scripted_torch == 250
    result = count(Fn(scripted), (x,), tracer)
    assert result.flops == 2 * result.macs == expected
    assert result.unsupported_ops() == {}


# -- test_autograd_op --------------------------------------------------------------------------


class _MmSelf(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return torch.mm(x, x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return torch.mm(grad, grad) + torch.mm(grad, grad)


@pytest.mark.parametrize("tracer", BACKWARD_TRACERS)
def test_autograd_op(tracer: str) -> None:
    # torch: test_autograd_op (published 750: one mm forward, two in backward)
    a = T(5, 5, grad=True)
    expected, _ = torch_flops(lambda: _MmSelf.apply(a).sum().backward())
    assert expected == 750
    result = count(Fn(_MmSelf.apply), (a,), tracer, backward=True)
    assert 2 * result.macs == expected
    assert result.flops == expected + 25  # + the add of the two gradients (1 per element)


# -- test_conv_backwards_as_decomposition ------------------------------------------------------


class _OnlyConvs(torch.autograd.Function):
    """conv1d / conv_transpose1d whose backward is written as forward convolutions."""

    @staticmethod
    def forward(x: torch.Tensor, weight: torch.Tensor, transposed: bool) -> torch.Tensor:
        return F.conv_transpose1d(x, weight) if transposed else F.conv1d(x, weight)

    @staticmethod
    def setup_context(ctx: Any, inputs: Tuple[Any, ...], output: Any) -> None:
        x, weight, transposed = inputs
        ctx.save_for_backward(x, weight)
        ctx.transposed = transposed

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Tuple[Any, ...]:
        x, weight = ctx.saved_tensors
        if ctx.transposed:
            grad_w = F.conv1d(grad.transpose(0, 1), x.transpose(0, 1)).transpose(0, 1)
            return F.conv1d(grad, weight), grad_w, None
        return F.conv_transpose1d(grad, weight), F.conv1d(x.transpose(0, 1), grad.transpose(0, 1)).transpose(0, 1), None


@pytest.mark.parametrize("tracer", BACKWARD_TRACERS)
@pytest.mark.parametrize("transposed", [False, True])
def test_conv_backwards_as_decomposition(transposed: bool, tracer: str) -> None:
    # torch: test_conv_backwards_as_decomposition -- convolution_backward costs what the
    # forward convolutions computing the same gradients cost (torch's formula rests on this)
    x = torch.randn(2, 3, 16, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(3, 4, 4, dtype=torch.float64, requires_grad=True)
    if not transposed:
        weight = torch.randn(4, 3, 4, dtype=torch.float64, requires_grad=True)
    loss = lambda out: out.pow(2).sum()
    plain = Fn(lambda a, w: F.conv_transpose1d(a, w) if transposed else F.conv1d(a, w))
    fused = count(plain, (x, weight), tracer, backward=True, loss_fn=loss)
    decomposed = count(
        Fn(lambda a, w: _OnlyConvs.apply(a, w, transposed)), (x, weight), tracer, backward=True, loss_fn=loss
    )
    assert fused.macs == decomposed.macs
    expected, _ = torch_flops(lambda: loss(plain(x, weight)).backward())
    assert 2 * fused.macs == expected


# -- test_convs ----------------------------------------------------------------------------------

_CONVS = [
    ("transpose_1x1x2x2", True, (1, 1, 2, 2), (1, 1, 2, 2), 32),
    ("conv_1x1_kernel", False, (1, 1, 2, 2), (1, 1, 1, 1), 8),
] + [
    (
        f"{kind}_{cin}_{cout}",
        kind == "transpose",
        (1, cin, 4, 4),
        (cin, cout, 2, 2) if kind == "transpose" else (cout, cin, 2, 2),
        None,
    )
    for cin, cout in [(1, 1), (1, 3), (3, 1), (3, 7), (2, 4), (4, 2)]
    for kind in ("conv", "transpose")
]


@pytest.mark.parametrize("tracer", BACKWARD_TRACERS)
@pytest.mark.parametrize("case", _CONVS, ids=[c[0] for c in _CONVS])
def test_convs(case: Tuple[Any, ...], tracer: str) -> None:
    # torch: test_convs -- the backward (grad_input + grad_weight) is twice the forward
    _, transposed, xs, ws, published = case
    x, w = torch.rand(*xs, requires_grad=True), torch.randn(*ws, requires_grad=True)
    fn: Callable[..., torch.Tensor] = F.conv_transpose2d if transposed else F.conv2d
    _, table = torch_flops(lambda: fn(x, w).sum().backward())
    forward = table["Global"][torch.ops.aten.convolution]
    assert table["Global"][torch.ops.aten.convolution_backward] == 2 * forward
    if published is not None:
        assert forward == published
    result = count(Fn(fn), (x, w), tracer, backward=True)
    assert 2 * result.by_phase("macs")["forward"] == forward
    assert 2 * result.by_phase("macs")["backward"] == 2 * forward


# -- test_module (ResNet-18 forward + backward) ---------------------------------------------------


@pytest.mark.parametrize("tracer", BACKWARD_TRACERS)
def test_module(tracer: str) -> None:
    # torch: test_module -- torchvision's resnet18, 1x3x224x224, forward + backward with the
    # input requiring grad: published 10,884,440,064 FLOPs; layer1 conv 924,844,032 forward,
    # 1,849,688,064 backward. examples/resnet.py builds the same network (torchvision is
    # not installed here).
    from examples.resnet import resnet18

    model = resnet18()
    x = torch.randn(1, 3, 224, 224, requires_grad=True)
    result = count(model, (x,), tracer, backward=True)
    assert 2 * result.macs == 10_884_440_064
    layer1 = result.by_module_and_operator("macs")["layer1"]
    assert 2 * layer1["aten::convolution"] == 924_844_032
    assert 2 * layer1["aten::convolution_backward"] == 1_849_688_064


# -- test_conv_transpose_loop ---------------------------------------------------------------------


@pytest.mark.convention("grad_bias of convolution_backward costs numel(grad_output) FLOPs; torch does not count it")
@pytest.mark.parametrize("tracer", BACKWARD_TRACERS)
def test_conv_transpose_loop(tracer: str) -> None:
    # torch: test_conv_transpose_loop -- 50 forward + backward steps, published 1,536,000
    x = torch.rand(1, 4, 30, 2)
    model = nn.ConvTranspose2d(4, 8, (2, 2), stride=2)

    def fifty() -> None:
        for _ in range(50):
            model(x).sum().backward()

    expected, _ = torch_flops(fifty)
    model.zero_grad(set_to_none=True)
    assert expected == 1_536_000
    result = count(model, (x,), tracer, backward=True)
    assert 50 * 2 * result.macs == expected
    grad_bias = 1 * 8 * 60 * 4  # numel(grad_output): one add per element into the bias gradient
    assert result.flops == 2 * result.macs + grad_bias


# -- test_custom ----------------------------------------------------------------------------------


@pytest.mark.parametrize("tracer", TRACERS)
def test_custom(tracer: str) -> None:
    # torch: test_custom -- a user formula replaces the built-in one: constant 5, then numel
    a = T(4, 5)
    add = Fn(lambda t: t + t)
    assert count(add, (a,), tracer, handlers={"aten::add": lambda call: Cost.from_flops(5)}).flops == 5
    numel = count(add, (a,), tracer, handlers={"aten::add": lambda call: Cost.from_flops(call.out().numel)})
    assert numel.flops == 20


# -- test_noop ------------------------------------------------------------------------------------


@pytest.mark.convention("elementwise ops cost FLOPs (cos: 1 per element); torch counts contractions only")
@pytest.mark.parametrize("tracer", TRACERS)
def test_noop(tracer: str) -> None:
    # torch: test_noop -- cos runs, torch counts nothing
    a = T(4, 5)
    expected, _ = torch_flops(lambda: a.cos())
    assert expected == 0
    result = count(Fn(torch.cos), (a,), tracer)
    assert result.macs == expected and result.flops == 20 and result.unsupported_ops() == {}


# -- test_sdpa (CUDA in torch; ported to the CPU flash and math backends) ------------------------

_BACKENDS = {"flash": SDPBackend.FLASH_ATTENTION, "math": SDPBackend.MATH}
# (batch, heads, Lq, Lk, E, Ev) of torch's test and its published forward FLOPs
_UNIFORM = ((4, 8, 128, 128, 64, 64), 134_217_728)
_NONUNIFORM = ((4, 8, 128, 256, 64, 64), 268_435_456)


def _qkv(b: int, h: int, lq: int, lk: int, e: int, ev: int) -> Tuple[torch.Tensor, ...]:
    torch.manual_seed(0)
    return T(b, h, lq, e, grad=True), T(b, h, lk, e, grad=True), T(b, h, lk, ev, grad=True)


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, dropout_p=0.0, is_causal=True)


@pytest.mark.parametrize("tracer", TRACERS)
@pytest.mark.parametrize("backend", sorted(_BACKENDS))
@pytest.mark.parametrize("shape", [_UNIFORM, _NONUNIFORM], ids=["uniform", "nonuniform"])
def test_sdpa_forward(shape: Tuple[Any, int], backend: str, tracer: str) -> None:
    # torch: test_sdpa, forward: every backend counts the same; no causal halving
    dims, published = shape
    q, k, v = _qkv(*dims)
    assert sdpa_flop_count(q.shape, k.shape, v.shape) == published
    with sdpa_kernel(_BACKENDS[backend]):
        if backend == "math":  # torch counts the math path's bmm ops live on CPU
            expected, _ = torch_flops(lambda: _sdpa(q, k, v))
            assert expected == published
        result = count(Fn(_sdpa), (q, k, v), tracer)
    assert 2 * result.macs == published


@pytest.mark.parametrize("tracer", BACKWARD_TRACERS)
@pytest.mark.parametrize("backend", sorted(_BACKENDS))
@pytest.mark.parametrize("shape", [_UNIFORM, _NONUNIFORM], ids=["uniform", "nonuniform"])
def test_sdpa_backward(shape: Tuple[Any, int], backend: str, tracer: str) -> None:
    # torch: test_sdpa, forward + backward. The math path runs its decomposition's backward
    # (4 bmm: fw + bw = 3x fw, published 805,306,368 non-uniform); the fused kernels
    # recompute the scores (fw + bw = 3.5x fw uniform, published 939,524,096 non-uniform
    # for mem-efficient; the CPU flash kernel does the same work)
    dims, forward = shape
    q, k, v = _qkv(*dims)
    with sdpa_kernel(_BACKENDS[backend]):
        if backend == "math":
            expected, _ = torch_flops(lambda: _sdpa(q, k, v).sum().backward())
            assert expected == 3 * forward
        else:
            expected = forward + sdpa_backward_flop_count(q.shape, q.shape, k.shape, v.shape)
            assert expected == (forward * 7 // 2 if dims[2] == dims[3] else 939_524_096)
        result = count(Fn(_sdpa), (q, k, v), tracer, backward=True)
    assert 2 * result.macs == expected


@pytest.mark.parametrize("tracer", BACKWARD_TRACERS)
def test_sdpa_backward_small_flash(tracer: str) -> None:
    # torch: test_sdpa's formula at the shape (2, 4, 16, 8): the CPU flash backward
    # kernel costs sdpa_backward_flop_count = 163,840 FLOPs (2.5x the 65,536 forward)
    q, k, v = _qkv(2, 4, 16, 16, 8, 8)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        result = count(Fn(_sdpa), (q, k, v), tracer, backward=True)
    assert result.by_phase()["backward"] == sdpa_backward_flop_count(q.shape, q.shape, k.shape, v.shape) == 163_840
    assert result.by_phase()["forward"] == 65_536


# -- test_addmm_out -------------------------------------------------------------------------------


@pytest.mark.parametrize("tracer", TRACERS)
def test_addmm_out(tracer: str) -> None:
    # torch: test_addmm_out -- mm with out= (published 2000)
    def f(x: torch.Tensor) -> torch.Tensor:
        y = torch.zeros(10, 10)
        return torch.mm(x, x, out=y)

    x = torch.randn(10, 10)
    expected, _ = torch_flops(lambda: f(x))
    assert expected == 2000
    assert 2 * count(Fn(f), (x,), tracer).macs == expected


# -- test_hook_registration -----------------------------------------------------------------------


@pytest.mark.parametrize("tracer", TRACERS)
def test_hook_registration(tracer: str) -> None:
    # torch: test_hook_registration -- global module hooks are gone after counting
    from torch.nn.modules import module as mod

    model, x = nn.Linear(100, 100), torch.randn(3, 100)
    before = (len(mod._global_forward_pre_hooks), len(mod._global_forward_hooks))
    expected, _ = torch_flops(lambda: model(x).sum().backward())
    model.zero_grad(set_to_none=True)
    if tracer == "jit":  # forward only
        expected, _ = torch_flops(lambda: model(x))
    result = count(model, (x,), tracer, backward=tracer != "jit")
    assert (len(mod._global_forward_pre_hooks), len(mod._global_forward_hooks)) == before
    assert 2 * result.macs == expected


# -- test_pytrees ---------------------------------------------------------------------------------


class _DictMm(nn.Module):
    def forward(self, x: Any) -> Any:
        y = x["a"].relu_()
        return {"a": torch.mm(y, y)}


class _DictNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = _DictMm()
        self.b = _DictMm()

    def forward(self, x: Any) -> Any:
        return self.b(self.a(x))


class _TupleMm(nn.Module):
    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor]:
        return (torch.mm(x, x),)


@pytest.mark.parametrize("tracer", BACKWARD_TRACERS)
def test_pytrees(tracer: str) -> None:
    # torch: test_pytrees -- dict and tuple inputs/outputs; the root's mm FLOPs (forward +
    # backward) are 12,000 and 6,000
    def fresh() -> Any:
        return {"a": torch.randn(10, 10, requires_grad=True).clone()}

    model = _DictNet()
    _, table = torch_flops(lambda: model(fresh())["a"].sum().backward())
    assert table["_DictNet"][torch.ops.aten.mm] == 12_000
    result = count(model, (fresh(),), tracer, backward=True, loss_fn=lambda out: out["a"].sum())
    ops = result.by_module_and_operator("macs")
    assert 2 * ops[""]["aten::mm"] == 12_000
    assert 2 * (ops["a"]["aten::mm"] + ops["b"]["aten::mm"]) == 12_000

    tup = _TupleMm()
    _, table = torch_flops(lambda: tup(torch.randn(10, 10, requires_grad=True))[0].sum().backward())
    assert table["_TupleMm"][torch.ops.aten.mm] == 6_000
    result = count(tup, (torch.randn(10, 10, requires_grad=True),), tracer, backward=True)
    assert 2 * result.by_module_and_operator("macs")[""]["aten::mm"] == 6_000
