"""Aggregation invariants and report formats: totals equal sums, parents include children,
shared modules and tied weights, JSON/CSV/Markdown/tree outputs."""

from __future__ import annotations

import csv
import io
import json

import torch
from torch import nn

from examples.resnet import BasicBlock, resnet18
from flopcount import count_flops


class Shared(nn.Module):
    """One Linear used twice, and an embedding tied to the output head."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(50, 8)
        self.block = nn.Linear(8, 8)
        self.head = nn.Linear(8, 50, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids):
        h = self.emb(ids)
        h = self.block(self.block(h))
        return self.head(h)


def test_parent_equals_self_plus_children():
    """Each module's FLOPs equal its children's plus what runs in its own forward: in
    resnet18 only a BasicBlock does work of its own, the residual add (one FLOP per
    output element, taken here from a forward hook)."""
    model = resnet18().eval()
    x = torch.randn(2, 3, 32, 32)
    own: dict = {}

    def hook(module, args, out):
        if isinstance(module, BasicBlock):
            own[module] = own.get(module, 0) + out.numel()

    handles = [m.register_forward_hook(hook) for m in model.modules()]
    with torch.no_grad():
        model(x)
    for h in handles:
        h.remove()
    r = count_flops(model, x)
    flops = r.by_module()
    self_ops = r.by_module_and_operator()
    for name, module in model.named_modules():
        children = [f"{name}.{c}" if name else c for c, _ in module.named_children()]
        if not children:
            continue
        assert flops[name] == sum(flops[c] for c in children) + own.get(module, 0), name
    # the root equals the sum over operators, and the sum over top-level children plus root-level ops
    assert flops[""] == sum(r.by_operator().values()) == r.flops
    assert sum(self_ops[""].values()) == r.flops
    assert r.by_module("macs")[""] == r.macs


def test_shared_module_and_tied_weights():
    model = Shared()
    r = count_flops(model, torch.randint(0, 50, (2, 5)))
    tokens = 2 * 5
    assert r.by_module("macs")["block"] == 2 * tokens * 8 * 8  # called twice: both calls accumulate
    assert r.by_module("macs")["head"] == tokens * 8 * 50      # tied weight still costs its matmul
    assert r.params == 50 * 8 + 8 * 8 + 8                      # tied weight counted once
    assert [m.calls for m in r.modules if m.name == "block"] == [2]


def test_to_dict_is_json_safe_with_stable_keys():
    r = count_flops(resnet18().eval(), torch.randn(1, 3, 32, 32))
    data = json.loads(json.dumps(r.to_dict()))
    for key in ("flops", "macs", "params", "by_module", "by_operator", "unsupported_ops", "convention", "tracer", "size_bytes"):
        assert key in data
    assert data["flops"] == r.flops and data["macs"] == r.macs and data["params"] == 11_689_512
    assert data["by_module"]["layer1"]["flops"] == r.by_module()["layer1"]
    assert sum(v["flops"] for v in data["by_operator"].values()) == r.flops


def test_csv_rows_match_modules():
    r = count_flops(resnet18().eval(), torch.randn(1, 3, 32, 32))
    rows = list(csv.DictReader(io.StringIO(r.to_csv(max_depth=1))))
    assert rows[0]["module"] == "" and int(rows[0]["flops"]) == r.flops
    top = [row for row in rows if row["depth"] == "1"]
    assert {row["module"] for row in top} == {n for n, _ in resnet18().named_children()}


def test_table_tree_markdown_state_the_convention():
    r = count_flops(resnet18().eval(), torch.randn(1, 3, 32, 32))
    table = r.table(max_depth=1)
    assert "layer1" in table and "layer1.0" not in table
    assert "1 MAC = 2 FLOPs" in table
    assert "1 MAC = 2 FLOPs" in r.tree(max_depth=2)
    assert "(conv1): Conv2d" in r.tree()
    md = r.to_markdown(max_depth=1)
    assert md.startswith("| Module") and "1 MAC = 2 FLOPs" in md
    ops = r.operator_table()
    assert "aten::convolution" in ops


def test_parameter_summary_bytes_and_trainable():
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)).half()
    model[0].weight.requires_grad_(False)
    r = count_flops(model.float(), torch.randn(2, 4))
    model[0].half()
    from flopcount import summarize_parameters

    s = summarize_parameters(model)
    assert s.total == 16 + 4 + 4 + 4
    assert s.frozen == 16 and s.trainable == 12
    assert s.bytes_by_dtype == {"float16": 2 * 20, "float32": 4 * 8}
    assert s.buffer_bytes_by_dtype == {"float32": 4 * 8, "int64": 8}
    assert r.params == 28


def test_measure_attaches_benchmark_with_achieved_flops():
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8))
    r = count_flops(model, torch.randn(4, 32), measure={"iters": 5, "warmup": 1})
    assert r.benchmark.iters == 5
    assert r.benchmark.achieved_flops_per_s == r.flops / r.benchmark.median_s
    assert "Measured: median" in r.table()
    assert r.to_dict()["benchmark"]["iters"] == 5


class WithModuleList(nn.Module):
    """A ModuleList is never called itself; it must still include its children's cost."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([nn.Linear(6, 6) for _ in range(3)])

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


