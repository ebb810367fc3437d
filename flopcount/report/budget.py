"""The budget table: limit, actual and PASS/FAIL/INCOMPLETE per budget, in human units."""

from __future__ import annotations

from typing import TYPE_CHECKING, Union

from tabulate import tabulate

from .units import escape_markdown, format_bytes, format_count, format_ms, with_unit

if TYPE_CHECKING:
    from ..budget import BudgetReport


def show_value(value: Union[int, float], unit: str) -> str:
    """A budget's limit or actual value in its unit (``ms``, ``MB`` or a count)."""
    if unit == "ms":
        return format_ms(float(value))
    if unit == "MB":
        return format_bytes(float(value) * 10**6)
    if unit == "bytes":
        return format_bytes(int(value))
    return with_unit(value, unit) if unit else format_count(value)


_BOUND_MARK = {"exact": "", "lower": ">= ", "estimate": "~ "}


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
