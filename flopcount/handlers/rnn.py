"""Recurrent layers: jit's aten::lstm/gru/rnn_tanh/rnn_relu, the *_cell ops, the CPU
kernel aten::mkldnn_rnn_layer that the dispatch tracer sees for nn.LSTM, and their
dynamic quantized forms (aten::quantized_lstm/gru, quantized::*_cell_dynamic), counted
as the float layers: a MAC per weight use whatever the weight's type.

Per layer and direction over S = steps x batch positions: MACs = S x (w_ih.numel +
w_hh.numel [+ w_hr.numel]) (input and hidden projections for all gates; bias adds not
counted). Gate arithmetic per position and hidden unit, counted as the cell's
decomposition runs it (gate adds, sigmoid, tanh, state updates):
LSTM 4 adds + 3 sigmoid + 2 tanh + 4 mul/add = 22; GRU 7 + 2 sigmoid + 1 tanh = 16;
RNN add + tanh/relu = 2. Dropout between layers (training) costs what dropout costs.
"""

from __future__ import annotations

from typing import Sequence, Tuple

from flopcount.core.registry import HandlerRegistry
from flopcount.handlers.pointwise import DROPOUT, elementwise_flops
from flopcount.types import Cost, Handler, OpCall, TensorMeta

__all__ = ["register", "GATE_FLOPS"]

_ADD, _SIG, _TANH, _RELU = (elementwise_flops(f"aten::{op}", 1) for op in ("add", "sigmoid", "tanh", "relu"))
GATE_FLOPS = {
    # gates = x@W + h@U (4 adds), i,f,o = sigmoid, g = tanh, c = f*c + i*g (3), h = o*tanh(c) (1+tanh)
    "lstm": 4 * _ADD + 3 * _SIG + 2 * _TANH + 4,
    # r,z = sigmoid(gi + gh) (2 adds), n = tanh(gi_n + r*gh_n) (mul, add), h = n + z*(h - n) (sub, mul, add)
    "gru": 7 + 2 * _SIG + _TANH,
    "rnn_tanh": _ADD + _TANH,
    "rnn_relu": _ADD + _RELU,
}
_MKLDNN_MODES = {0: "rnn_relu", 1: "rnn_tanh", 2: "lstm", 3: "gru"}


def _layer_cost(kind: str, positions: int, weights: Sequence[TensorMeta], hidden: int) -> Cost:
    macs = positions * sum(w.numel for w in weights)
    return Cost(macs=macs, flops=2 * macs + positions * hidden * GATE_FLOPS[kind])


def _positions(x: TensorMeta, packed: bool) -> int:
    """steps x batch: every row of the input but its feature dim (packed data: its rows)."""
    return x.shape[0] if packed else x.numel // x.shape[-1]


def _rnn_cost(kind: str, call: OpCall, params: Sequence[TensorMeta]) -> Cost:
    packed = "data" in call.args
    x = call.tensor("data") if packed else call.tensor("input")
    layers = int(call.arg("num_layers") or 1)
    dirs = 2 if call.arg("bidirectional") else 1
    per_layer = len(params) // (layers * dirs)
    if not per_layer:
        raise ValueError(f"{call.op}: the layers' weights are not known")
    positions = _positions(x, packed)
    cost = Cost()
    hidden = 0
    for k in range(layers * dirs):
        group = params[k * per_layer:(k + 1) * per_layer]
        weights = [w for w in group if w.ndim == 2]  # w_ih, w_hh, optional w_hr; biases are 1-D
        hidden = weights[1].shape[0] // (4 if kind == "lstm" else 3 if kind == "gru" else 1)
        cost += _layer_cost(kind, positions, weights, hidden)
    dropout = call.arg("dropout") or 0
    if dropout and call.arg("train") and layers > 1:
        cost += Cost.from_flops(DROPOUT * (layers - 1) * positions * hidden * dirs)
    return cost


def _rnn(call: OpCall) -> Cost:
    params = [p for p in call.arg("params") or () if isinstance(p, TensorMeta)]
    return _rnn_cost(call.op.split("::")[1], call, params)


def _quantized_rnn(call: OpCall) -> Cost:
    """``aten::quantized_lstm``/``quantized_gru`` (dynamic int8 or fp16 ``nn.LSTM``/``nn.GRU``):
    the float layer's cost, one MAC per int8 (or fp16) weight use. ``params`` holds one
    cell per layer and direction, each (w_ih, w_hh, biases...) as the dispatch tracer
    unpacks it; the activations' dynamic quantization inside the kernel is not counted."""
    params = [m for cell in call.arg("params") or () if isinstance(cell, tuple) for m in cell if isinstance(m, TensorMeta)]
    return _rnn_cost(call.op.split("::quantized_")[1], call, params)


