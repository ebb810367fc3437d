"""Regression tests for the five disagreements of issue #15, beyond the peers' own cases:
batch > 1, 3-D and non-contiguous inputs, train and eval, every tracer, the model left as
found. Oracles: torch's formulas and FlopCounterMode run live, and hand-derived counts."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from _conformance import BACKWARD_TRACERS, TRACERS, torch_flops
from conftest import assert_same_state, snapshot
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import sdpa_backward_flop_count

from flopcount import OpCall, TensorMeta, UnsupportedOpError, count_flops, default_registry

# -- 1. fused SDPA backward: what each kernel runs ----------------------------------------------


@settings(max_examples=40, deadline=None)
@given(
    b=st.integers(1, 3),
    hkv=st.integers(1, 3),
    rep=st.integers(1, 3),
    lq=st.integers(1, 9),
    lk=st.integers(1, 9),
    e=st.integers(1, 8),
    ev=st.integers(1, 8),
)
def test_fused_backward_kernels_match_torch_formula(
    b: int, hkv: int, rep: int, lq: int, lk: int, e: int, ev: int
) -> None:
    h = hkv * rep
    q, k, v, g = (b, h, lq, e), (b, hkv, lk, e), (b, hkv, lk, ev), (b, h, lq, ev)
    expected = sdpa_backward_flop_count(g, q, k, v)
    registry = default_registry()
    meta = {"grad_out": TensorMeta(g), "query": TensorMeta(q), "key": TensorMeta(k), "value": TensorMeta(v)}
    for op in (
        "aten::_scaled_dot_product_flash_attention_for_cpu_backward",
        "aten::_scaled_dot_product_flash_attention_backward",
        "aten::_scaled_dot_product_efficient_attention_backward",
        "aten::_scaled_dot_product_cudnn_attention_backward",
    ):
        cost = registry.resolve(op)(OpCall(op, meta))  # type: ignore[operator]
        assert cost.flops == 2 * cost.macs == expected, op
    # the (B, L, H, E) kernels
    bshd = {name: TensorMeta((s[0], s[2], s[1], s[3])) for name, s in (("query", q), ("key", k), ("value", v))}
    for op in ("aten::_flash_attention_backward", "aten::_efficient_attention_backward"):
        assert registry.resolve(op)(OpCall(op, bshd)).flops == expected  # type: ignore[operator]


class _Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.proj(F.scaled_dot_product_attention(q, k, v))


@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("tracer", BACKWARD_TRACERS)
def test_flash_backward_is_two_and_a_half_forwards_math_is_two(tracer: str, train: bool) -> None:
    model = _Attention().train(train)
    # non-contiguous (B, H, L, E) views of (B, L, H, E) tensors, batch 2
    q, k, v = (torch.randn(2, 16, 4, 8, requires_grad=True).transpose(1, 2) for _ in range(3))
    attention_fw = 2 * 2 * 4 * 16 * 16 * (8 + 8)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        flash = count_flops(model, (q, k, v), tracer=tracer, backward=True)
    assert flash.by_operator()["aten::_scaled_dot_product_flash_attention_for_cpu_backward"] == 5 * attention_fw // 2
    with sdpa_kernel(SDPBackend.MATH):
        math = count_flops(model, (q, k, v), tracer=tracer, backward=True)
        expected, _ = torch_flops(lambda: model(q, k, v).sum().backward())
    model.zero_grad(set_to_none=True)
    assert math.by_operator("macs")["aten::bmm"] * 2 == 2 * attention_fw  # dP, dV, dQ, dK: 4 bmm of the forward's sizes
    assert 2 * math.macs == expected  # torch counts the math path's bmm and the projection's mm live


# -- 3. a scripted function called from forward --------------------------------------------------


def _scaled_mm(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.softmax(torch.matmul(x, y.transpose(-1, -2)), -1)


def _loop(x: torch.Tensor) -> torch.Tensor:
    for _ in range(2):
        x = x @ x
    return x


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 6)
        self.drop = nn.Dropout(0.1)
        self.scripted = torch.jit.script(_scaled_mm)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.scripted(self.fc(x), x))


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([_Block(), _Block()])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x) @ x
        return x


@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("tracer", TRACERS)
def test_scripted_function_counted_in_its_module(tracer: str, train: bool) -> None:
    model = _Net().train(train)
    x = torch.randn(6, 3, 6).transpose(0, 1)  # batch 3, non-contiguous
    before = snapshot(model)
    result = count_flops(model, (x,), tracer=tracer, strict=True)
    assert_same_state(model, before)
    assert result.tracer == ("jit" if tracer == "jit" else "dispatch")  # auto counts on fake copies
    fc, scores, outer = 3 * 6 * 6 * 6, 3 * 6 * 6 * 6, 3 * 6 * 6 * 6  # rows x in x out; b x n x k x m
    macs = result.by_module("macs")
    assert macs["blocks.0"] == macs["blocks.1"] == fc + scores
    assert macs["blocks"] == 2 * (fc + scores) and macs[""] == 2 * (fc + scores + outer)
    assert (
        result.by_module_and_operator()["blocks.0"]["aten::softmax"] == 5 * 3 * 36  # one vocabulary for every tracer
    )


def test_scripted_function_with_a_loop_is_counted_under_auto() -> None:
    # the loop count is data to jit: it keeps the opaque call (reported, never zero); auto
    # counts on fake copies with the dispatch tracer, which sees every op the loop runs
    class Loop(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.jit.script(_loop)(x)

    x = torch.randn(2, 5, 5)
    assert count_flops(Loop(), (x,), tracer="jit").unsupported_ops() == {"prim::CallFunction": 1}
    result = count_flops(Loop(), (x,), tracer="auto", strict=True)
    assert result.tracer == "dispatch" and result.macs == 2 * 2 * 5 * 5 * 5
    assert result.complete


# -- 4. record_function markers are known zeros ----------------------------------------------------


class _Profiled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(10, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.profiler.record_function("my_region"):
            return self.fc(x)


@pytest.mark.parametrize("tracer", TRACERS)
def test_record_function_is_known_zero(tracer: str) -> None:
    x = torch.randn(4, 3, 10)
    result = count_flops(_Profiled(), (x,), tracer=tracer, strict=True)
    assert result.macs == 4 * 3 * 10 * 10 and result.unsupported_ops() == {}
    assert result.by_operator("count")["profiler::_record_function_exit"] == 1


def test_unknown_ops_still_raise_under_strict() -> None:
    class Odd(nn.Module):
        def forward(self, x: torch.Tensor) -> Any:
            return torch.ops.aten.special_bessel_j0(x)

    with pytest.raises(UnsupportedOpError):
        count_flops(Odd(), (torch.randn(3, 3),), tracer="dispatch", strict=True)


# -- 5. a module shared by two parents --------------------------------------------------------------


class _Holder(nn.Module):
    def __init__(self, shared: nn.Module) -> None:
        super().__init__()
        self.layers = nn.ModuleList([shared])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers[0](x)


class _TwoParents(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        shared = nn.Linear(10, 10)
        self.a, self.b = _Holder(shared), _Holder(shared)
        self.head = nn.Linear(10, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.a(x) + self.b(x) + self.b(x))


@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("tracer", TRACERS)
def test_shared_module_counts_for_the_parent_that_called_it(tracer: str, train: bool) -> None:
    model = _TwoParents().train(train)
    x = torch.randn(5, 2, 10)
    before = snapshot(model)
    kwargs = {"backward": True} if tracer != "jit" else {}
    result = count_flops(model, (x,), tracer=tracer, **kwargs)
    assert_same_state(model, before)
    call = 5 * 2 * 10 * 10
    macs = {name: n for name, n in result.by_module("macs").items()}
    forward = result.by_phase("macs")["forward"]
    assert forward == 3 * call + 5 * 2 * 10 * 2
    if tracer == "jit":
        # named once (a.layers.0), that row keeps all three calls; each parent (and the
        # never-called ModuleList in it) counts the calls made inside its forward
        assert macs == {
            "": forward,
            "a": call,
            "a.layers": call,
            "a.layers.0": 3 * call,
            "b": 2 * call,
            "b.layers": 2 * call,
            "head": 200,
        }
    assert macs["a"] + macs["b"] + macs["head"] == macs[""]
    assert macs["a.layers"] == macs["a"] and macs["b.layers"] == macs["b"]
