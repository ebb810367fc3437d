"""Every reading books through the one ledger (issue #27 item 1): ``predict`` and ``profile``
give the same operator vocabulary and the same per-module roll-up (owners and aliases) as
``count_flops``, on a CNN, a Linear -> MultiheadAttention model, a small transformer and a
model whose submodule is called under two names.

The oracle is ``count_flops`` (checked against ``torch.utils.flop_counter`` in
tests/conformance and tests/tracers) plus hand counts written out below. ``profile`` runs
for real (``steps=1``) on a datasheet part's roofs, so nothing is measured but the steps.
"""

from __future__ import annotations

import json
from typing import Callable, Dict, Tuple

import pytest
import torch
from torch import nn

import flopcount
from flopcount.core.ledger import Ledger
from flopcount.core.rows import CostRow
from flopcount.devices import named_roofs
from flopcount.types import Cost, OpCall, OpEvent


class LinearAttention(nn.Module):
    """The issue's model: Linear(8, 8) then MultiheadAttention(8, 2, batch_first=True)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(x)
        return self.attn(h, h, h)[0]


class SharedTwice(nn.Module):
    """One Linear(4, 4) registered as ``enc.0`` and ``dec.0`` and run once under each."""

    def __init__(self) -> None:
        super().__init__()
        shared = nn.Linear(4, 4)
        self.enc = nn.Sequential(shared)
        self.dec = nn.Sequential(shared)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dec(torch.relu(self.enc(x)))


class Wrapped(nn.Module):
    """A Linear(4, 4) of its own, then the model's shared Linear(4, 4)."""

    def __init__(self, shared: nn.Module) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.shared = shared

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.shared(self.lin(x))


class SharedDeepAndAtTheTop(nn.Module):
    """One Linear(4, 4) registered as ``blocks.0.shared``, ``blocks.1.shared`` and ``head``: run
    inside each block, then by the root as ``head``."""

    def __init__(self) -> None:
        super().__init__()
        shared = nn.Linear(4, 4)
        self.blocks = nn.ModuleList([Wrapped(shared), Wrapped(shared)])
        self.head = shared

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def _cnn() -> Tuple[nn.Module, torch.Tensor]:
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(8 * 8 * 8, 10)
    )
    return model, torch.randn(2, 3, 16, 16)


def _attention() -> Tuple[nn.Module, torch.Tensor]:
    return LinearAttention(), torch.randn(2, 5, 8)


def _transformer() -> Tuple[nn.Module, torch.Tensor]:
    layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
    return nn.TransformerEncoder(layer, 2, enable_nested_tensor=False), torch.randn(2, 6, 16)


def _shared() -> Tuple[nn.Module, torch.Tensor]:
    return SharedTwice(), torch.randn(2, 3, 4)


def _shared_deep() -> Tuple[nn.Module, torch.Tensor]:
    return SharedDeepAndAtTheTop(), torch.randn(2, 3, 4)


MODELS: Dict[str, Callable[[], Tuple[nn.Module, torch.Tensor]]] = {
    "cnn": _cnn, "attention": _attention, "transformer": _transformer, "shared": _shared, "shared_deep": _shared_deep,
}
T4 = named_roofs("t4")


def _flops(rows: Dict[str, CostRow]) -> Dict[str, int]:
    return {name: int(row.flops) for name, row in rows.items() if row.flops}


def _nonzero(table: Dict[str, int]) -> Dict[str, int]:
    return {name: value for name, value in table.items() if value}


def _model(name: str, train: bool) -> Tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    model, x = MODELS[name]()
    return model.train(train), x


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_predict_books_the_operators_count_flops_books(name, train):
    model, x = _model(name, train)
    counted = _nonzero(flopcount.count_flops(model, (x,)).by_operator())
    predicted = flopcount.predict(model, (x,), device=T4)
    assert _flops(predicted.by_operator()) == counted
    assert not any(op.startswith("flopcount::") for op in predicted.by_operator())
    # the rows and the per-operator table are one booking: they hold the same totals
    assert sum(r.flops for r in predicted.rows) == sum(counted.values())
    assert sum(r.latency_s for r in predicted.by_operator().values()) == pytest.approx(predicted.latency_s)


