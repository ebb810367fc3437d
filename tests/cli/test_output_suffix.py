"""``--output FILE`` without ``--format`` writes the format FILE's suffix names (.json, .csv, .md,
.html), as a user who types ``-o base.json`` expects: before, it wrote a text table into
base.json, which ``diff`` and ``check --baseline`` then could not read. A ``--format`` the user
gave wins, with a warning when the suffix names another; a suffix the command cannot write
(``roofs -o r.csv``) and an unknown one (``.txt``) keep the table.

Oracle: the MLP's MACs by hand, 4 rows x (16 x 32 + 32 x 4), and the files parsed back as what
their suffix says."""

from __future__ import annotations

import csv
import json
import textwrap

import pytest
from conftest import run_cli

MODEL = textwrap.dedent(
    """
    import torch

    def mlp():
        return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    """
)
MACS = 4 * (16 * 32 + 32 * 4)


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    (tmp_path / "m.py").write_text(MODEL)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_a_json_suffix_writes_json_that_diff_reads_back(workdir, capsys):
    code, out, err = run_cli(capsys, "count", "m.py:mlp", "-i", "4x16", "-o", "base.json", "-q")
    assert code == 0, err
    data = json.loads((workdir / "base.json").read_text())
    assert data["macs"] == MACS
    code, out, err = run_cli(capsys, "diff", "base.json", "base.json", "-f", "json")
    assert code == 0, err
    assert json.loads(out)["totals"]["macs"]["a"] == MACS


@pytest.mark.parametrize("suffix, check", [
    (".csv", lambda text: next(csv.DictReader(text.splitlines()))["macs"] == str(MACS)),
    (".md", lambda text: text.startswith("| Module") and "| 2.560 K |" in text),  # MACS = 2,560
    (".txt", lambda text: text.startswith("Module ") and " 2.560 K " in text and "|" not in text),
])
def test_other_suffixes(workdir, capsys, suffix, check):
    code, out, err = run_cli(capsys, "count", "m.py:mlp", "-i", "4x16", "-o", f"report{suffix}", "-q")
    assert code == 0, err
    assert check((workdir / f"report{suffix}").read_text())


def test_a_format_given_wins_and_the_other_suffix_is_said(workdir, capsys):
    code, out, err = run_cli(capsys, "count", "m.py:mlp", "-i", "4x16", "-f", "csv", "-o", "report.json")
    assert code == 0, err
    assert "--output report.json gets --format csv, not the json its suffix names" in err
    assert next(csv.DictReader((workdir / "report.json").read_text().splitlines()))["macs"] == str(MACS)


def test_a_suffix_the_command_cannot_write_keeps_the_table(workdir, capsys):
    code, out, err = run_cli(capsys, "count", "m.py:mlp", "-i", "4x16", "-f", "json", "-o", "base.json", "-q")
    assert code == 0, err
    code, out, err = run_cli(capsys, "diff", "base.json", "base.json", "-o", "changes.html")  # diff has no html
    assert code == 0, err
    assert (workdir / "changes.html").read_text().startswith("flopcount diff: A = base.json")


def test_a_suffix_the_command_cannot_write_is_said(workdir, capsys):
    """walk27: ``--help`` promises that the suffix picks the format; where the command cannot write
    it (``roofs`` writes table or json) the table it writes instead is said, as a ``--format`` that
    overrides the suffix is (main wrote a table into roofs.csv without a word)."""
    code, out, err = run_cli(capsys, "roofs", "h100", "-o", "roofs.csv")
    assert code == 0, err
    assert "--output roofs.csv gets --format table: this command writes table or json, not the csv its suffix names" in err
    assert (workdir / "roofs.csv").read_text().startswith("H100 SXM")
    code, out, err = run_cli(capsys, "roofs", "h100", "-o", "roofs.csv", "-q")
    assert code == 0 and "warning" not in err
