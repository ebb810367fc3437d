"""Bytes an op reads and writes (docs/conventions.md, "Bytes"), checked against the tensor
sizes derived by hand: inputs read, outputs written, views free, in-place writes self."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from flopcount import count_flops
from flopcount.core.traffic import call_traffic, element_size
from flopcount.types import OpCall, TensorMeta

TRACERS = ["auto", "dispatch", "jit"]


def test_element_sizes():
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int8, torch.bool, torch.complex64):
        assert element_size(str(dtype).replace("torch.", "")) == torch.empty((), dtype=dtype).element_size()
    assert element_size(None) == 4


@pytest.mark.parametrize("tracer", TRACERS)
@pytest.mark.parametrize("batch", [1, 5])
def test_linear_reads_input_weight_bias_and_writes_output(tracer, batch):
    model = nn.Linear(48, 24).eval()
    x = torch.randn(batch, 7, 48)
    r = count_flops(model, x, tracer=tracer)
    read = 4 * (batch * 7 * 48 + 48 * 24 + 24)
    written = 4 * batch * 7 * 24
    assert r.operator_totals()["aten::linear"].bytes_read == read
    assert r.operator_totals()["aten::linear"].bytes_written == written
    assert r.by_operator("bytes") == {"aten::linear": read + written}
    assert r.bytes == read + written == r.by_module("bytes")[""]


class _Views(nn.Module):
    def forward(self, x):
        y = x.transpose(1, 2)          # a view: no traffic
        z = y.reshape(-1)              # not contiguous: a copy (dispatch sees clone/_unsafe_view)
        return z.relu_()               # in place: reads and writes z


@pytest.mark.parametrize("batch", [2, 3])
def test_views_are_free_copies_and_in_place_ops_are_not(batch):
    x = torch.randn(batch, 4, 6)
    n = x.numel() * 4
    r = count_flops(_Views(), x, tracer="dispatch")
    totals = r.operator_totals()
    assert totals["aten::relu_"].bytes_read == n and totals["aten::relu_"].bytes_written == n
    # the copy that makes the transposed tensor contiguous reads it and writes it once
    copies = {op: t for op, t in totals.items() if op in ("aten::clone", "aten::_unsafe_view", "aten::copy_")}
    assert sum(t.bytes_read for t in copies.values()) == n
    assert sum(t.bytes_written for t in copies.values()) == n
    for view in ("aten::transpose", "aten::view", "aten::_unsafe_view"):
        if view in totals and view != "aten::_unsafe_view":
            assert totals[view].bytes == 0


def test_bf16_conv_counts_bf16_bytes():
    conv = nn.Conv2d(3, 8, 3, bias=False).to(torch.bfloat16)
    x = torch.randn(2, 3, 10, 10, dtype=torch.bfloat16)
    r = count_flops(conv, x, tracer="dispatch")
    t = r.operator_totals()["aten::convolution"]
    assert t.bytes_read == 2 * (2 * 3 * 100 + 8 * 3 * 9)
    assert t.bytes_written == 2 * (2 * 8 * 8 * 8)
    assert t.intensity == pytest.approx(t.flops / t.bytes)


def test_foreach_ops_write_their_self_list():
    a, b = TensorMeta((3, 4), "float32"), TensorMeta((5,), "float32")
    call = OpCall("aten::_foreach_mul_", {"self": (a, b), "scalar": 0.5}, (None,))
    assert call_traffic(call, view=False) == (4 * 17, 4 * 17)


def test_empty_allocations_and_views_move_nothing():
    out = TensorMeta((1000,), "float32")
    assert call_traffic(OpCall("aten::empty", {"size": (1000,)}, (out,)), view=False) == (0, 0)
    assert call_traffic(OpCall("aten::view", {"self": out, "size": (10, 100)}, (TensorMeta((10, 100), "float32"),)), view=True) == (0, 0)
    assert call_traffic(OpCall("aten::zeros", {"size": (1000,)}, (out,)), view=False) == (0, 4000)


def test_backward_bytes_are_booked_by_phase():
    model = nn.Linear(16, 8)
    x = torch.randn(4, 16)
    r = count_flops(model, x, tracer="dispatch", backward=True)
    phases = r.by_phase("bytes")
    assert set(phases) == {"forward", "backward"}
    assert phases["forward"] == 4 * (4 * 16 + 16 * 8 + 8) + 4 * (4 * 8)
    assert sum(phases.values()) == r.bytes