@pytest.mark.parametrize("tracer", ["auto", "dispatch", "jit"])
def test_the_attention_model_has_one_vocabulary_whatever_the_tracer(tracer):
    # hand count, batch 2 x 5 tokens x d_model 8, 2 heads of 4 (1 MAC = 2 FLOPs):
    # Linear(8, 8): 10 x 8 x 8 = 640 MACs; in_proj (q, k, v) 3 x 640; out_proj 640
    #   -> aten::linear 5 x 640 = 3200 MACs = 6400 FLOPs
    # QK^T and AV: (2 x 2) heads x 5 x 5 x 4 = 400 MACs each -> aten::bmm 800 MACs = 1600 FLOPs
    model, x = _model("attention", False)
    counted = flopcount.count_flops(model, (x,), tracer=tracer).by_operator()
    predicted = _flops(flopcount.predict(model, (x,), device=T4).by_operator())
    assert predicted["aten::linear"] == counted["aten::linear"] == 6400
    assert predicted["aten::bmm"] == counted["aten::bmm"] == 1600
    assert "aten::softmax" in predicted and predicted == _nonzero(counted)


def test_predict_books_the_backward_as_count_flops_does():
    model, x = _model("attention", True)
    counted = _nonzero(flopcount.count_flops(model, (x,), backward=True).by_operator())
    assert _flops(flopcount.predict(model, (x,), device=T4, backward=True).by_operator()) == counted


@pytest.mark.parametrize("name", sorted(MODELS))
def test_predict_rolls_modules_up_as_count_flops_does(name):
    model, x = _model(name, False)
    counted = _nonzero(flopcount.count_flops(model, (x,)).by_module())
    assert _flops(flopcount.predict(model, (x,), device=T4).by_module()) == counted


def test_the_shared_submodule_by_hand():
    # Linear(4, 4) on 2 x 3 rows: 6 x 4 x 4 = 96 MACs = 192 FLOPs per call (bias adds are
    # not counted); it runs once under enc and once under dec:
    # "" 2 calls, enc 1, dec 1, the shared module (canonical name enc.0, alias dec.0) 2;
    # the root also runs the relu between them: 2 x 3 x 4 = 24 elements, 1 FLOP each
    expected = {"": 2 * 192 + 24, "enc": 192, "dec": 192, "enc.0": 2 * 192}
    model, x = _model("shared", False)
    assert _nonzero(flopcount.count_flops(model, (x,)).by_module()) == expected
    assert _flops(flopcount.predict(model, (x,), device=T4).by_module()) == expected
    profiled = flopcount.profile(model, (x,), steps=1, warmup=0, roofs=T4, keep_trace=False)
    assert _flops(profiled.by_module()) == expected


@pytest.mark.parametrize("tracer", ["auto", "dispatch", "jit"])
def test_a_shared_module_the_root_calls_by_its_shortest_name_credits_no_block(tracer):
    # Linear(4, 4) on 2 x 3 rows: 192 FLOPs per call (as above). Five calls: blocks.0.lin,
    # the shared module inside blocks.0 and inside blocks.1, blocks.1.lin, then the root's
    # ``head``. The root's call ran outside both blocks (and outside the ModuleList ``blocks``),
    # so neither is credited with it; before, the root's call was credited by the shared module's
    # canonical name ``blocks.0.shared`` to ``blocks`` and ``blocks.0`` (blocks.0 3 x 192, blocks.1 2 x 192)
    per_call = 192
    expected = {
        "": 5 * per_call,
        "blocks": 4 * per_call,
        "blocks.0": 2 * per_call,
        "blocks.0.lin": per_call,
        "blocks.0.shared": 3 * per_call,  # the shared module's canonical name: every call of it
        "blocks.1": 2 * per_call,
        "blocks.1.lin": per_call,
    }
    model, x = _model("shared_deep", False)
    assert _nonzero(flopcount.count_flops(model, (x,), tracer=tracer).by_module()) == expected


def test_a_shared_module_the_root_calls_is_rolled_up_alike_by_every_reading():
    model, x = _model("shared_deep", False)
    counted = _nonzero(flopcount.count_flops(model, (x,)).by_module())
    assert counted["blocks.0"] == counted["blocks.1"]  # two identical blocks, called alike
    assert _flops(flopcount.predict(model, (x,), on=T4).by_module()) == counted
    profiled = flopcount.profile(model, (x,), steps=1, warmup=0, roofs=T4, keep_trace=False)
    assert _flops(profiled.by_module()) == counted


