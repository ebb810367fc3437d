"""What a profile says about ops it cannot roof (issue #28 item 8): ops with no FLOPs are
grouped as data movement (table, JSON) and drawn in a panel of their own; rows whose time a
model shared out of a fused kernel say so (``time_source="apportioned"``) and carry no
efficiency; a compute-bound row faster than its compute roof is flagged "roof below achieved"
(table, JSON, trace, plot); a view's trace efficiency is null; roof lines are grey and
points coloured. Oracles: hand-derived bytes, the row's own measured time against roofs
chosen far below or above anything this machine does, and the drawn figure's artists."""

from __future__ import annotations

import colorsys
import json

import pytest
import torch
from torch import nn

import flopcount
from flopcount.core.ledger import Ledger
from flopcount.devices.roofline import Roofs
from flopcount.types import Cost, OpCall, OpEvent

to_rgb = pytest.importorskip("matplotlib.colors").to_rgb

#: 1 MFLOP/s: any real matmul beats it, so a compute-bound row's efficiency is far above 1
LOW_COMPUTE = Roofs({"float32": 1e6}, 1e15, "roofs far below this machine", "given")
#: 1 PFLOP/s and 1 PB/s: nothing reaches them
HIGH = Roofs({"float32": 1e15, "bfloat16": 2e15}, 1e15, "roofs far above this machine", "given")


class Lookup(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(5000, 32)
        self.head = nn.Linear(32, 8)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.emb(ids).transpose(0, 1).contiguous())


@pytest.mark.parametrize("train, backward", [(False, False), (True, True)])
def test_ops_with_no_flops_form_the_data_movement_group(train, backward, tmp_path):
    batch, t = 4, 6
    ids = torch.randint(0, 5000, (batch, t))
    result = flopcount.profile(Lookup().train(train), ids, roofs=HIGH, warmup=1, steps=1, backward=backward)
    movement = result.data_movement()
    # the lookup reads batch*t int64 ids and batch*t rows of 32 fp32 and writes the rows
    n = batch * t
    assert movement["aten::embedding"].bytes == n * 8 + 2 * n * 32 * 4
    assert movement["aten::embedding"].flops == 0
    assert all(row.flops == 0 and row.bytes > 0 for row in movement.values())
    data = result.to_dict()
    assert "aten::embedding" in [r["name"] for r in data["data_movement"]]
    assert all(r["category"] == "data movement" for r in data["data_movement"])
    table = result.table()
    section = table[table.index("data movement (no FLOPs)"):]
    assert "aten::embedding" in section
    from flopcount.report.profile import profile_html

    page = profile_html(result)
    assert "aten::embedding" in page[page.index("data movement (no FLOPs)"):]
    # the plot: a second panel places each such op at (bytes moved, bytes / time)
    from flopcount.report.roofline_plot import draw_roofline

    figure = draw_roofline(result)
    assert len(figure.axes) == 2
    row = result.by_operator()["aten::embedding"]
    offsets = [tuple(p) for c in figure.axes[1].collections for p in c.get_offsets()]
    assert (pytest.approx(row.bytes), pytest.approx(row.bytes / row.time_s)) in offsets
    result.plot_roofline(str(tmp_path / "roofline.png"))
    assert (tmp_path / "roofline.png").stat().st_size > 0


def test_fused_fast_path_rows_are_apportioned_with_no_efficiency():
    layer = nn.TransformerEncoderLayer(32, 4, dim_feedforward=64, batch_first=True).eval()
    x = torch.randn(3, 5, 32)
    result = flopcount.profile(layer, x, roofs=HIGH, warmup=1, steps=1)
    # the real run takes aten::_transformer_encoder_layer_fwd, one kernel for every counted op:
    # each op's time is a model's share of it
    costed = [r for r in result.rows if r.flops > 0]
    assert costed and all(r.time_source == "apportioned" for r in costed)
    assert all(r.efficiency is None for r in costed)
    linear = result.by_operator()["aten::linear"]
    assert linear.time_source == "apportioned" and linear.efficiency is None
    rows = {(r["name"], r["module"]): r for r in result.to_dict()["rows"]}
    assert rows[("aten::linear", "linear1")]["time_source"] == "apportioned"
    assert rows[("aten::linear", "linear1")]["efficiency"] is None
    assert "~ time apportioned" in result.table()


def test_a_split_composite_is_apportioned_and_a_plain_op_is_measured():
    # nn.MultiheadAttention in train mode (weights returned: bmm, softmax, bmm): one counted
    # event costed as the ops it performs (Cost.split): its time is shared among them by FLOPs
    mha = nn.MultiheadAttention(32, 4, batch_first=True).train()
    x = torch.randn(2, 5, 32)
    result = flopcount.profile(mha, (x, x, x), roofs=HIGH, warmup=1, steps=1)
    split = {r.name: r for r in result.rows if r.module == "" and r.flops > 0}
    assert {"aten::linear", "aten::bmm", "aten::softmax"} <= set(split)
    assert all(r.time_source == "apportioned" and r.efficiency is None for r in split.values())
    plain = flopcount.profile(nn.Linear(64, 32), torch.randn(8, 64), roofs=HIGH, warmup=1, steps=1).rows[0]
    assert plain.time_source == "measured"
    assert plain.efficiency == pytest.approx(plain.attainable_s / plain.time_s)


