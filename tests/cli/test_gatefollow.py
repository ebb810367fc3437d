"""Branch gatefollow: the gate's papercuts left by gatewalk (docs/performance.md), each a test that
failed on the parent (but the oracle's own check and the guard that a grown program is still a
change). Expected numbers are derived by hand from the layer shapes (the contractions
also by ``torch.utils.flop_counter.FlopCounterMode``)."""

from __future__ import annotations

import json
import textwrap
import warnings

import pytest
import torch
from _cli_run import NET_SOURCE, cli, one_error_line
from conftest import torch_contraction_flops

# Net(h): Linear(16, h) -> ReLU -> Linear(h, 8) on an N x 16 batch
IN, OUT = 16, 8

MODELS = NET_SOURCE


def flops(n: int, h: int) -> int:
    """2 FLOPs per MAC of each Linear, 1 per ReLU element (biases are not counted: docs/conventions.md)."""
    return 2 * n * IN * h + n * h + 2 * n * h * OUT


def macs(n: int, h: int) -> int:
    return n * IN * h + n * h * OUT


# a training step of a 70B model is ~10^18 FLOPs: this one's forward, on meta tensors, is 1.03 x 10^18
BIG_H, BIG_N = 2**20, 20_000_000_000
BIG = ("gf_models.py:build", "--config", f"h={BIG_H}", "-i", f"{BIG_N}x16", "--device", "meta")


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    (tmp_path / "gf_models.py").write_text(MODELS)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_the_hand_formulas_are_torchs():
    """The oracle of this file, checked once: the contractions as FlopCounterMode counts them."""
    from torch import nn

    net = nn.Sequential(nn.Linear(IN, 48), nn.ReLU(), nn.Linear(48, OUT))
    assert torch_contraction_flops(net, (torch.randn(4, IN),)) == flops(4, 48) - 4 * 48 == 2 * macs(4, 48)


# -- 1. counts of 10^15 and above: P and E, printed and read back

def test_counts_of_a_peta_and_more_print_in_p_and_e(workdir, capsys):
    total, l1 = flops(BIG_N, BIG_H), 2 * BIG_N * IN * BIG_H
    assert 10**18 < total < 10**19 and 10**17 < l1 < 10**18
    code, out, err = cli(capsys, "count", *BIG)
    assert code == 0, err
    assert f"{total / 1e18:.3f} EFLOPs" in out and f"{macs(BIG_N, BIG_H) / 1e15:.3f} PMACs" in out
    l1_row = next(line for line in out.splitlines() if line.startswith("l1 "))
    assert f"{l1 / 1e15:.3f} P" in l1_row
    for fmt in ("markdown", "html"):
        code, out, err = cli(capsys, "count", *BIG, "--format", fmt)
        assert code == 0, err
        assert f"{total / 1e18:.3f} EFLOPs" in out and "TFLOPs" not in out
    code, out, err = cli(capsys, "count", *BIG, "--format", "json")  # JSON: raw numbers
    assert code == 0, err
    assert json.loads(out)["flops"] == total
    code, out, err = cli(capsys, "count", *BIG, "--format", "csv")
    assert code == 0, err
    assert out.splitlines()[1].split(",")[-2:] == [str(macs(BIG_N, BIG_H)), str(total)]


def test_sizes_of_a_petabyte_and_more_print_in_pb_and_eb():
    from flopcount.units import format_bytes, format_count

    assert format_bytes(167_772_160_000_000_000) == "167.77 PB"
    assert format_bytes(2_500_000_000_000_000_000) == "2.50 EB"
    assert format_count(10**15) == "1.000 P" and format_count(-2 * 10**18) == "-2.000 E"
    assert format_count(999_999 * 10**9) == "999.999 T"


