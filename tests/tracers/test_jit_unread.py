"""Work whose result the forward does not return is counted by every tracer (issue #9.1).

torch.jit's tracer removes, at the end of a trace, every op that does not lead to the
returned tensors. flopcount's jit tracer keeps them (``tracers/jit.py``,
``keep_unread_results`` in tracers/_jit_graph.py), so a discarded result, a value read into Python (``if``,
``.item()``, ``float()``), a loss whose checks only steer Python, count the same under
``jit``, ``dispatch`` and ``auto`` — and equal the formula written here by hand from
docs/conventions.md's per-op costs. Batch > 1, 3-D and non-contiguous inputs, train and eval.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from conftest import assert_same_state, snapshot
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from flopcount import TraceError, count_flops

TRACERS = ("jit", "dispatch", "auto")
B, S, D = 3, 5, 8  # batch > 1, a sequence dim: 3-D inputs


def non_contiguous(*shape: int) -> torch.Tensor:
    return torch.randn(*shape[:-2], shape[-1], shape[-2]).transpose(-1, -2)


def _inputs(kind: str) -> torch.Tensor:
    x = torch.randn(B, S, D) if kind == "3d" else non_contiguous(B, S, D)
    assert x.is_contiguous() == (kind == "3d")
    return x


# --------------------------------------------------------------------------- discarded results


class Discards(nn.Module):
    """Calls ``aux`` twice and drops both results; a BatchNorm whose result is dropped too."""

    def __init__(self) -> None:
        super().__init__()
        self.aux = nn.Linear(D, 16)
        self.norm = nn.BatchNorm1d(S)
        self.body = nn.Linear(D, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _ = self.aux(x)
        self.aux(x)
        self.norm(x)
        return self.body(x)


@pytest.mark.parametrize("kind", ["3d", "non_contiguous"])
@pytest.mark.parametrize("train", [False, True])
@pytest.mark.parametrize("tracer", TRACERS)
def test_discarded_results_are_counted(tracer: str, train: bool, kind: str) -> None:
    model = Discards().train(train)
    x = _inputs(kind)
    before, saved = snapshot(model), x.clone()
    r = count_flops(model, x, tracer=tracer)
    rows = B * S
    assert r.by_module("macs") == {
        "": rows * D * (2 * 16 + 4),
        "aux": 2 * rows * D * 16,
        "norm": 0,
        "body": rows * D * 4,
    }
    assert next(m for m in r.modules if m.name == "aux").calls == 2
    # the dropped BatchNorm, in its own module (docs/conventions.md "Normalisation", N elements,
    # G = S channels): normalise 2N + 2G, affine 2N, batch statistics 4N + 2G in train mode
    n, g = x.numel(), S
    assert r.by_module("flops")["norm"] == 4 * n + 2 * g + (4 * n + 2 * g if train else 0)
    assert r.complete and not r.gaps
    assert_same_state(model, before)  # the BatchNorm's running stats are given back in train mode
    assert torch.equal(x, saved)


def test_discarded_results_counted_alike_by_every_tracer() -> None:
    model, x = Discards().train(), non_contiguous(B, S, D)
    results = {tracer: count_flops(model, x, tracer=tracer) for tracer in TRACERS}
    flops = {tracer: r.flops for tracer, r in results.items()}
    # three Linears' MACs (2 FLOPs each; fused biases free) + the train-mode BatchNorm over N = x.numel()
    # elements in G = S channels: statistics 4N + 2G, normalise 2N + 2G, affine 2N
    n, g = x.numel(), S
    assert flops == {tracer: 2 * B * S * D * (2 * 16 + 4) + 2 * (4 * n + 2 * g) for tracer in TRACERS}


class DiscardsAlias(nn.Module):
    """Discarded ops called by torch's alias names (jit renames them when the trace ends)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        torch.greater(x, 0)
        torch.multiply(x, 2.0)
        torch.absolute(x)
        return x.sum(-1)


@pytest.mark.parametrize("tracer", TRACERS)
def test_discarded_alias_ops_are_counted_under_their_canonical_names(tracer: str) -> None:
    x = torch.randn(B, S, D)
    r = count_flops(DiscardsAlias(), x, tracer=tracer)
    n = x.numel()
    by_op = {op: f for op, f in r.by_operator("flops").items() if f}
    assert by_op == {"aten::gt": n, "aten::mul": n, "aten::abs": n, "aten::sum": n}  # 1 per element each
    assert not r.unsupported_ops()


# --------------------------------------------------------------------------- values read into Python


