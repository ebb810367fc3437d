"""Branch jitdiff: a TorchScript program diffed against its eager model (and its ``.pt2``), and
table widths with zero-width characters. Numbers by hand from the layer shapes; widths by hand
from the Unicode categories of the characters used (a terminal gives a combining mark or a
zero-width space no column)."""

from __future__ import annotations

import json
import textwrap
import warnings

import pytest
import torch
from _cli_run import NET_SOURCE, cli

import flopcount
from flopcount.report.table import grid, text_table

# Net(h): Linear(16, h) -> ReLU -> Linear(h, 8) on a 4 x 16 batch
N, IN, OUT = 4, 16, 8

MODELS = NET_SOURCE


def params(h: int) -> int:
    return IN * h + h + h * OUT + OUT


def flops(h: int) -> int:
    """2 FLOPs per MAC of each Linear, 1 per ReLU element (biases not counted: docs/conventions.md)."""
    return 2 * N * IN * h + N * h + 2 * N * h * OUT


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    (tmp_path / "jd_models.py").write_text(MODELS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def _save(workdir, h: int, how: str) -> str:
    import jd_models

    model, x = jd_models.build(h).eval(), torch.randn(N, IN)
    name = f"net{h}_{how}.{'pt2' if how == 'export' else 'pt'}"
    if how == "export":
        torch.export.save(torch.export.export(model, (x,)), str(workdir / name))
    else:
        torch.jit.save(torch.jit.script(model) if how == "script" else torch.jit.trace(model, x), str(workdir / name))
    return name


# -- 1. a TorchScript program against its eager model: one model, each path matched

@pytest.mark.parametrize("how", ["script", "trace"])
def test_a_torchscript_program_diffs_unchanged_against_its_eager_model(workdir, capsys, how):
    """Before: every module read removed and added ("A and B are different models (Net ->
    RecursiveScriptModule)"), 4 added, 4 removed, in both directions."""
    program = _save(workdir, 32, how)
    for a, b in (("jd_models.py:build", program), (program, "jd_models.py:build")):
        code, out, err = cli(capsys, "diff", a, b, "-i", f"{N}x{IN}")
        assert code == 0, err
        assert "no cost change (modules: 0 changed, 0 added, 0 removed)" in out
        assert "different models" not in out
        # branch jitrows: the program's layers are booked from its graph, each compared by its costs
        assert "as TorchScript" not in out


def test_a_torchscript_program_diffs_unchanged_against_its_pt2(workdir, capsys):
    code, out, err = cli(capsys, "diff", _save(workdir, 32, "trace"), _save(workdir, 32, "export"), "-i", f"{N}x{IN}")
    assert code == 0, err
    assert "no cost change (modules: 0 changed, 0 added, 0 removed)" in out


def test_two_torchscript_programs_diff_by_their_original_classes(workdir, capsys):
    """Branch jitrows: a traced ``.pt`` against a grown scripted one names each layer's class (before:
    ``RecursiveScriptModule`` on every row) and its FLOPs change by hand (before: ``-``)."""
    code, out, err = cli(capsys, "diff", _save(workdir, 32, "trace"), _save(workdir, 48, "script"), "-i", f"{N}x{IN}",
                         "--format", "json")
    assert code == 0, err
    rows = {row["name"]: row for row in json.loads(out)["modules"]}
    assert {name: row["type"] for name, row in rows.items()} == {"": "Net", "l1": "Linear", "act": "ReLU", "l2": "Linear"}
    assert "RecursiveScriptModule" not in out
    assert rows["l1"]["delta"]["flops"] == 2 * N * IN * 16 and rows["l2"]["delta"]["flops"] == 2 * N * 16 * OUT


def test_a_grown_torchscript_program_shows_its_change_by_module(workdir, capsys):
    """h 32 -> 48: the totals and the root's costs by hand; each Linear's params and FLOPs by path
    (branch jitrows: booked from the program's graph, no longer '-'); the ReLU's FLOPs grow by N*16."""
    code, out, err = cli(capsys, "diff", "jd_models.py:build", _save(workdir, 48, "trace"), "-i", f"{N}x{IN}", "--format", "json")
    assert code == 0, err
    data = json.loads(out)
    assert data["summary"] == {"added": 0, "removed": 0, "changed": 4, "unchanged": 0}
    assert data["b_scripted"] == [] and data["a_scripted"] == []
    rows = {row["name"]: row for row in data["modules"]}
    assert rows[""]["type"] == "Net" and rows[""]["delta"]["flops"] == flops(48) - flops(32)
    assert rows[""]["delta"]["params"] == params(48) - params(32)
    assert rows["l1"]["type"] == "Linear" and rows["l1"]["delta"]["params"] == IN * 16 + 16
    assert rows["l1"]["delta"]["flops"] == 2 * N * IN * 16 and rows["l1"]["b"]["params"] == IN * 48 + 48
    assert rows["l2"]["delta"]["params"] == 16 * OUT and rows["l2"]["delta"]["flops"] == 2 * N * 16 * OUT
    assert rows["act"]["delta"]["flops"] == N * 16
    code, out, err = cli(capsys, "count", "jd_models.py:build", "-i", f"{N}x{IN}", "--format", "json", "--output", "base.json")
    assert code == 0, err
    code, out, err = cli(capsys, "check", _save(workdir, 48, "script"), "-i", f"{N}x{IN}", "--baseline", "base.json",
                         "--max-growth", "params=0,flops=1%")
    assert code == 1, err
    assert "different models" not in err
    assert f"(most in l1 (Linear) +{IN * 16 + 16}, l2 (Linear) +{16 * OUT})" in out
    # branch jitrows: the layer that grew is named (before: "most in (model) (Net) +3.136 K")
    assert flops(48) - flops(32) == 3136 and 2 * N * IN * 16 == 2048 and 2 * N * 16 * OUT == 1024
    assert "flops +50.00% > +1% (most in l1 (Linear) +2.048 K, l2 (Linear) +1.024 K" in out


def test_a_scripted_layer_of_an_eager_model_is_matched_by_path(workdir):
    """The Python API: the model with its first Linear scripted (a ``RecursiveScriptModule`` with no
    submodules, whose own row is booked) against the plain model: one model, every row unchanged."""
    import jd_models

    plain, mixed = jd_models.build(32).eval(), jd_models.build(32).eval()
    mixed.l1 = torch.jit.script(mixed.l1)
    x = torch.randn(N, IN)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the real run's warning for a model holding TorchScript
        result = flopcount.diff(flopcount.count_flops(plain, x), flopcount.count_flops(mixed, x))
    assert result.b_scripted == () and result.counts() == {"added": 0, "removed": 0, "changed": 0, "unchanged": 4}
    l1 = next(row for row in result.modules if row.name == "l1")
    assert l1.type_name == "Linear" and l1.after("flops") == 2 * N * IN * 32


# -- 2. zero-width characters take no column

#: columns a terminal gives each non-ASCII character used here, by Unicode category: U+0301
#: COMBINING ACUTE ACCENT (Mn) and U+200B ZERO WIDTH SPACE (Cf) none; U+5C42 (East Asian Wide) two
SHOWN = {"\u0301": 0, "\u200b": 0, "\u20dd": 0, "层": 2}


def _width(text: str) -> int:
    return sum(SHOWN.get(ch, 1) for ch in text)


def _columns(line: str) -> list:
    starts, column, blank = [], 0, True
    for ch in line:
        if ch != " " and blank:
            starts.append(column)
        blank = ch == " "
        column += _width(ch)
    return starts


def test_combining_and_zero_width_characters_take_no_column():
    """Before: ``cafe`` + U+0301 (an 'é' written as two code points) counted two columns for its
    last letter, its row one column to the right; a zero-width space one column too."""
    names = ["cafe\u0301", "cafe", "x\u200by", "e\u0301\u0301", "层\u0301", "a\u20dd"]
    assert all(_width(name) == len(name.encode("ascii", "ignore")) + 2 * name.count("层") for name in names)
    table = text_table([[name, 1000] for name in names], ["Module", "FLOPs"])
    lines = table.splitlines()
    assert {_width(line) for line in lines} == {_width(lines[1])}, table
    for line in lines[2:]:  # the numbers right-aligned: each starts in the same column
        assert _columns(line) == _columns(lines[2]), (line, lines[2])
    assert all(name in table for name in names)


def test_a_markdown_table_pads_by_display_width():
    """GitHub's markdown table (tabulate 'github'): the cells padded to the same display width,
    so the source lines up in an editor as the text table does; the text is the name as written."""
    table = grid([["cafe\u0301", "1"], ["cafe", "22"]], ["Module", "FLOPs"], fmt="github")
    lines = table.splitlines()
    assert len({_width(line) for line in lines}) == 1, table
    assert "| cafe\u0301 " in table


def test_a_module_named_with_a_combining_accent_keeps_the_count_tables_columns(workdir, capsys):
    (workdir / "jd_accent.py").write_text(textwrap.dedent(
        """
        from torch import nn

        class Accent(nn.Module):
            def __init__(self):
                super().__init__()
                setattr(self, "cafe\\u0301", nn.Linear(16, 8))

            def forward(self, x):
                return getattr(self, "cafe\\u0301")(x)

        def build():
            return Accent()
        """
    ))
    code, out, err = cli(capsys, "count", "jd_accent.py:build", "-i", f"{N}x{IN}")
    assert code == 0, err
    lines = out.splitlines()
    table = lines[:lines.index(next(line for line in lines if line.startswith("Total")))]
    assert any("cafe\u0301" in line for line in table)
    rule = next(line for line in table if set(line) <= {"-", " "} and line)
    rows = [line for line in table if line.strip() and line != rule]
    assert {_width(line) for line in rows} == {_width(rule)}, table
    for line in rows:
        assert _columns(line)[:2] == _columns(rule)[:2], (line, rule)