def test_budgets_take_p_and_e(workdir, capsys):
    total = flops(BIG_N, BIG_H)  # 1,027,604,480,000,000,000
    code, out, err = cli(capsys, "check", *BIG, "--max-flops", "1P")
    assert code == 1, err
    assert f"budget exceeded: flops {total / 1e18:.3f} EFLOPs > 1.000 PFLOPs" in err
    # the boundary, exactly: 1.02760448E is the count; 1.02760448 * 10^18 in floats is 1 short of it
    assert float("1.02760448") * 10**18 < total
    code, out, err = cli(capsys, "check", *BIG, "--max-flops", "1.02760448E")
    assert code == 0, err
    code, out, err = cli(capsys, "check", *BIG, "--max-flops", "1.0276044799E")
    assert code == 1, err
    # a budget file
    (workdir / "pyproject.toml").write_text('[tool.flopcount]\nmax-flops = "1.1E"\nmax-macs = "0.5E"\n')
    code, out, err = cli(capsys, "check", *BIG)
    assert code == 1, err
    assert f"macs {macs(BIG_N, BIG_H) / 1e15:.3f} PMACs > 500.000 PMACs" in err
    (workdir / "pyproject.toml").unlink()
    # 1E3 is still an exponent (an exponent has digits)
    code, out, err = cli(capsys, "check", "gf_models.py:build", "-i", "4x16", "--max-flops", "1E3")
    assert code == 1, err
    assert f"flops {flops(4, 32) / 1e3:.3f} KFLOPs > 1.000 KFLOPs" in err


