"""Dynamic quantized recurrent layers (issue #20, item 9): ``quantize_dynamic`` turns
``nn.LSTM``/``nn.GRU`` into ``aten::quantized_lstm``/``quantized_gru`` with packed int8
(or fp16) cells, and the cells into ``quantized::*_cell_dynamic``. Counted as the float
layers: MACs and FLOPs by the hand formula (the float LSTM's, which the float count
meets), parameters as the float layer's, weight bytes at the stored dtype. The jit
tracer refuses torch.ao quantized models (dynamic and FX static) with one sentence
naming the dispatch tracer."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch import nn

from flopcount import TraceError, count_flops
from flopcount.core.params import summarize_parameters
from flopcount.handlers.rnn import GATE_FLOPS

Q = pytest.importorskip("torch.ao.quantization")


def quiet(fn, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args, **kwargs)


class Tagger(nn.Module):
    def __init__(self, cls: type, layers: int, bidirectional: bool) -> None:
        super().__init__()
        self.rnn = cls(8, 16, num_layers=layers, batch_first=True, bidirectional=bidirectional)
        self.head = nn.Linear(16 * (2 if bidirectional else 1), 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.rnn(x)[0])


def layer_macs(gates: int, in_features: int, hidden: int, positions: int) -> int:
    """One layer and direction: every position multiplies x by w_ih and h by w_hh."""
    return positions * gates * hidden * (in_features + hidden)


@pytest.mark.parametrize("dtype, weight_bytes", [(torch.qint8, 1), (torch.float16, 2)], ids=["int8", "fp16"])
@pytest.mark.parametrize(
    "cls, gates, layers, bidirectional",
    [(nn.LSTM, 4, 2, False), (nn.LSTM, 4, 1, True), (nn.GRU, 3, 2, True)],
    ids=["lstm2", "lstm_bi", "gru2_bi"],
)
@pytest.mark.parametrize("tracer", ["auto", "dispatch"])
def test_dynamic_quantized_rnn_counts_as_the_float_layer(tracer, cls, gates, layers, bidirectional, dtype, weight_bytes):
    torch.manual_seed(0)
    model = Tagger(cls, layers, bidirectional).eval()
    quantized = quiet(Q.quantize_dynamic, copy.deepcopy(model), {cls, nn.Linear}, dtype=dtype)
    B, T, H, dirs = 3, 5, 16, 2 if bidirectional else 1
    x = torch.randn(B, T, 8)
    P = B * T
    kind = "lstm" if cls is nn.LSTM else "gru"
    rnn_macs = sum(layer_macs(gates, 8 if k == 0 else H * dirs, H, P) for k in range(layers)) * dirs
    rnn_flops = 2 * rnn_macs + layers * dirs * P * H * GATE_FLOPS[kind]
    head_macs = P * H * dirs * 4
    result = quiet(count_flops, quantized, x, tracer=tracer)
    assert result.unsupported_ops() == {} and result.complete
    macs = {op: n for op, n in result.by_operator("macs").items() if n}
    head = "quantized::linear_dynamic" + ("_fp16" if dtype == torch.float16 else "")
    assert macs == {f"aten::quantized_{kind}": rnn_macs, head: head_macs}
    assert result.by_operator()[f"aten::quantized_{kind}"] == rnn_flops
    assert count_flops(model, x, tracer=tracer).by_operator()[f"aten::{kind}"] == rnn_flops  # the float layer, same formula
    # parameters: the float layer's, the weights stored as int8 (fp16), biases float32
    weights = sum(gates * H * ((8 if k == 0 else H * dirs) + H) for k in range(layers)) * dirs
    biases = layers * dirs * 2 * gates * H
    summary = summarize_parameters(quantized)
    assert summary.total == weights + biases + H * dirs * 4 + 4 == summarize_parameters(model).total
    head_weight_bytes = H * dirs * 4 * weight_bytes
    assert summary.param_bytes == weights * weight_bytes + biases * 4 + head_weight_bytes + 4 * 4


class Cells(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm, self.gru, self.rnn = nn.LSTMCell(8, 16), nn.GRUCell(8, 16), nn.RNNCell(8, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, _ = self.lstm(x)
        return h + self.gru(x) + self.rnn(x)


@pytest.mark.parametrize("tracer", ["auto", "dispatch"])
def test_dynamic_quantized_cells_count_as_the_float_cells(tracer):
    torch.manual_seed(0)
    model = Cells().eval()
    quantized = quiet(Q.quantize_dynamic, copy.deepcopy(model), {nn.LSTMCell, nn.GRUCell, nn.RNNCell}, dtype=torch.qint8)
    B, H = 6, 16
    x = torch.randn(B, 8)
    result = quiet(count_flops, quantized, x, tracer=tracer)
    assert result.unsupported_ops() == {}
    projections = B * H * (8 + H) * (4 + 3 + 1)  # w_ih and w_hh of each cell, gates 4 / 3 / 1
    assert {op: n for op, n in result.by_operator("macs").items() if n} == {"quantized::linear_dynamic": projections}
    gates = B * H * (GATE_FLOPS["lstm"] + GATE_FLOPS["gru"] + GATE_FLOPS["rnn_tanh"])
    sums = 2 * B * H  # h + gru + rnn
    assert result.flops == 2 * projections + gates + sums
    assert result.flops == count_flops(model, x, tracer=tracer).flops  # the float cells, same split


def _fx_static(model: nn.Module, x: torch.Tensor) -> nn.Module:
    from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx

    prepared = quiet(prepare_fx, copy.deepcopy(model), Q.get_default_qconfig_mapping("fbgemm"), example_inputs=(x,))
    prepared(x)
    return quiet(convert_fx, prepared)


class ConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv, self.fc = nn.Conv2d(3, 4, 3), nn.Linear(4 * 6 * 6, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.conv(x)).flatten(1))


def test_jit_refuses_torch_ao_models_naming_the_dispatch_tracer():
    torch.manual_seed(0)
    x = torch.randn(3, 5, 8)
    lstm = quiet(Q.quantize_dynamic, Tagger(nn.LSTM, 2, False).eval(), {nn.LSTM}, dtype=torch.qint8)
    with pytest.raises(TraceError, match=r"quantized packed parameters \(in module 'rnn.*tracer='dispatch'"):
        count_flops(lstm, x, tracer="jit")
    images = torch.randn(2, 3, 8, 8)
    static = _fx_static(ConvNet().eval(), images)
    with pytest.raises(TraceError, match=r"quantized packed parameters \(in module 'conv'\).*tracer='dispatch'"):
        count_flops(static, images, tracer="jit")
    macs = 2 * 4 * 6 * 6 * 3 * 9 + 2 * 144 * 5
    assert quiet(count_flops, static, images, tracer="dispatch").macs == macs
