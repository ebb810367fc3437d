"""#19 findings at the CLI: an INCOMPLETE verdict reads INCOMPLETE in the HTML page too (it
showed "Budgets: FAIL"), and a bug in flopcount itself exits 4 saying so, not 2 ("bad input")."""

from __future__ import annotations

import re

from tests.cli.test_trust import CUSTOM, workdir  # noqa: F401  (the fixture writes the model file)
from tests.conftest import run_cli


def test_html_check_shows_the_verdict_the_exit_code_gives(workdir, capsys, tmp_path):  # noqa: F811
    page = tmp_path / "check.html"
    code, out, err = run_cli(capsys, "check", *CUSTOM, "--max-macs", "1G", "--format", "html", "-o", str(page))
    assert code == 3, err
    text = page.read_text()
    verdict = re.search(r'Budgets: <span class="(\w+)">(\w+)</span>', text)
    assert verdict is not None and verdict.groups() == ("INCOMPLETE", "INCOMPLETE")


def test_a_bug_of_ours_exits_4_and_says_so(workdir, capsys, monkeypatch):  # noqa: F811
    # a broken ledger: the AttributeError is raised by flopcount's own code (results.py)
    monkeypatch.setattr("flopcount.core.results.Ledger", dict)
    code, out, err = run_cli(capsys, "count", "trust_models.py:Custom", "-i", "4x16")
    assert code == 4, err
    said = [line for line in err.splitlines() if line.startswith("flopcount:")]  # the model file prints too
    assert len(said) == 1 and "internal error in flopcount" in said[0] and "AttributeError" in said[0]


def test_the_users_own_error_is_still_exit_2(workdir, capsys):  # noqa: F811
    (workdir / "bad_model.py").write_text(
        "import torch\n\nclass Bad(torch.nn.Module):\n"
        "    def forward(self, x):\n        raise ValueError('my model is broken')\n"
    )
    code, out, err = run_cli(capsys, "count", "bad_model.py:Bad", "-i", "2x3")
    assert code == 2 and "my model is broken" in err and "internal error" not in err


def test_is_internal_reads_the_innermost_frame_that_is_not_a_library():
    from flopcount.cli.output import is_internal
    from flopcount.core.inputs import as_call_args

    def users_forward():
        raise ValueError("the user's")

    try:
        users_forward()
    except ValueError as caught:
        assert not is_internal(caught)
    try:
        as_call_args((), 42)  # flopcount's own code refusing kwargs that are not a mapping
    except Exception as caught:
        assert is_internal(caught)  # raised by flopcount: the CLI routes FlopcountErrors to exit 2 before asking
