"""Conformance with fvcore's ``tests/test_flop_count.py`` (per-op cases).

fvcore counts MACs (it calls them flops) of the ops it knows, so flopcount's ``macs`` is
compared with fvcore's ``FlopCountAnalysis`` run live on the same module and inputs, and
with the ground truth fvcore's test derives. Norms, pooling and upsampling are costed by
flopcount's own documented formulas (FLOPs, no MACs): those cases are marked convention.
"""

from __future__ import annotations

from typing import Any, Dict, Tuple

import pytest
import torch
import torch.nn.functional as F
from _conformance import TRACERS, Fn, count, fvcore_analysis, torch_flops
from torch import nn

from flopcount import Cost


def _fv_total(model: nn.Module, inputs: Tuple[Any, ...]) -> int:
    return int(fvcore_analysis(model, inputs).total())


class _ThreeNet(nn.Module):
    def __init__(self, cin: int, conv: int, linear: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, conv, 1, 1)
        self.pool = nn.AdaptiveAvgPool2d((1, 1))
        self.linear1 = nn.Linear(conv, linear)
        self.linear2 = nn.Linear(linear, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear2(self.linear1(torch.flatten(self.pool(self.conv(x)), 1)))


class _LinearSigmoid(nn.Module):
    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.conv = nn.Linear(cin, cout)
        self.sigmoid = nn.Sigmoid()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.sigmoid(self.conv(x))


# -- test_customized_ops / test_skip_ops / test_nn / test_linear ---------------------------------


@pytest.mark.parametrize("tracer", TRACERS)
def test_customized_ops(tracer: str) -> None:
    # fvcore: test_customized_ops -- a new handle for sigmoid, then one replacing the linear's
    model, x = _LinearSigmoid(5, 4), torch.rand(10, 5)
    result = count(model, (x,), tracer, handlers={"aten::sigmoid": lambda call: Cost.from_flops(10_000)})
    assert result.by_operator()["aten::sigmoid"] == 10_000
    dummy = {op: (lambda call: Cost.from_macs(400_000)) for op in ("aten::linear", "aten::addmm")}
    result = count(model, (x,), tracer, handlers=dummy)
    assert result.macs == 400_000


@pytest.mark.convention("sigmoid has a handler (4 FLOPs per element); fvcore skips it as unsupported")
@pytest.mark.parametrize("tracer", TRACERS)
def test_skip_ops(tracer: str) -> None:
    # fvcore: test_skip_ops -- fvcore reports aten::sigmoid as skipped once
    model, x = _LinearSigmoid(5, 4), torch.rand(10, 5)
    assert fvcore_analysis(model, (x,)).unsupported_ops() == {"aten::sigmoid": 1}
    result = count(model, (x,), tracer)
    assert result.unsupported_ops() == {}
    assert result.by_operator()["aten::sigmoid"] == 4 * 10 * 4  # 1 / (1 + exp(-x))
    assert result.macs == _fv_total(model, (x,)) == 10 * 5 * 4


@pytest.mark.parametrize("tracer", TRACERS)
@pytest.mark.parametrize("shape", [(5, 8), (5, 10), (5, 5, 10)], ids=["nn_linear", "2d", "3d"])
def test_linear(shape: Tuple[int, ...], tracer: str) -> None:
    # fvcore: test_nn (Linear(8, 4), batch 5) and test_linear (Linear(10, 20), 2-D and 3-D input)
    out = 4 if shape[-1] == 8 else 20
    model, x = nn.Linear(shape[-1], out), torch.randn(*shape)
    expected = x.numel() * out  # rows x in x out
    assert _fv_total(model, (x,)) == expected
    assert count(model, (x,), tracer).macs == expected


# -- test_conv -------------------------------------------------------------------------------------

# (dim, batch, cin, cout, spatial, kernel, padding, stride, groups, transposed, output_padding)
_CONVS = {
    "2d": (2, 5, 10, 3, 15, 3, 1, 1, 1, False, 0),
    "2d_strided": (2, 2, 10, 6, 20, 3, 1, 2, 1, False, 0),
    "group": (2, 5, 16, 8, 15, 5, 2, 1, 4, False, 0),
    "depthwise": (2, 5, 16, 8, 15, 3, 1, 1, 8, False, 0),
    "1d": (1, 5, 10, 3, 15, 3, 1, 1, 1, False, 0),
    "3d": (3, 5, 10, 3, 15, 3, 1, 1, 1, False, 0),
    "transposed_2d": (2, 5, 10, 3, 15, 3, 1, 1, 1, True, 0),
    "transposed_2d_strided": (2, 5, 10, 3, 15, 3, 1, 2, 1, True, 0),
    "transposed_2d_output_padding": (2, 5, 10, 3, 15, 3, 1, 3, 1, True, 2),
}


@pytest.mark.parametrize("tracer", TRACERS)
@pytest.mark.parametrize("name", sorted(_CONVS))
def test_conv(name: str, tracer: str) -> None:
    # fvcore: test_conv -- batch x Cin x Cout x k^d x positions^d / groups, where a transposed
    # conv's positions are its input's
    dim, batch, cin, cout, spatial, k, pad, stride, groups, transposed, out_pad = _CONVS[name]
    layer = (
        [nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d]
        if transposed
        else [nn.Conv1d, nn.Conv2d, nn.Conv3d]
    )
    extra = {"output_padding": out_pad} if transposed else {}
    model = layer[dim - 1](cin, cout, k, stride, pad, groups=groups, **extra)
    x = torch.randn(batch, cin, *([spatial] * dim))
    positions = spatial if transposed else (spatial + 2 * pad - k) // stride + 1
    expected = batch * cin * cout * k**dim * positions**dim // groups
    assert _fv_total(model, (x,)) == expected
    result = count(model, (x,), tracer)
    assert result.macs == expected and result.flops == 2 * expected  # bias not counted


# -- test_matmul / test_matmul_broadcast / test_bmm / test_einsum / test_torch_mm -----------------

_CONTRACTIONS: Dict[str, Tuple[Any, Tuple[Tuple[int, ...], ...], int]] = {
    "matmul": (torch.matmul, ((20, 10), (10, 100)), 20 * 10 * 100),
    "matmul_broadcast_1": (torch.matmul, ((1, 20, 10), (1, 10, 100)), 20 * 10 * 100),
    "matmul_broadcast_2x2": (torch.matmul, ((2, 2, 20, 10), (2, 2, 10, 100)), 4 * 20 * 10 * 100),
    "matmul_broadcast_3d_2d": (torch.matmul, ((1, 20, 10), (10, 100)), 20 * 10 * 100),
    "matmul_broadcast_batch2": (torch.matmul, ((2, 20, 10), (10, 100)), 2 * 20 * 10 * 100),
    "bmm": (torch.bmm, ((2, 5, 2), (2, 2, 12)), 2 * 2 * 12 * 5),
    "einsum_nct_ncp": (lambda x, y: torch.einsum("nct,ncp->ntp", x, y), ((1, 5, 2), (1, 5, 12)), 1 * 2 * 12 * 5),
    "einsum_ntg_ncg": (lambda x, y: torch.einsum("ntg,ncg->nct", x, y), ((1, 2, 6), (1, 5, 6)), 1 * 2 * 6 * 5),
    "einsum_complicated": (lambda x, y: torch.einsum("nc,nchw->hw", x, y), ((3, 4), (3, 4, 2, 3)), 72),
    "torch_mm": (torch.mm, ((3, 4), (4, 5)), 60),
    "torch_matmul": (torch.matmul, ((3, 4), (4, 5)), 60),
}


@pytest.mark.parametrize("tracer", TRACERS)
@pytest.mark.parametrize("name", sorted(_CONTRACTIONS))
def test_contraction(name: str, tracer: str) -> None:
    # fvcore: test_matmul, test_matmul_broadcast (4 shapes), test_bmm, test_einsum (2),
    # TestFlopCountHandles.test_complicated_einsum and test_torch_mm (mm, matmul)
    fn, shapes, expected = _CONTRACTIONS[name]
    xs = tuple(torch.randn(*s) for s in shapes)
    assert _fv_total(Fn(fn), xs) == expected
    result = count(Fn(fn), xs, tracer)
    assert result.macs == expected
    torch_total, _ = torch_flops(lambda: fn(*xs))
    assert result.flops == 2 * expected == torch_total


# -- test_batchnorm and the norm / upsample handles --------------------------------------------------


def _norm_flops(n: int, groups: int, stats: bool, weight: bool, bias: bool) -> int:
    """docs/conventions.md: statistics 4N + 2G, normalise 2N + 2G, affine N (+ N)."""
    return (4 * n + 2 * groups if stats else 0) + 2 * n + 2 * groups + (n if weight else 0) + (n if bias else 0)


_BATCHNORMS = {
    # name: (module, input shape, fvcore's per-element constant)
    "batchnorm1d_eval": (lambda: nn.BatchNorm1d(10, affine=False).eval(), (10, 10), 1),
    "batchnorm2d_train": (lambda: nn.BatchNorm2d(10, affine=False), (10, 10, 5, 5), 4),
    "batchnorm3d_train": (lambda: nn.BatchNorm3d(10, affine=False), (10, 10, 5, 5, 5), 4),
}


@pytest.mark.convention(
    "norms cost their documented FLOPs (statistics, normalise, affine) and no MACs; "
    "fvcore counts 1 (eval) or 4 (train) per element"
)
@pytest.mark.parametrize("tracer", TRACERS)
@pytest.mark.parametrize("name", sorted(_BATCHNORMS))
def test_batchnorm(name: str, tracer: str) -> None:
    # fvcore: test_batchnorm (BatchNorm1d eval, BatchNorm2d/3d in training mode)
    make, shape, per_element = _BATCHNORMS[name]
    model, x = make(), torch.randn(*shape)
    assert _fv_total(model, (x,)) == per_element * x.numel()
    running = model.running_mean.clone()
    result = count(model, (x,), tracer)
    assert torch.equal(model.running_mean, running)  # training mode: stats left as found
    assert result.macs == 0
    assert result.flops == _norm_flops(x.numel(), 10, model.training, False, False)


def _fv_handle(fn: Any, args: Tuple[Any, ...], op: str) -> int:
    """One fvcore handle applied to the single ``op`` node of the traced function."""
    fvcore = pytest.importorskip("fvcore.nn.flop_count")
    tensors = tuple(a for a in args if isinstance(a, torch.Tensor))
    graph = torch.jit.trace(lambda *_: fn(*args), tensors, check_trace=False).graph
    (node,) = [n for n in graph.nodes() if n.kind() == op]
    return int(fvcore._DEFAULT_SUPPORTED_OPS[op](list(node.inputs()), list(node.outputs())))


def _vec() -> torch.Tensor:
    return torch.rand(2)


_HANDLES = {
    # name: (function, args, fvcore op, fvcore's count, flopcount's documented FLOPs)
    "batch_norm_eval_affine": (
        F.batch_norm,
        (torch.rand(2, 2, 2, 2), _vec(), _vec(), _vec(), _vec()),
        "aten::batch_norm",
        32,
        _norm_flops(16, 2, False, True, True),
    ),
    "batch_norm_eval": (
        F.batch_norm,
        (torch.rand(2, 2, 2, 2), _vec(), _vec(), None, None),
        "aten::batch_norm",
        16,
        _norm_flops(16, 2, False, False, False),
    ),
    "batch_norm_train_affine": (
        F.batch_norm,
        (torch.rand(2, 2, 2, 2), _vec(), _vec(), _vec(), _vec(), True),
        "aten::batch_norm",
        80,
        _norm_flops(16, 2, True, True, True),
    ),
    "group_norm_affine": (
        F.group_norm,
        (torch.rand(2, 2, 2, 2), 2, _vec(), _vec()),
        "aten::group_norm",
        80,
        _norm_flops(16, 4, True, True, True),
    ),
    "group_norm": (
        F.group_norm,
        (torch.rand(2, 2, 2, 2), 2, None, None),
        "aten::group_norm",
        64,
        _norm_flops(16, 4, True, False, False),
    ),
    "upsample_bilinear": (
        lambda x: F.interpolate(x, None, 2, "bilinear", False),
        (torch.rand(2, 2, 2, 2),),
        "aten::upsample_bilinear2d",
        2**4 * 4 * 4,
        9 * 2 * 2 * 4 * 4,  # 3 lerps of 3 FLOPs per output element
    ),
}


@pytest.mark.convention(
    "norms and bilinear upsampling cost their documented FLOPs; fvcore uses its own per-element constants"
)
@pytest.mark.parametrize("tracer", TRACERS)
@pytest.mark.parametrize("name", sorted(_HANDLES))
def test_handles(name: str, tracer: str) -> None:
    # fvcore: TestFlopCountHandles.test_batch_norm (3), test_group_norm (2), test_upsample
    fn, args, op, fv_count, ours = _HANDLES[name]
    assert _fv_handle(fn, args, op) == fv_count
    tensors = tuple(a for a in args if isinstance(a, torch.Tensor))
    model = Fn(lambda *ts: fn(*_refill(args, ts)))
    result = count(model, tensors, tracer)
    assert result.macs == 0 and result.flops == ours


def _refill(args: Tuple[Any, ...], tensors: Tuple[torch.Tensor, ...]) -> Tuple[Any, ...]:
    it = iter(tensors)
    return tuple(next(it) if isinstance(a, torch.Tensor) else a for a in args)


# -- test_threeNet / test_flop_counter_class ----------------------------------------------------------


@pytest.mark.convention(
    "adaptive_avg_pool2d costs window sums + one divide per output (2,000 + 20 FLOPs, no MACs); "
    "fvcore counts 1 per input element"
)
@pytest.mark.parametrize("tracer", TRACERS)
def test_three_net(tracer: str) -> None:
    # fvcore: test_threeNet and test_flop_counter_class (by_module)
    model, x = _ThreeNet(2, 5, 3), torch.randn(4, 2, 10, 10)
    conv, linear1, linear2 = 4 * 5 * 2 * 10 * 10, 4 * 5 * 3, 4 * 3 * 1
    fv = fvcore_analysis(model, (x,)).by_module()
    assert (fv["conv"], fv["linear1"], fv["linear2"], fv["pool"]) == (conv, linear1, linear2, conv // 2)
    result = count(model, (x,), tracer)
    macs = result.by_module("macs")
    assert (macs["conv"], macs["linear1"], macs["linear2"], macs["pool"]) == (conv, linear1, linear2, 0)
    assert macs[""] == conv + linear1 + linear2
    assert result.by_module()["pool"] == 4 * 5 * 10 * 10 + 4 * 5


# -- test_autograd_function / test_scripted_function ---------------------------------------------------


class _Identity(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return torch.ones_like(grad)


@pytest.mark.convention(
    "every tracer sees inside the Function (jit through the PythonOp's recorded subgraph): an identity costs 0, "
    "as in torch; fvcore can only count it through a handle for prim::PythonOp (42)"
)
@pytest.mark.parametrize("tracer", ["jit", "dispatch", "auto"])
def test_autograd_function_seen_inside(tracer: str) -> None:
    # fvcore: test_autograd_function -- a handle for the opaque custom Function node
    result = count(Fn(_Identity.apply), (torch.rand(4, 5),), tracer, handlers={"prim::PythonOp": lambda call: Cost.from_flops(42)})
    assert result.flops == 0 and result.unsupported_ops() == {}
    assert result.tracer == ("jit" if tracer == "jit" else "dispatch")


def _self_matmul(x: torch.Tensor) -> torch.Tensor:
    return x @ x


class _CallsScripted(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.jit.script(_self_matmul)(x * x)


@pytest.mark.convention("a scripted function is counted (jit inlines it); fvcore leaves prim::CallFunction unsupported")
@pytest.mark.parametrize("tracer", TRACERS)
def test_scripted_function(tracer: str) -> None:
    # fvcore: test_scripted_function (fvcore reports prim::CallFunction as unsupported)
    model, x = _CallsScripted(), torch.rand(5, 5)
    assert "prim::CallFunction" in fvcore_analysis(model, (x,)).unsupported_ops()
    expected, _ = torch_flops(lambda: model(x))
    result = count(model, (x,), tracer)
    assert result.unsupported_ops() == {}
    assert 2 * result.macs == expected == 250
    assert result.flops == expected + 25  # + x * x