@pytest.mark.parametrize("backward", [False, True], ids=["forward", "backward"])
@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_profile_books_modules_and_operators_as_count_flops_does(name, train, backward):
    model, x = _model(name, train)
    if backward:
        x.requires_grad_(True)
    counted = flopcount.count_flops(model, (x,), tracer="dispatch", backward=backward)
    profiled = flopcount.profile(model, (x,), steps=1, warmup=0, roofs=T4, keep_trace=False, backward=backward)
    assert _flops(profiled.by_module()) == _nonzero(counted.by_module())
    assert _flops(profiled.by_operator()) == _nonzero(counted.by_operator())
    assert sum(r.measured_s for r in profiled.rows) == pytest.approx(profiled.op_time_s)
    assert profiled.by_module()[""].time_s == pytest.approx(profiled.op_time_s)


def test_a_fused_cost_shares_its_seconds_among_its_parts_by_flops():
    # a composite of 300 FLOPs in two parts (100 + 200) booked with 3 s attainable: the parts'
    # rows get 1 s and 2 s, the module and phase tables the whole 3 s
    cost = Cost.split(("aten::bmm", Cost(macs=50, flops=100)), ("aten::softmax", Cost(flops=200)))
    event = OpEvent(OpCall("flopcount::attention", {}), ("block",))
    ledger = Ledger(columns=("attainable_s",), labels=("dtype",)).book_all([(event, cost)], [(3.0,)], [("float32",)])
    rows = ledger.cost_rows("rows")
    assert rows[("aten::bmm", "block", "forward")].attainable_s == pytest.approx(1.0)
    assert rows[("aten::softmax", "block", "forward")].attainable_s == pytest.approx(2.0)
    assert ledger.cost_rows("modules")["block"].attainable_s == pytest.approx(3.0)
    assert ledger.cost_rows("modules")[""].flops == 300 and ledger.cost_rows("phases")["forward"].calls == 2


def test_the_row_type_keeps_the_old_names():
    row = CostRow("aten::mm", "", "forward", 1, 8, 4, bytes_read=6, bytes_written=2, attainable_s=2.0, time_s=4.0)
    assert isinstance(row, flopcount.profiling.ProfileRow) and isinstance(row, flopcount.profiling.PredictRow)
    assert row.bytes == 8 and row.count == 1 and row.latency_s == 2.0
    assert row.efficiency == pytest.approx(0.5) and row.achieved_flops_per_s == pytest.approx(2.0)
    bound_only = CostRow("aten::mm", "", "forward", 1, 8, 4, attainable_s=2.0)
    assert bound_only.efficiency is None and "time_s" not in bound_only.to_dict()
    assert bound_only.to_dict()["latency_s"] == 2.0


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_the_trace_args_name_the_operations_a_fused_cost_performs(train):
    # the Chrome trace's "flopcount op" uses the rows' vocabulary: the attention's bmm and
    # softmax, not the composite flopcount::multi_head_attention_forward it was counted as
    model, x = _model("attention", train)
    profiled = flopcount.profile(model, (x,), steps=1, warmup=0, roofs=T4)
    named = {op for args in profiled.trace_args.values() for op in str(args["flopcount op"]).split(", ")}
    assert {"aten::bmm", "aten::softmax", "aten::linear"} <= named
    assert not any(op.startswith("flopcount::") for op in named)


def test_the_trace_args_hold_seconds_and_the_trace_shows_microseconds(tmp_path):
    # seconds in the result's data; the Chrome trace (whose unit is the microsecond) gets
    # attainable_us = 1e6 x attainable_s, as before
    model, x = _model("attention", False)
    profiled = flopcount.profile(model, (x,), steps=1, warmup=0, roofs=T4)
    seconds = {ident: args["attainable_s"] for ident, args in profiled.trace_args.items()}
    assert seconds and all("attainable_us" not in args for args in profiled.trace_args.values())
    path = tmp_path / "trace.json"
    profiled.export_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    shown = {e["args"]["External id"]: e["args"] for e in events if e.get("cat") == "cpu_op" and "flops" in e.get("args", {})}
    assert shown and all(args["attainable_us"] == pytest.approx(1e6 * seconds[ident]) for ident, args in shown.items())
    assert all("attainable_s" not in args for args in shown.values())
