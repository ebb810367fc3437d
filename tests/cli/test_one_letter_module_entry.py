"""An ENTRY whose module has a one-letter name (``m:build`` for ``./m.py``) was read as a Windows
drive letter and refused with "no ':attr' part"; a drive path without an attribute still is."""

from __future__ import annotations

import json

from tests.cli._cli_run import MLP_SOURCE, cli, one_error_line


def test_a_one_letter_module_is_imported(tmp_path, monkeypatch, capsys):
    (tmp_path / "m.py").write_text(MLP_SOURCE + "def build():\n    return Mlp()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(__import__("sys").modules, "m", raising=False)
    code, out, err = cli(capsys, "count", "m:build", "--input", "2x16", "--format", "json")
    assert code == 0, err
    # the MLP by hand: 2 rows x (16 x 32 + 32 x 8) MACs
    assert json.loads(out)["macs"] == 2 * (16 * 32 + 32 * 8)


def test_a_drive_path_without_an_attribute_is_still_refused(capsys):
    err = one_error_line(*cli(capsys, "count", "C:\\models\\m.py", "--input", "2x16"))
    assert "no ':attr' part (did you mean C:\\models\\m.py:ATTR?)" in err