# The elementwise ops of one cell step, in the order and spelling aten's RNN.cpp runs
# them (what jit records for ``nn.LSTMCell``...): (op, elements per hidden unit, FLOPs each).
_CELL_OPS = {
    "lstm": (("aten::add_", 4, 1), ("aten::sigmoid_", 1, 4), ("aten::sigmoid_", 1, 4), ("aten::tanh_", 1, 1),
             ("aten::sigmoid_", 1, 4), ("aten::mul", 1, 1), ("aten::mul", 1, 1), ("aten::add_", 1, 1),
             ("aten::tanh", 1, 1), ("aten::mul", 1, 1)),
    "gru": (("aten::add_", 1, 1), ("aten::sigmoid_", 1, 4), ("aten::add_", 1, 1), ("aten::sigmoid_", 1, 4),
            ("aten::mul_", 1, 1), ("aten::add", 1, 1), ("aten::tanh_", 1, 1), ("aten::sub", 1, 1),
            ("aten::mul_", 1, 1), ("aten::add_", 1, 1)),
    "rnn_tanh": (("aten::add_", 1, 1), ("aten::tanh", 1, 1)),
    "rnn_relu": (("aten::add_", 1, 1), ("aten::relu", 1, 1)),
}


def _cell_cost(kind: str, x: TensorMeta, w_ih: TensorMeta, w_hh: TensorMeta, linear: str) -> Cost:
    rows, hidden = _positions(x, False), w_hh.shape[1]
    parts = [
        (linear, Cost.from_macs(rows * w_hh.numel)),
        (linear, Cost.from_macs(rows * w_ih.numel)),
    ]
    parts += [(op, Cost.from_flops(rows * hidden * per_unit * flops)) for op, per_unit, flops in _CELL_OPS[kind]]
    return Cost.split(*parts)


def _cell(call: OpCall) -> Cost:
    """One step of ``nn.LSTMCell``/``GRUCell``/``RNNCell``, split into the ops it runs: the
    input and hidden ``aten::linear`` (biases not counted) and the gate arithmetic
    (:data:`GATE_FLOPS` per hidden unit in total)."""
    kind = call.op.split("::")[1].replace("_cell", "")
    return _cell_cost(kind, call.tensor("input"), call.tensor("w_ih"), call.tensor("w_hh"), "aten::linear")


def _packed_weight(call: OpCall, name: str) -> TensorMeta:
    value = call.arg(name)
    if isinstance(value, tuple) and value and isinstance(value[0], TensorMeta):
        return value[0]
    raise ValueError(f"{call.op}: the packed weight {name} is not known")


def _quantized_cell(call: OpCall) -> Cost:
    """One step of a dynamic quantized ``LSTMCell``/``GRUCell``/``RNNCell``: as the float
    cell, its two projections named ``quantized::linear_dynamic`` (what they run as)."""
    kind = call.op.split("::quantized_")[1].replace("_cell_dynamic", "")
    w_ih, w_hh = _packed_weight(call, "w_ih"), _packed_weight(call, "w_hh")
    return _cell_cost(kind, call.tensor("input"), w_ih, w_hh, "quantized::linear_dynamic")


def _mkldnn_layer(weights: Tuple[str, str], times: int) -> Handler:
    """The layer over its two projections ``weights``, ``times`` over (the backward, an estimate:
    twice the forward, input and weight gradients of both projections and the gate derivatives
    at about the forward's gate cost)."""

    def handler(call: OpCall) -> Cost:
        kind = _MKLDNN_MODES.get(call.arg("mode"), "lstm")
        projections = [call.tensor(name) for name in weights]
        forward = _layer_cost(kind, _positions(call.tensor("input"), False), projections, int(call.arg("hidden_size")))
        return Cost(macs=times * forward.macs, flops=times * forward.flops)

    return handler


def register(registry: HandlerRegistry) -> None:
    registry.register(["aten::lstm", "aten::gru", "aten::rnn_tanh", "aten::rnn_relu"], _rnn)
    registry.register(["aten::lstm_cell", "aten::gru_cell", "aten::rnn_tanh_cell", "aten::rnn_relu_cell"], _cell)
    registry.register(["aten::quantized_lstm", "aten::quantized_gru"], _quantized_rnn)
    registry.register([f"quantized::quantized_{kind}_cell_dynamic" for kind in _CELL_OPS], _quantized_cell)
    registry.register("aten::mkldnn_rnn_layer", _mkldnn_layer(("weight0", "weight1"), 1))
    registry.register("aten::mkldnn_rnn_layer_backward", _mkldnn_layer(("weight1", "weight2"), 2))