def test_uncalled_container_includes_children():
    r = count_flops(WithModuleList(), torch.randn(2, 6))
    macs = r.by_module("macs")
    assert macs["blocks"] == 3 * 2 * 6 * 6 == sum(macs[f"blocks.{i}"] for i in range(3)) == r.macs
    assert [m.calls for m in r.modules if m.name == "blocks"] == [0]


# --------------------------------------------------------------------------- issue #9, findings 3 and 10


def test_metric_names_are_checked():
    import pytest

    from flopcount import UsageError

    r = count_flops(nn.Linear(4, 3), torch.randn(2, 4))
    for method in (r.by_operator, r.by_module, r.by_module_and_operator, r.by_phase):
        with pytest.raises(UsageError, match="'flops', 'macs', 'count'"):
            method("params")  # type: ignore[arg-type]


def test_module_totals_of_an_unknown_name_raise_keyerror():
    import pytest

    class WithSpare(nn.Module):
        def __init__(self):
            super().__init__()
            self.used = nn.Linear(4, 3)
            self.unused = nn.Linear(3, 3)

        def forward(self, x):
            return self.used(x)

    r = count_flops(WithSpare(), torch.randn(2, 4))
    assert r.module_totals("used").macs == 2 * 4 * 3
    assert r.module_totals("unused").flops == 0  # known but never ran: zeros
    with pytest.raises(KeyError, match="no.such.module"):
        r.module_totals("no.such.module")


class _Branchy(nn.Module):
    def __init__(self):
        super().__init__()
        self.light = nn.Linear(8, 8)
        self.heavy = nn.Linear(8, 256)

    def forward(self, x):
        if x.abs().sum() > 0:
            return self.heavy(x)
        return self.light(x)


def test_every_text_report_shows_why_a_count_is_incomplete():
    with torch.device("meta"):
        model = _Branchy()
    r = count_flops(model, torch.empty(2, 3, 8, device="meta"))
    assert not r.complete and r.gaps
    reason = r.incomplete_reasons()[0]
    for text in (r.table(), r.tree(), r.to_markdown(), r.operator_table(), str(r)):
        assert "INCOMPLETE" in text
        assert reason.split(":")[0] in text and "placeholder" in text
    assert r.to_dict()["complete"] is False and r.to_dict()["incomplete_reasons"] == list(r.incomplete_reasons())


def test_every_warning_of_a_result_is_printed_under_each_report():
    import dataclasses

    r = count_flops(nn.Linear(4, 3), torch.randn(2, 4))
    assert r.complete and "INCOMPLETE" not in r.table()
    noted = dataclasses.replace(r, warnings=("auto: fell back | for a reason",))
    for text in (noted.table(), noted.tree(), noted.operator_table()):
        assert "warning: auto: fell back | for a reason" in text
    assert "warning: auto: fell back \\| for a reason" in noted.to_markdown()
