"""The latency budget in seconds (issue #27 item 6): ``Budget(max_latency_s=)``,
``check_budget(latency_s=)``, ``check_result(latency_s=)``, a ``latency`` line with unit ``s``;
milliseconds only in the table and the messages. The 0.2 spellings in milliseconds work for one
release, warn once at the caller's line and give the same report. Oracles: limits and latencies
written by hand in both units (5 ms = 0.005 s, 1 ms = 0.001 s)."""

from __future__ import annotations

import inspect
import warnings
from typing import Any, Callable, List, Tuple

import pytest
import torch
from torch import nn

from flopcount import count_flops
from flopcount.budget.check import Budget, budget_from_mapping, check_budget, check_result, load_budget_file
from flopcount.errors import UsageError

LIMIT_S = 0.005  # a 5 ms budget
MEASURED_S = 0.001  # a measured 1 ms


def _result() -> Any:
    return count_flops(nn.Linear(4, 3), torch.randn(2, 4))


def _warned(call: Callable[[], Any]) -> Tuple[Any, List[warnings.WarningMessage]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = call()
    return value, [w for w in caught if issubclass(w.category, DeprecationWarning)]


def test_a_latency_budget_in_seconds_is_a_latency_line_in_seconds():
    report = check_result(_result(), Budget(max_latency_s=LIMIT_S), latency_s=MEASURED_S)
    (line,) = report.lines
    assert (line.name, line.limit, line.actual, line.unit, str(line.status)) == ("latency", 0.005, 0.001, "s", "PASS")
    data = report.to_dict()
    assert data["status"] == "PASS" and data["exceeded"] == []
    (row,) = data["lines"]
    assert (row["name"], row["unit"], row["limit"], row["actual"]) == ("latency", "s", 0.005, 0.001)
    assert (row["limit_ms"], row["actual_ms"]) == (5.0, 1.0)  # 0.2's keys beside, one release
    assert report.to_csv().splitlines() == ["budget,limit,actual,unit,status", "latency,0.005,0.001,s,PASS", "overall,,,,PASS"]
    # rendered in milliseconds, as before
    assert line.describe() == "latency 1.000 ms <= 5.000 ms"
    table_row = next(text for text in report.table().splitlines() if text.startswith("latency"))
    assert table_row.split() == ["latency", "5.000", "ms", "1.000", "ms", "PASS"]


def test_an_exceeded_latency_is_named_latency():
    report = check_budget(Budget(max_latency_s=LIMIT_S, max_params=10), latency_s=0.006, params=10)
    assert report.to_dict()["exceeded"] == ["latency"]
    assert report.verdict() == "FAIL: 1 of 2 budget(s) exceeded: latency"
    assert report.exceeded[0].describe() == "latency 6.000 ms > 5.000 ms"
    undecided = check_budget(Budget(max_latency_s=LIMIT_S), latency_s=0.004, latency_bound="lower")
    assert str(undecided.status) == "UNDECIDED"
    assert undecided.verdict().startswith("UNDECIDED: latency is not decided without measuring")
    # no line but the latency carries the ms keys
    other = check_budget(Budget(max_params=10), params=3).to_dict()["lines"][0]
    assert "limit_ms" not in other and "actual_ms" not in other


def test_the_02_millisecond_keywords_warn_at_the_callers_line_and_give_the_same_report():
    here = __file__
    budget, caught = _warned(lambda: Budget(max_latency_ms=5))
    line = inspect.currentframe().f_lineno - 1  # type: ignore[union-attr]
    assert budget == Budget(max_latency_s=0.005) and budget.max_latency_s == 0.005
    assert len(caught) == 1 and (caught[0].filename, caught[0].lineno) == (here, line)
    assert "max_latency_ms=" in str(caught[0].message) and "max_latency_s=" in str(caught[0].message)

    new = check_budget(Budget(max_latency_s=LIMIT_S), latency_s=MEASURED_S).to_dict()
    old, caught = _warned(lambda: check_budget(Budget(max_latency_s=LIMIT_S), latency_ms=1.0))
    line = inspect.currentframe().f_lineno - 1  # type: ignore[union-attr]
    assert old.to_dict() == new
    assert len(caught) == 1 and (caught[0].filename, caught[0].lineno) == (here, line)
    assert "check_budget: latency_ms=" in str(caught[0].message)

    result = _result()
    new = check_result(result, Budget(max_latency_s=LIMIT_S), latency_s=MEASURED_S).to_dict()
    old, caught = _warned(lambda: check_result(result, Budget(max_latency_s=LIMIT_S), latency_ms=1.0))
    line = inspect.currentframe().f_lineno - 1  # type: ignore[union-attr]
    assert old.to_dict() == new
    assert len(caught) == 1 and (caught[0].filename, caught[0].lineno) == (here, line)  # once: not again from check_budget
    # 0.2's positional third argument was milliseconds and still is
    positional, caught = _warned(lambda: check_result(result, Budget(max_latency_s=LIMIT_S), 1.0))
    assert positional.to_dict() == new and len(caught) == 1


def test_reading_max_latency_ms_warns_and_gives_milliseconds():
    budget = Budget(max_latency_s=0.0025)
    value, caught = _warned(lambda: budget.max_latency_ms)
    assert value == 2.5 and len(caught) == 1 and caught[0].filename == __file__
    assert Budget().needs_latency is False and _warned(lambda: Budget().max_latency_ms)[0] is None


@pytest.mark.parametrize(
    "call, names",
    [
        (lambda: Budget(max_latency_s=0.005, max_latency_ms=5), ("max_latency_s=", "max_latency_ms=")),
        (lambda: check_budget(Budget(max_latency_s=0.005), latency_s=0.001, latency_ms=1.0), ("latency_s=", "latency_ms=")),
        (lambda: check_result(_result(), Budget(max_latency_s=0.005), 1.0, latency_s=0.001), ("latency_s=", "latency_ms=")),
        (lambda: budget_from_mapping({"max-latency-s": 0.05, "max-latency-ms": 50}, "pyproject.toml"), ("max-latency-s", "max-latency-ms")),
    ],
)
def test_giving_both_spellings_is_a_usage_error_naming_both(call, names):
    with pytest.raises(UsageError) as raised:
        call()
    assert all(name in str(raised.value) for name in names)


def test_budget_files_read_seconds_and_still_read_the_02_milliseconds(tmp_path):
    assert budget_from_mapping({"max-latency-s": 0.05}, "x") == Budget(max_latency_s=0.05)
    assert budget_from_mapping({"max_latency_s": "0.05"}, "x") == Budget(max_latency_s=0.05)
    config = tmp_path / "pyproject.toml"
    config.write_text('[tool.flopcount]\nmax-params = "1M"\nmax_latency_ms = 50\n')
    budget, caught = _warned(lambda: load_budget_file(config))
    assert budget == Budget(max_params=1_000_000, max_latency_s=0.05)
    assert len(caught) == 1
    assert str(caught[0].message).startswith(f"{config} [tool.flopcount]: max-latency-ms is deprecated")
    assert str(caught[0].message).endswith("use max-latency-s in seconds")