@pytest.mark.parametrize("batch", [16, 64])
def test_compute_bound_row_above_its_roof_is_flagged_everywhere(batch, tmp_path):
    model, x = nn.Linear(256, 128), torch.randn(batch, 256)
    result = flopcount.profile(model, x, roofs=LOW_COMPUTE, warmup=1, steps=1)
    row = result.rows[0]
    flops = 2 * batch * 256 * 128
    assert row.flops == flops and row.bound == "compute"
    # at 1 MFLOP/s this matmul would take flops / 1e6 s: any real run is faster
    assert row.efficiency == pytest.approx(flops / 1e6 / row.time_s)
    assert row.efficiency > 1.05
    assert row.flag == "roof below achieved"
    assert result.to_dict()["rows"][0]["flag"] == "roof below achieved"
    table = result.table()
    assert f"{row.efficiency:.2f}!" in table and "! roof below achieved: aten::linear" in table
    assert "roof below achieved" in result.to_csv()
    path = tmp_path / "trace.json"
    result.export_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    linear = [e for e in events if e.get("args", {}).get("flopcount op") == "aten::linear"]
    assert linear and all(e["args"]["flag"] == "roof below achieved" for e in linear)
    from flopcount.report.roofline_plot import FLAG_EDGE, draw_roofline

    ax = draw_roofline(result).axes[0]
    flagged = [c for c in ax.collections if str(c.get_label()).startswith("roof below achieved")]
    assert len(flagged) == 1
    assert tuple(flagged[0].get_edgecolors()[0][:3]) == pytest.approx(to_rgb(FLAG_EDGE))
    assert "roof below achieved" in " ".join(t.get_text() for t in ax.texts)


def test_rows_within_their_roofs_and_memory_bound_rows_are_not_flagged():
    model, x = nn.Linear(256, 128), torch.randn(32, 256)
    assert flopcount.profile(model, x, roofs=HIGH, warmup=1, steps=1).rows[0].flag is None
    # a bandwidth roof of 1 B/s makes the row memory-bound and "faster than the roof": that
    # is the memory roof (caches), not the compute roof the flag is about
    slow_memory = Roofs({"float32": 1e15}, 1.0, "1 B/s", "given")
    row = flopcount.profile(model, x, roofs=slow_memory, warmup=1, steps=1).rows[0]
    assert row.bound == "memory" and row.efficiency > 1.05 and row.flag is None


class Views(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x.view(-1, 4) * 2).t()


def test_views_have_null_efficiency_in_the_trace(tmp_path):
    result = flopcount.profile(Views(), torch.randn(6, 8), roofs=HIGH, warmup=1, steps=1)
    path = tmp_path / "trace.json"
    result.export_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    views = [e for e in events if e.get("args", {}).get("flopcount op") in ("aten::view", "aten::t")]
    assert views
    for event in views:
        assert event["args"]["bytes"] == 0
        assert "efficiency" in event["args"] and event["args"]["efficiency"] is None
        assert event["args"]["intensity"] is None
    mul = [e for e in events if e.get("args", {}).get("flopcount op") == "aten::mul"]
    assert mul and mul[0]["args"]["efficiency"] > 0


def _saturation(colour) -> float:
    r, g, b = to_rgb(colour)
    return colorsys.rgb_to_hls(r, g, b)[2]


def test_roof_lines_are_grey_and_points_are_coloured():
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 8, 3, padding=1)
            self.fc = nn.Linear(8 * 16 * 16, 10)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(torch.relu(self.conv(x)).flatten(1))

    roofs = Roofs({"float32": 2e9, "bfloat16": 4e9}, 2e9, "two dtypes", "given")
    result = flopcount.profile(Net(), torch.randn(2, 3, 16, 16), roofs=roofs, warmup=1, steps=1)
    from flopcount.report.roofline_plot import draw_roofline

    ax = draw_roofline(result).axes[0]
    lines = [line.get_color() for line in ax.get_lines()]
    assert len(lines) == 3  # two dtype roofs and the bandwidth line
    assert all(_saturation(c) == 0 for c in lines)  # greys: r = g = b
    points = [tuple(rgba[:3]) for c in ax.collections for rgba in c.get_facecolors()]
    assert points and all(_saturation(p) > 0.3 for p in points)
    line_rgb = {tuple(round(v, 3) for v in to_rgb(c)) for c in lines}
    assert not line_rgb & {tuple(round(v, 3) for v in p) for p in points}
    bounds = {r.bound for r in result.by_operator().values() if r.flops > 0}
    assert len({tuple(round(v, 3) for v in p) for p in points}) >= len(bounds)


def test_a_sum_of_measured_and_apportioned_rows_is_mixed_with_no_efficiency():
    # two hand-made calls of one op, booked by the ledger as profile books them: 1 ms measured
    # at attainable 0.5 ms (module a), 1 ms apportioned from a fused kernel (module b)
    columns = ("time_s", "host_time_s", "compute_s", "memory_s", "attainable_s")
    seconds = (1e-3, 1e-3, 5e-4, 1e-4, 5e-4)
    cost = Cost(macs=5, flops=10, bytes_read=4)
    events = [(OpEvent(OpCall("aten::linear", {}), (name,)), cost) for name in ("a", "b")]
    ledger = Ledger(columns=columns, labels=("time_source",)).book_all(
        events, [seconds, seconds], [("measured",), ("apportioned",)]
    )
    rows = ledger.cost_rows("rows")
    measured, shared = rows[("aten::linear", "a", "forward")], rows[("aten::linear", "b", "forward")]
    assert measured.efficiency == pytest.approx(0.5)
    assert shared.efficiency is None and shared.flag is None
    both = ledger.cost_rows("operators")["aten::linear"]
    assert both.time_source == "mixed" and both.efficiency is None
    assert both.time_s == pytest.approx(2e-3) and both.calls == 2 and both.flops == 20
    once = Ledger(columns=columns, labels=("time_source",)).book_all(events[:1] * 2, [seconds] * 2, [("measured",)] * 2)
    assert once.cost_rows("operators")["aten::linear"].efficiency == pytest.approx(0.5)
