"""The budget table: limit, actual and PASS/FAIL per budget, in human units."""

from __future__ import annotations

from typing import TYPE_CHECKING, Union

from tabulate import tabulate

from .units import format_bytes, format_count, format_ms, with_unit

if TYPE_CHECKING:
    from ..budget import BudgetReport


def show_value(value: Union[int, float], unit: str) -> str:
    """A budget's limit or actual value in its unit (``ms``, ``MB`` or a count)."""
    if unit == "ms":
        return format_ms(float(value))
    if unit == "MB":
        return f"{float(value):.2f} MB"
    if unit == "bytes":
        return format_bytes(int(value))
    return with_unit(value, unit) if unit else format_count(value)


def budget_table(report: BudgetReport, fmt: str = "simple") -> str:
    """Budget, limit, actual, PASS/FAIL per line."""
    rows = [
        [line.name, show_value(line.limit, line.unit), show_value(line.actual, line.unit), "PASS" if line.passed else "FAIL"]
        for line in report.lines
    ]
    return tabulate(rows, headers=["Budget", "Limit", "Actual", "Status"], tablefmt=fmt, colalign=("left", "right", "right", "left"))