def test_allowances_take_p_and_e(workdir, capsys):
    code, _, err = cli(capsys, "count", "gf_models.py:build", "--config", f"h={BIG_H}", "-i", f"{BIG_N // 2}x16",
                       "--device", "meta", "--format", "json", "-o", "half.json")
    assert code == 0, err
    grown = flops(BIG_N, BIG_H) - flops(BIG_N // 2, BIG_H)
    code, out, err = cli(capsys, "check", *BIG, "--baseline", "half.json", "--max-growth", "flops=0.5E")
    assert code == 1, err
    assert f"flops +{grown:,} (+100.00%) > +{5 * 10**17:,}" in err
    code, out, err = cli(capsys, "check", *BIG, "--baseline", "half.json", "--max-growth", f"flops={grown / 1e18}E")
    assert code == 0, err


@pytest.mark.parametrize(("flag", "value", "said"), [
    ("--max-flops", "5X", "'X' is not a unit (K, M, G, T, P, E: 10^3 to 10^18)"),
    ("--max-flops", "2p", "'p' is not a unit (K, M, G, T, P, E: 10^3 to 10^18)"),
    ("--max-memory", "5ZB", "'ZB' is not a unit (B, kB, MB, GB, TB, PB, EB: 10^3 to 10^18 bytes; KiB ... EiB: 2^10 to 2^60)"),
])
def test_a_unit_that_is_none_is_named_in_one_line(workdir, capsys, flag, value, said):
    err = one_error_line(*cli(capsys, "check", "gf_models.py:build", "-i", "4x16", flag, value))
    assert said in err


# -- 2. a TorchScript .pt against its eager model: one linear, two spellings

def _saved(workdir, how: str, h: int) -> str:
    import importlib.util

    spec = importlib.util.spec_from_file_location("gf_models", workdir / "gf_models.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    net = module.build(h)
    with warnings.catch_warnings():  # torch 2.13 deprecates TorchScript; users still ship it
        warnings.simplefilter("ignore", DeprecationWarning)
        program = torch.jit.script(net) if how == "script" else torch.jit.trace(net, torch.randn(4, IN))
        torch.jit.save(program, f"{how}{h}.pt")
    return f"{how}{h}.pt"


@pytest.mark.parametrize("how", ["script", "trace"])
@pytest.mark.parametrize("shape", ["4x16", "2x2x16"])
def test_a_torchscript_program_respells_its_eager_linear_without_a_change(workdir, capsys, how, shape):
    """The program run by the dispatch tracer (``--tracer dispatch``; "auto" reads its graph since branch
    jitrows, where it spells ``aten::linear`` as the eager model does): its linear runs below Python."""
    saved = _saved(workdir, how, 32)
    code, out, err = cli(capsys, "diff", "gf_models.py:build", saved, "-i", shape, "--tracer", "dispatch")
    assert code == 0, err
    assert "Changed operators" not in out
    assert "aten::linear (A) and aten::addmm + aten::t" in out and "are the same work spelled two ways" in out
    code, out, err = cli(capsys, "diff", "gf_models.py:build", saved, "-i", shape, "--format", "json", "--tracer", "dispatch")
    report = json.loads(out)
    assert report["totals"]["flops"]["a"] == report["totals"]["flops"]["b"] == flops(4, 32)
    ops = {row["name"]: row for row in report["operators"]}
    assert {ops[op]["status"] for op in ("aten::linear", "aten::addmm", "aten::t")} == {"respelled"}
    assert ops["aten::linear"]["a"]["macs"] == ops["aten::addmm"]["b"]["macs"] == macs(4, 32)
    assert ops["aten::relu"]["status"] == "unchanged"


def test_a_grown_torchscript_program_is_still_a_change(workdir, capsys):
    saved = _saved(workdir, "script", 48)
    tracer = ("--tracer", "dispatch")  # the run's spelling (see the test above)
    code, out, err = cli(capsys, "diff", "gf_models.py:build", saved, "-i", "4x16", "--format", "json", *tracer)
    assert code == 0, err
    ops = {row["name"]: row for row in json.loads(out)["operators"]}
    assert ops["aten::linear"]["status"] == "removed" and ops["aten::addmm"]["status"] == "added"
    assert ops["aten::addmm"]["b"]["macs"] - ops["aten::linear"]["a"]["macs"] == macs(4, 48) - macs(4, 32)
    code, out, err = cli(capsys, "diff", "gf_models.py:build", saved, "-i", "4x16", *tracer)
    assert "Changed operators" in out and "same work spelled" not in out
    # branch jitrows: "auto" reads the program's graph, one spelling on both sides
    code, out, err = cli(capsys, "diff", "gf_models.py:build", saved, "-i", "4x16", "--format", "json")
    ops = {row["name"]: row for row in json.loads(out)["operators"]}
    assert ops["aten::linear"]["status"] == "changed" and "aten::addmm" not in ops
    assert ops["aten::linear"]["b"]["macs"] - ops["aten::linear"]["a"]["macs"] == macs(4, 48) - macs(4, 32)


# -- 3. module names with wide characters keep their table's columns

WIDE_MODELS = textwrap.dedent(
    """
    from torch import nn

    class Wide(nn.Module):
        def __init__(self):
            super().__init__()
            self.层 = nn.Linear(16, 32)
            self.act = nn.ReLU()
            setattr(self, "火箭🚀", nn.Linear(32, 8))

        def forward(self, x):
            return getattr(self, "火箭🚀")(self.act(self.层(x)))

    def build():
        return Wide()
    """
)

#: the columns a terminal gives each non-ASCII character used here: East Asian Width W (Unicode
#: UAX #11: CJK ideographs, U+1F680 ROCKET), two each
WIDE = {"层": 2, "火": 2, "箭": 2, "🚀": 2}


def _shown_width(text: str) -> int:
    return sum(WIDE.get(ch, 1) if not ch.isascii() else 1 for ch in text)


def _columns_at(line: str) -> list:
    """The display columns where each run of non-blank text starts (a cell, or a rule's dashes)."""
    starts, column, blank = [], 0, True
    for ch in line:
        if ch != " " and blank:
            starts.append(column)
        blank = ch == " "
        column += _shown_width(ch)
    return starts


def _aligned(table_lines: list) -> None:
    rule = next(line for line in table_lines if set(line) <= {"-", " "})
    widths = {_shown_width(line) for line in table_lines}
    assert len(widths) == 1, table_lines
    for line in table_lines:
        assert _columns_at(line)[:2] == _columns_at(rule)[:2], (line, rule)


def test_wide_module_names_keep_the_tables_columns(workdir, capsys):
    assert all(not ch.isascii() for ch in WIDE)
    (workdir / "gf_wide.py").write_text(WIDE_MODELS)
    code, out, err = cli(capsys, "count", "gf_wide.py:build", "-i", "4x16")
    assert code == 0, err
    lines = out.splitlines()
    table = lines[:lines.index(next(line for line in lines if line.startswith("Total")))]
    assert any("层" in line for line in table) and any("火箭🚀" in line for line in table)
    _aligned(table)
    code, out, err = cli(capsys, "diff", "gf_models.py:build", "gf_wide.py:build", "-i", "4x16")
    assert code == 0, err
    lines = out.splitlines()
    start = lines.index(next(line for line in lines if line.startswith("Changed modules"))) + 1
    modules = lines[start:lines.index("", start)]
    assert any("火箭🚀" in line for line in modules)
    _aligned(modules)
