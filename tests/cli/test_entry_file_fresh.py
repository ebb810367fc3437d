"""An entry file edited within the same second at the same size is read as edited (found by the
suite's CI-recipe test: the import system's bytecode cache keys a file on its mtime in whole
seconds and its size, so the second count ran the stale __pycache__ entry); and counting writes
no __pycache__ into the user's folder."""

from __future__ import annotations

import json
import os
import sys

from _cli_run import cli

SOURCE = """from torch import nn


def build():
    return nn.Linear(4, {width})
"""


def _macs(capsys, path) -> int:
    code, out, _ = cli(capsys, "count", f"{path}:build", "--input", "2x4", "--format", "json")
    assert code == 0
    return int(json.loads(out)["macs"])


def test_an_edit_in_the_same_second_at_the_same_size_is_counted(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sys, "dont_write_bytecode", False)  # Python's default (make test unexports PYTHONDONTWRITEBYTECODE)
    path = tmp_path / "model.py"
    path.write_text(SOURCE.format(width=8))
    stamp = path.stat().st_mtime_ns
    assert _macs(capsys, path) == 2 * 4 * 8  # batch x in x out
    path.write_text(SOURCE.format(width=9))  # the same number of bytes
    os.utime(path, ns=(stamp, stamp))  # and the same mtime: what an edit within a second looks like
    assert _macs(capsys, path) == 2 * 4 * 9
    assert not (tmp_path / "__pycache__").exists()
