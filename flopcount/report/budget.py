"""The budget table: limit, actual and PASS/FAIL/INCOMPLETE per budget, in human units."""

from __future__ import annotations

from typing import TYPE_CHECKING

from flopcount.core.rendering import renders
from flopcount.report.table import grid
from flopcount.units import show_apart, show_value  # noqa: F401  (show_value: still importable here)

if TYPE_CHECKING:
    from flopcount.budget.check import BudgetReport


_BOUND_MARK = {"exact": "", "lower": ">= ", "estimate": "~ "}


@renders("BudgetReport", "table")
def budget_table(report: BudgetReport, fmt: str = "simple") -> str:
    """Budget, limit, actual, status per line; an actual that is a lower bound of an
    incomplete count reads ``>= x``, one that may be off either way ``~ x``; limit and actual
    with the digits that keep them apart (:func:`~flopcount.units.show_apart`)."""
    rows = []
    for line in report.lines:
        actual, limit = show_apart(line.actual, line.limit, line.unit)
        rows.append([line.name, limit, _BOUND_MARK[line.bound] + actual, line.status])
    return grid(rows, ["Budget", "Limit", "Actual", "Status"], fmt, ("left", "right", "right", "left"))
