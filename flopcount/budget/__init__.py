"""The budget gate (``flopcount check``): budgets, their files, and the verdict on a reading."""

from flopcount.budget.check import (
    Budget,
    BudgetLine,
    BudgetReport,
    budget_from_mapping,
    check_budget,
    check_result,
    load_budget_file,
    parse_bytes,
    parse_quantity,
)

__all__ = [
    "Budget",
    "BudgetLine",
    "BudgetReport",
    "budget_from_mapping",
    "check_budget",
    "check_result",
    "load_budget_file",
    "parse_bytes",
    "parse_quantity",
]