class ReadsValues(nn.Module):
    """Ops whose results only steer Python: an ``if`` on a tensor, ``.item()``, ``float()``, ``int()``."""

    def __init__(self) -> None:
        super().__init__()
        self.big = nn.Linear(D, 32)
        self.small = nn.Linear(D, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = float(x.mean())
        count = int((x > 0).sum())
        if x.abs().sum().item() > 0 and count >= 0:
            return self.big(x) * scale
        return self.small(x)


@pytest.mark.parametrize("kind", ["3d", "non_contiguous"])
@pytest.mark.parametrize("train", [False, True])
@pytest.mark.parametrize("tracer", TRACERS)
def test_values_read_into_python_are_counted(tracer: str, train: bool, kind: str) -> None:
    model = ReadsValues().train(train)
    x = _inputs(kind)
    before = snapshot(model)
    r = count_flops(model, x, tracer=tracer)
    n, rows = x.numel(), B * S
    read = (n + 1) + (n + n) + (n + n)  # mean; gt + sum; abs + sum (the comparisons after .item() are Python)
    big = rows * D * 32
    assert r.macs == big  # the branch this input takes
    # a linear is 2 FLOPs per MAC (its bias add is not counted, as in torch); then the `* scale` multiply
    assert r.flops == read + 2 * big + rows * 32
    assert_same_state(model, before)


# --------------------------------------------------------------------------- shape arithmetic


class ShapeMaths(nn.Module):
    """Python arithmetic on sizes (a tensor op under jit tracing, a Python int in eager), and
    an explicit ``torch.tensor(size)`` that eager runs as tensor ops too (DeBERTa's scale)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        heads = min(d, 2)
        scale = d**-0.5
        h = x.reshape(b, s, heads, d // heads) * scale
        explicit = torch.sqrt(torch.tensor(x.size(-1), dtype=torch.float) * 3)
        return h.sum(-1) / explicit


@pytest.mark.parametrize("tracer", TRACERS)
def test_size_arithmetic_is_not_counted_explicit_tensors_are(tracer: str) -> None:
    x = torch.randn(B, S, D)
    r = count_flops(ShapeMaths(), x, tracer=tracer)
    n = x.numel()
    out = n // (D // 2)
    # mul by scale n; sum over the last dim n; the explicit sqrt(tensor(d) * 3): mul 1 + sqrt 1; divide out
    assert r.flops == n + n + 2 + out


def _same_padding(x: Any, k: int, s: int, d: int) -> Any:
    """timm's ``get_same_padding`` (TF "SAME"), rewritten: under jit tracing a size is a 0-d
    tensor and takes the tensor branch; in eager it is an int and takes ``math.ceil``."""
    if isinstance(x, torch.Tensor):
        return torch.clamp(((x / s).ceil() - 1) * s + (k - 1) * d + 1 - x, min=0)
    return max((math.ceil(x / s) - 1) * s + (k - 1) * d + 1 - x, 0)


class SamePadConv(nn.Module):
    """timm's ``Conv2dSame``: pad the input as TF "SAME" would, then a stride-2 convolution."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ih, iw = x.size()[-2:]
        ph, pw = _same_padding(ih, 3, 2, 1), _same_padding(iw, 3, 2, 1)
        x = F.pad(x, (pw // 2, pw - pw // 2, ph // 2, ph - ph // 2))
        return self.conv(x)


@pytest.mark.parametrize("train", [False, True])
@pytest.mark.parametrize("tracer", TRACERS)
def test_tf_same_padding_arithmetic_is_not_counted(tracer: str, train: bool) -> None:
    """Issue #29 item 5: jit counted the padding's 0-d ceil/clamp/mul/sub/floor_divide
    (+20 FLOPs here) that eager runs as Python ints. Oracle: FlopCounterMode run live on the
    real forward (the convolution), plus BatchNorm by hand; the padding adds nothing."""
    model = SamePadConv().train(train)
    x = torch.randn(2, 3, 17, 17)
    # 17 -> ceil(17 / 2) = 9 outputs per side; padding (9 - 1) * 2 + 3 - 17 = 2 -> 19 x 19 in;
    # conv FLOPs = 2 x (N x C_out x 9 x 9) x (C_in x 3 x 3)
    with FlopCounterMode(display=False) as counter:
        out = model(x)
    assert out.shape == (2, 8, 9, 9)
    conv_flops = counter.get_total_flops()
    assert conv_flops == 2 * (2 * 8 * 9 * 9) * (3 * 3 * 3)
    before = snapshot(model)
    r = count_flops(model, x, tracer=tracer)
    assert_same_state(model, before)
    assert r.flops == conv_flops and r.macs == conv_flops // 2
    assert {op for op, flops in r.by_operator().items() if flops} == {"aten::convolution"}


# --------------------------------------------------------------------------- losses (zoo rows)


@pytest.mark.filterwarnings("ignore:reduction. .mean. divides")
@pytest.mark.parametrize("log_target", [False, True])
@pytest.mark.parametrize("reduction", ["batchmean", "mean", "sum", "none"])
@pytest.mark.parametrize("tracer", TRACERS)
def test_kl_div_loss(tracer: str, reduction: str, log_target: bool) -> None:
    loss = nn.KLDivLoss(reduction=reduction, log_target=log_target)
    x = non_contiguous(B, S, D).log_softmax(-1)
    t = torch.randn(B, S, D).softmax(-1)
    t = t.log() if log_target else t
    n = x.numel()
    # torch's kernel: xlogy(t, t) - t * x (4 per element) or exp(t) * (t - x) (3)
    per = 3 if log_target else 4
    reduce = {"none": 0, "sum": n, "mean": n + 1, "batchmean": n + 1}[reduction]  # batchmean: sum, / batch
    r = count_flops(loss, (x, t), tracer=tracer)
    assert r.flops == per * n + reduce and r.macs == 0


def _gaussian_nll_flops(n: int, m: int, reduction: str, full: bool) -> int:
    """F.gaussian_nll_loss by hand: ``var < 0`` and ``any`` (only steer a Python ``raise``),
    clamp on var (m elements each); log(var) m, (x - t) n, ** 2 n, / var n, + n, 0.5 * n,
    ``+ const`` n with ``full``; the reduction (sum n, mean n + 1)."""
    checks = m + m
    body = m + m + n + n + n + n + n + (n if full else 0)
    return checks + body + {"none": 0, "sum": n, "mean": n + 1}[reduction]


@pytest.mark.parametrize("full", [False, True])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("tracer", TRACERS)
def test_gaussian_nll_loss(tracer: str, reduction: str, full: bool) -> None:
    loss = nn.GaussianNLLLoss(full=full, reduction=reduction)
    x, t = non_contiguous(B, S, D), torch.randn(B, S, D)
    var = torch.rand(B, S, D) + 0.1
    r = count_flops(loss, (x, t, var), tracer=tracer)
    assert r.flops == _gaussian_nll_flops(x.numel(), var.numel(), reduction, full)


@pytest.mark.parametrize("tracer", TRACERS)
def test_gaussian_nll_loss_one_variance_per_row(tracer: str) -> None:
    x, t = torch.randn(B, S, D), torch.randn(B, S, D)
    var = torch.rand(B, S) + 0.1  # unsqueezed to (B, S, 1) and broadcast
    r = count_flops(nn.GaussianNLLLoss(), (x, t, var), tracer=tracer)
    assert r.flops == _gaussian_nll_flops(x.numel(), var.numel(), "mean", False)


# --------------------------------------------------------------------------- script calls, failures


@torch.jit.script
def _scripted(x: torch.Tensor) -> torch.Tensor:
    return x * 2.0 + 1.0


class DiscardsScriptCall(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(D, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _scripted(x)
        return self.fc(x)


def test_discarded_script_call_is_counted() -> None:
    x = torch.randn(B, S, D)
    jit, dispatch = (count_flops(DiscardsScriptCall(), x, tracer=t) for t in ("jit", "dispatch"))
    n = x.numel()
    assert jit.flops == dispatch.flops == 2 * n + 2 * B * S * D * D  # the script's mul and add; the linear


class FailsAfterDiscarding(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.aux = nn.Linear(D, D)
        self.norm = nn.BatchNorm1d(S)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.aux(x)
        self.norm(x)
        raise ValueError("boom")


@pytest.mark.parametrize("train", [False, True])
def test_state_kept_when_the_forward_raises(train: bool) -> None:
    model, x = FailsAfterDiscarding().train(train), torch.randn(B, S, D)
    before, saved = snapshot(model), x.clone()
    with pytest.raises(TraceError, match="boom"):
        count_flops(model, x, tracer="jit")
    assert_same_state(model, before)
    assert torch.equal(x, saved)


class _Twice(torch.autograd.Function):
    """A custom Function: jit records it as a ``prim::PythonOp`` holding the ops its forward
    ran (its ``Subgraph``); those are counted once, in the Function's place."""

    @staticmethod
    def forward(ctx: object, x: torch.Tensor) -> torch.Tensor:
        _ = x.sum()  # dead inside the Function, but it ran
        return x * 2

    @staticmethod
    def backward(ctx: object, grad: torch.Tensor) -> torch.Tensor:
        return grad * 2


class CallsFunction(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _Twice.apply(x)  # discarded
        y = _Twice.apply(x)
        x.abs()  # discarded, after the Function's own ops
        return y


def test_custom_function_counted_once() -> None:
    x = torch.randn(B, S, D)
    r = count_flops(CallsFunction(), x, tracer="jit")
    # per call the sum (N) and the mul (N), counted once each (not again as the ops left
    # after the PythonOp node), plus the discarded abs
    assert r.by_operator("count") == {"aten::sum": 2, "aten::mul": 2, "aten::abs": 1}
    assert r.flops == 2 * (x.numel() + x.numel()) + x.numel()
    dispatch = count_flops(CallsFunction(), x, tracer="dispatch")  # sees inside: sum, mul per call; abs
    assert dispatch.flops == 2 * (x.numel() + x.numel()) + x.numel()
