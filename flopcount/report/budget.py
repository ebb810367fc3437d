"""The budget table: limit, actual and PASS/FAIL/INCOMPLETE per budget, in human units."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tabulate import tabulate

from flopcount.core.rendering import renders
from flopcount.units import escape_markdown, show_value

if TYPE_CHECKING:
    from flopcount.budget.check import BudgetReport


_BOUND_MARK = {"exact": "", "lower": ">= ", "estimate": "~ "}


@renders("BudgetReport", "table")
def budget_table(report: BudgetReport, fmt: str = "simple") -> str:
    """Budget, limit, actual, status per line; an actual that is a lower bound of an
    incomplete count reads ``>= x``, one that may be off either way ``~ x``."""
    rows = [
        [line.name, show_value(line.limit, line.unit), _BOUND_MARK[line.bound] + show_value(line.actual, line.unit), line.status]
        for line in report.lines
    ]
    if fmt == "github":
        rows = [[escape_markdown(cell) for cell in row] for row in rows]
    return tabulate(rows, headers=["Budget", "Limit", "Actual", "Status"], tablefmt=fmt, colalign=("left", "right", "right", "left"))
