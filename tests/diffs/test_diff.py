"""flopcount.diff and saved reports: deltas derived by hand, modules added / removed / retyped,
JSON -> result -> JSON identity, schema versions. Every expectation is a formula in the test."""

from __future__ import annotations

import json
from fractions import Fraction

import pytest
import torch
from torch import nn

import flopcount
from flopcount import FlopResult, UsageError, load_report
from flopcount.diffs import check_growth, parse_growth

N, IN, OUT = 4, 16, 8  # batch, input width, output width
H1, H2 = 32, 48  # the hidden width before and after


class MLP(nn.Module):
    def __init__(self, hidden: int, act: type = nn.ReLU, proj: bool = False) -> None:
        super().__init__()
        self.fc1 = nn.Linear(IN, hidden)
        self.act = act()
        self.fc2 = nn.Linear(hidden, OUT)
        self.drop = nn.Dropout(0.1)
        if proj:
            self.proj = nn.Linear(OUT, OUT, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.drop(self.fc2(self.act(self.fc1(x))))
        return self.proj(y) if hasattr(self, "proj") else y


def count(model: nn.Module, tracer: str = "auto", train: bool = False) -> FlopResult:
    model.train(train)
    return flopcount.count_flops(model, torch.randn(N, IN), tracer=tracer)


@pytest.mark.parametrize("tracer", ["auto", "dispatch", "jit"])
def test_a_linear_width_change_costs_what_the_formula_says(tracer):
    torch.manual_seed(0)
    d = flopcount.diff(count(MLP(H1), tracer), count(MLP(H2), tracer))
    dh = H2 - H1
    # fc1: N x IN x H MACs, (IN + 1) x H params; fc2: N x H x OUT MACs, H x OUT + OUT params
    macs = N * IN * dh + N * dh * OUT
    params = (IN + 1) * dh + dh * OUT
    # FLOPs: 2 per MAC, plus one per ReLU output (N x H); bias adds are fused into the linear
    flops = 2 * macs + N * dh
    # bytes (docs/conventions.md): every input read + every output written, 4 bytes each:
    # fc1 reads W (IN x H) and b (H), writes N x H; ReLU reads and writes N x H; fc2 reads N x H
    # and W (H x OUT)
    nbytes = 4 * (IN * dh + dh + N * dh) + 4 * 2 * N * dh + 4 * (N * dh + dh * OUT)
    assert d.totals.delta("macs") == macs
    assert d.totals.delta("params") == params
    assert d.totals.delta("flops") == flops
    assert d.totals.delta("bytes") == nbytes
    rows = {row.name: row for row in d.modules}
    assert rows["fc1"].status == "changed" and rows["fc1"].delta("macs") == N * IN * dh
    assert rows["fc2"].delta("params") == dh * OUT
    assert rows["act"].delta("flops") == N * dh
    assert rows["drop"].status == "unchanged"
    # relative: (B - A) / A of the whole model's MACs
    a_macs = N * IN * H1 + N * H1 * OUT
    assert d.totals.relative("macs") == pytest.approx(macs / a_macs)
    ops = {row.name: row for row in d.operators}
    assert ops["aten::linear"].delta("macs") == macs and ops["aten::linear"].delta("count") == 0


@pytest.mark.parametrize("train", [False, True])
def test_train_and_eval_diff_alike_and_batch_scales_the_delta(train):
    torch.manual_seed(0)
    d = flopcount.diff(count(MLP(H1), train=train), count(MLP(H2), train=train))
    assert d.totals.delta("macs") == N * (H2 - H1) * (IN + OUT)


def test_added_removed_and_retyped_modules():
    torch.manual_seed(0)
    d = flopcount.diff(count(MLP(H1)), count(MLP(H1, act=nn.GELU, proj=True)))
    status = {(row.name, row.type_name): row.status for row in d.modules}
    assert status[("act", "ReLU")] == "removed"  # same path, another type: one removed, one added
    assert status[("act", "GELU")] == "added"
    assert status[("proj", "Linear")] == "added"
    assert status[("fc1", "Linear")] == "unchanged"
    proj = next(row for row in d.modules if row.name == "proj")
    assert proj.delta("macs") == N * OUT * OUT and proj.delta("params") == OUT * OUT
    assert proj.relative("macs") is None and proj.a is None  # a cost from nothing
    relu = next(row for row in d.modules if row.type_name == "ReLU")
    assert relu.delta("flops") == -N * H1 and relu.b is None
    # the removed ReLU stays beside its old neighbours
    order = [row.name for row in d.modules]
    assert order.index("act") == order.index("fc1") + 1
    assert d.counts() == {"added": 2, "removed": 1, "changed": 1, "unchanged": 3}  # changed: the model
    ops = {row.name: row.status for row in d.operators}
    assert ops["aten::relu"] == "removed" and ops["aten::gelu"] == "added"


class Nested(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.block = nn.Sequential(nn.Linear(IN, hidden))
        self.head = nn.Sequential(nn.Linear(hidden, OUT), nn.Linear(OUT, OUT))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.block(x))


def test_top_changes_name_the_module_not_the_containers_that_pass_it_through():
    d = flopcount.diff(count(Nested(H1)), count(Nested(H2)))
    top = [row.name for row in d.top_changes()]
    # block's change is exactly block.0's: only block.0 is listed; head's is head.0's
    assert top == ["block.0", "head.0"]
    assert [row.name for row in d.grew_most("params")] == ["block.0", "head.0"]
    assert d.grew_most("params")[0].delta("params") == (IN + 1) * (H2 - H1)


def test_json_round_trip_is_identical():
    torch.manual_seed(0)
    result = count(MLP(H1, proj=True))
    data = result.to_dict()
    text = json.dumps(data, indent=2)
    back = FlopResult.from_dict(json.loads(text))
    assert json.dumps(back.to_dict(), indent=2) == text
    assert back.flops == result.flops and back.by_module("macs") == result.by_module("macs")
    assert back.operator_totals() == result.operator_totals()


def test_cli_report_round_trip_keeps_its_sections_and_order(tmp_path):
    from flopcount.cli import main

    (tmp_path / "m.py").write_text(
        "from torch import nn\ndef build():\n    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))\n"
    )
    out = tmp_path / "base.json"
    assert main([
        "count", f"{tmp_path / 'm.py'}:build", "--input", "4x16", "--memory", "--format", "json", "--output", str(out), "-q",
    ]) == 0
    text = out.read_text()
    back = load_report(out)
    assert json.dumps(back.to_dict(), indent=2) + "\n" == text
    assert back.sections["entry"].endswith("m.py:build") and "peak_bytes" in back.sections["memory"]


def _saved(result: FlopResult, **changes):
    data = result.to_dict()
    data.update(changes)
    return data


def test_schema_versions_newer_missing_and_older_are_refused_clearly(tmp_path):
    data = count(MLP(H1)).to_dict()
    with pytest.raises(UsageError, match=r"schema_version 2 is newer than this flopcount reads \(1\)"):
        FlopResult.from_dict({**data, "schema_version": 2})
    with pytest.raises(UsageError, match="schema_version: missing"):
        FlopResult.from_dict({k: v for k, v in data.items() if k != "schema_version"})
    with pytest.raises(UsageError, match="schema_version 0 is not one flopcount wrote"):
        FlopResult.from_dict({**data, "schema_version": 0})
    with pytest.raises(UsageError, match=r"by_module\['fc1'\]\.macs: expected an integer"):
        FlopResult.from_dict({**data, "by_module": {**data["by_module"], "fc1": {**data["by_module"]["fc1"], "macs": "many"}}})
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(UsageError, match=r"report .*bad.json: not JSON"):
        load_report(bad)
    with pytest.raises(UsageError, match="no such file"):
        load_report(tmp_path / "missing.json")


def test_diff_reads_paths_and_dicts_and_labels_them(tmp_path):
    a, b = count(MLP(H1)), count(MLP(H2))
    path = tmp_path / "a.json"
    path.write_text(a.to_json())
    d = flopcount.diff(str(path), b.to_dict())
    assert d.a_label == str(path) and d.b_label == "B"
    assert d.totals.delta("macs") == N * (H2 - H1) * (IN + OUT)


def test_peak_memory_and_latency_only_when_both_sides_have_them():
    a, b = count(MLP(H1)), count(MLP(H2))
    mem_a, mem_b = {"peak_bytes": 1000}, {"peak_bytes": 1500}
    d = flopcount.diff(a.with_sections(memory=mem_a), b)
    assert "peak_memory" not in d.metrics
    d = flopcount.diff(a.with_sections(memory=mem_a, benchmark={"median_ms": 2.0}),
                       b.with_sections(memory=mem_b, benchmark={"median_ms": 3.0}))
    assert d.metrics == ("params", "macs", "flops", "bytes", "peak_memory", "latency")
    assert d.totals.delta("peak_memory") == 500 and d.totals.relative("peak_memory") == 0.5
    assert d.totals.delta("latency") == pytest.approx(1e-3)  # seconds in data


def test_growth_allowances_are_inclusive_and_exact():
    base = dict(count(MLP(H1)).to_dict(), flops=1000)
    allow = parse_growth("flops=2%")
    # 1000 x 1.02 = 1020 is allowed (<=), 1021 is not
    assert check_growth(flopcount.diff(base, dict(base, flops=1020)), allow).status == "PASS"
    report = check_growth(flopcount.diff(base, dict(base, flops=1021)), allow)
    assert report.status == "FAIL" and report.exceeded[0].metric == "flops"
    assert report.lines[0].limit == Fraction(1020)
    # 0.5 % of 1000 = 5: an exact fraction, not a float
    assert check_growth(flopcount.diff(base, dict(base, flops=1005)), parse_growth("flops=0.5%")).status == "PASS"
    assert check_growth(flopcount.diff(base, dict(base, params=base["params"] + 1)), parse_growth("params=0")).status == "FAIL"
    assert check_growth(flopcount.diff(base, dict(base, params=base["params"] + 1)), parse_growth("params=1")).status == "PASS"
    assert check_growth(flopcount.diff(base, dict(base, params=base["params"] - 9)), parse_growth("params=0")).status == "PASS"


def _incomplete(data):
    return dict(data, unsupported_ops={"aten::mystery": {"count": 2, "modules": ["fc1"]}},
                complete=False, incomplete_reasons=["aten::mystery ran 2x without a handler"])


def _gap(data):
    """A count a placeholder may have moved either way: an estimate, not a lower bound."""
    return dict(data, complete=False, incomplete_reasons=["a placeholder decided a value on meta tensors"])


def test_growth_on_an_incomplete_side_is_incomplete_but_a_params_failure_is_certain():
    base = count(MLP(H1)).to_dict()
    current = count(MLP(H2)).to_dict()
    allow = parse_growth("flops=0")
    assert check_growth(flopcount.diff(_incomplete(base), current), allow).status == "INCOMPLETE"
    assert check_growth(flopcount.diff(base, _gap(current)), allow).status == "INCOMPLETE"
    assert check_growth(flopcount.diff(base, _gap(current)), allow, allow_incomplete=True).status == "FAIL"
    # short only by ops without a handler against a complete baseline: a lower bound, and over the
    # allowance already (branch gatewalk: tests/cli/test_gatewalk.py has the CLI's case)
    assert check_growth(flopcount.diff(base, _incomplete(current)), allow).status == "FAIL"
    assert check_growth(flopcount.diff(base, _incomplete(base)), allow).status == "INCOMPLETE"
    both = parse_growth("flops=0,params=0")
    assert check_growth(flopcount.diff(base, _incomplete(current)), both).status == "FAIL"  # params never depend on the count
    assert flopcount.FlopResult.from_dict(_incomplete(base)).incomplete_reasons() == ("aten::mystery ran 2x without a handler",)


def test_bad_allowances_name_what_is_wrong():
    with pytest.raises(UsageError, match="unknown metric 'latency'"):
        parse_growth("latency=5%")
    with pytest.raises(UsageError, match="'flops' is not METRIC=ALLOWANCE"):
        parse_growth("flops")
    with pytest.raises(UsageError, match="cannot be negative"):
        parse_growth("flops=-1%")
    with pytest.raises(UsageError, match="flops is given twice"):
        parse_growth("flops=1%,flops=2%")


def test_renderings_agree_with_the_rows():
    d = flopcount.diff(count(MLP(H1)), count(MLP(H1, act=nn.GELU, proj=True)))
    md = d.to_markdown(top=3)
    lines = md.splitlines()
    assert lines[0].startswith("### flopcount diff: ") and lines[2].startswith("**FLOPs ")
    assert "#### Top 3 module changes" in md and md.count("<details>") == 2 and md.count("</details>") == 2
    top_table = md.split("#### Top 3 module changes")[1].split("<details>")[0]
    assert top_table.count("\n| ") == 1 + 3  # the header, then three rows
    import csv
    import io

    rows = list(csv.DictReader(io.StringIO(d.to_csv())))
    total = rows[0]
    assert total["kind"] == "total" and int(total["macs_delta"]) == N * OUT * OUT  # only proj adds MACs
    proj = next(r for r in rows if r["name"] == "proj")
    assert proj["status"] == "added" and proj["macs_a"] == "" and int(proj["macs_b"]) == N * OUT * OUT
    data = json.loads(d.to_json())
    assert data["totals"]["macs"]["delta"] == N * OUT * OUT and data["summary"] == d.counts()
    assert "proj" in d.table() and "added" in d.table()


class Stack(nn.Module):
    """Three identical blocks, each Linear(IN, hidden) -> Linear(hidden, IN)."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(IN, hidden), nn.Linear(hidden, IN)) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def test_repeated_layers_are_one_row_summed():
    d = flopcount.diff(count(Stack(H1)), count(Stack(H2)))
    top = d.top_changes()
    # blocks.i only passes its two Linears' change through; blocks sums the three blocks
    assert [(row.name, row.repeats) for row in top] == [("blocks.*.0", 3), ("blocks.*.1", 3)]
    dh = H2 - H1
    assert top[0].delta("macs") == 3 * N * IN * dh and top[0].delta("params") == 3 * (IN + 1) * dh
    assert top[1].delta("params") == 3 * dh * IN  # the second Linear's bias (IN) does not change
    assert "blocks.\\*.0 (x3)" in d.to_markdown()  # the * escaped: GitHub would pair two into emphasis
    assert [row.name for row in d.grew_most("params", 1)] == ["blocks.*.0"]
