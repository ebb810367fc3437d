"""Quantized models (torch.ao.quantization, dynamic and static): packed weights count in
params and weight bytes at their stored sizes, and quantized linear/conv count the MACs
of the float layers (formulas derived here from the layer shapes)."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from flopcount import count_flops
from flopcount.core.params import summarize_parameters
from flopcount.errors import TraceError
from flopcount.handlers import build_default_registry
from flopcount.types import OpCall, TensorMeta

Q = pytest.importorskip("torch.ao.quantization")
REG = build_default_registry()


def quiet(fn, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args, **kwargs)


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.relu = nn.ReLU()
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x):
        return self.fc2(self.relu(self.fc1(x)))


@pytest.mark.parametrize("dtype, weight_bytes", [(torch.qint8, 1), (torch.float16, 2)])
def test_dynamic_linear(dtype, weight_bytes):
    model = quiet(Q.quantize_dynamic, MLP().eval(), {nn.Linear}, dtype=dtype)
    x = torch.randn(5, 8, 3).transpose(1, 2)  # (5, 3, 8), non-contiguous
    expected_before = quiet(model, x)
    rows = 5 * 3
    macs = rows * (8 * 16 + 16 * 4)
    for tracer in ("dispatch", "auto"):
        result = quiet(count_flops, model, x, tracer=tracer)
        assert result.unsupported_ops() == {}
        assert result.macs == macs
        assert result.flops == 2 * macs + rows * 16  # + the ReLU between the layers
    assert torch.equal(quiet(model, x), expected_before)
    with pytest.raises(TraceError, match="quantized packed parameters.*fc1"):
        count_flops(model, x, tracer="jit")
    summary = summarize_parameters(model)
    weights, biases = 8 * 16 + 16 * 4, 16 + 4
    assert (summary.total, summary.trainable, summary.frozen) == (weights + biases, 0, weights + biases)
    assert summary.param_bytes == weights * weight_bytes + biases * 4


class Static(nn.Module):
    def __init__(self):
        super().__init__()
        self.quant = Q.QuantStub()
        self.conv = nn.Conv2d(3, 4, 3)
        self.relu = nn.ReLU()
        self.grouped = nn.Conv2d(4, 4, 3, groups=2, padding=1)
        self.conv1d = nn.Conv1d(4, 6, 5, stride=2)
        self.fc = nn.Linear(6 * 16, 5)
        self.dequant = Q.DeQuantStub()

    def forward(self, x):
        x = self.quant(x)
        x = self.grouped(self.relu(self.conv(x)))  # (B, 4, 6, 6)
        x = self.conv1d(x.flatten(2))  # (B, 6, 16)
        return self.dequant(self.fc(x.flatten(1)))


def test_static_conv_and_linear():
    torch.manual_seed(0)
    model = Static().eval()
    x = torch.randn(2, 3, 8, 8)
    float_result = count_flops(model, x, tracer="dispatch")
    model.qconfig = Q.get_default_qconfig("fbgemm")
    quiet(Q.fuse_modules, model, [["conv", "relu"]], inplace=True)
    prepared = quiet(Q.prepare, model)
    prepared(x)
    quantized = quiet(Q.convert, prepared)
    b = 2
    macs = (
        b * 4 * 6 * 6 * 3 * 9  # conv: outputs x C_in x 3x3
        + b * 4 * 6 * 6 * 2 * 9  # grouped conv: outputs x C_in/groups x 3x3
        + b * 6 * 16 * 4 * 5  # conv1d: outputs x C_in x 5
        + b * 96 * 5  # linear
    )
    assert float_result.macs == macs
    x_nc = torch.randn(2, 3, 8, 8).transpose(2, 3)
    for tracer in ("dispatch", "auto"):
        result = quiet(count_flops, quantized, x_nc, tracer=tracer)
        assert result.unsupported_ops() == {}
        assert result.macs == macs
        ops = result.by_operator("macs")
        assert ops["quantized::conv2d_relu"] == b * 4 * 6 * 6 * 3 * 9
        # + quantize the (2, 3, 8, 8) input (4 per element), the fused ReLU (1 per (2, 4, 6, 6) output),
        # dequantize the (2, 5) output (2 per element)
        assert result.flops == 2 * macs + 4 * b * 3 * 8 * 8 + b * 4 * 6 * 6 + 2 * b * 5
    summary = summarize_parameters(quantized)
    weights = 4 * 3 * 9 + 4 * 2 * 9 + 6 * 4 * 5 + 5 * 96
    biases = 4 + 4 + 6 + 5
    assert summary.total == weights + biases
    assert summary.bytes_by_dtype == {"qint8": weights, "float32": 4 * biases}


def test_quantized_handlers_without_packed_weight_and_transposed():
    linear = REG.resolve("quantized::linear_dynamic")
    call = OpCall(
        "quantized::linear_dynamic", {"X": TensorMeta((4, 3, 8)), "W_prepack": None}, (TensorMeta((4, 3, 16)),)
    )
    assert linear(call).macs == 12 * 8 * 16
    transposed = REG.resolve("quantized::conv_transpose2d")
    weight = TensorMeta((4, 3, 3, 3), "qint8")  # (C_in, C_out / groups, kh, kw), groups 2
    call = OpCall(
        "quantized::conv_transpose2d",
        {"qx": TensorMeta((2, 4, 5, 5), "quint8"), "packed_weight": (weight, None)},
        (TensorMeta((2, 6, 7, 7), "quint8"),),
    )
    assert transposed(call).macs == 2 * 4 * 5 * 5 * 3 * 9
