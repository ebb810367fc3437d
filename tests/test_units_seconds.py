"""Issue #27: one spelling of a time. report/plan.py, report/profile.py, report/serving.py,
report/diff.py and cli/output.py each had their own seconds formatter (1.23 ms in a plan,
1.230 ms in a profile, 12.345 us in serve, 0.5 ms as 0.500 ms in a diff, 0.35 s in a progress
line); all now use flopcount.units.format_seconds."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from flopcount.units import format_seconds

PACKAGE = Path(__file__).resolve().parents[1] / "flopcount"


@pytest.mark.parametrize(
    "seconds, text",
    [
        (None, "-"),
        (0.0, "0.0 us"),
        (2.5e-9, "2.5 ns"),  # below 1 us: 2.5e-9 s x 1e9 = 2.5 ns
        (12.345e-6, "12.3 us"),  # 12.345e-6 s x 1e6 = 12.345 us, one decimal
        (1.23e-3, "1.230 ms"),  # 1.23e-3 s x 1e3, three decimals
        (0.4, "400.000 ms"),
        (2.5, "2.500 s"),
        (200.0, "3 min 20 s"),  # 200 s = 3 x 60 + 20
    ],
)
def test_format_seconds_picks_the_unit(seconds: float, text: str) -> None:
    assert format_seconds(seconds) == text


def test_an_estimate_is_spelled_with_fewer_decimals() -> None:
    # bench's "expect about" line: 0.30049 s -> 300.49 ms -> one decimal "300.5 ms"; 4.5 s -> "4.5 s"
    assert format_seconds(0.30049, 1) == "300.5 ms"
    assert format_seconds(4.5, 1) == "4.5 s"


def test_no_other_seconds_formatter_in_the_face_and_consumers() -> None:
    defined = []
    for folder in ("report", "cli", "budget", "diffs", "integrations"):
        for path in (PACKAGE / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.FunctionDef) and node.name in ("format_seconds", "_seconds", "_ms"):
                    defined.append(f"{path.relative_to(PACKAGE)}:{node.name}")
    assert defined == []


def test_the_readings_render_times_with_it() -> None:
    from flopcount.report import diff, plan, profile, serving

    assert plan.format_seconds is profile.format_seconds is serving.format_seconds is format_seconds
    # a diff's latency row: 0.5 ms is 500 us (it was "0.500 ms"), a second stays in seconds
    assert diff.show("latency", 5e-4) == "500.0 us" and diff.show("latency", 1.5) == "1.500 s"
