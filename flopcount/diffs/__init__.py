"""Cost diffs: what changes from one count (or saved JSON report) to another, per module,
per operator and in total, and the baseline gate of ``flopcount check --baseline``.

Imports no torch: a diff of two saved reports reads JSON only."""

from flopcount.diffs.compute import diff
from flopcount.diffs.gate import Allowance, GrowthLine, GrowthReport, check_growth, parse_growth
from flopcount.diffs.result import METRICS, Change, DiffResult

__all__ = [
    "METRICS", "Allowance", "Change", "DiffResult", "GrowthLine", "GrowthReport", "check_growth", "diff",
    "parse_growth",
]
