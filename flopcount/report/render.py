"""What each CLI command prints, per output format: plain functions from results to text."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Dict, Optional

from tabulate import tabulate

from .bench import bench_rows
from .html import html_report
from .table import operator_table

if TYPE_CHECKING:
    from ..bench.result import BenchmarkResult
    from ..budget import BudgetReport
    from ..results import FlopResult


def _json(data: Dict[str, Any]) -> str:
    return json.dumps(data, indent=2)


def result_dict(result: FlopResult, entry: str) -> Dict[str, Any]:
    """The result's JSON data with the ENTRY it was counted from first."""
    data: Dict[str, Any] = {"entry": entry}
    data.update(result.to_dict())
    return data


def render_count(result: FlopResult, fmt: str, *, entry: str, depth: Optional[int] = None, operators: bool = False) -> str:
    """What ``flopcount count`` prints in format ``fmt`` (table, tree, json, csv, markdown, html)."""
    if fmt == "html":
        return html_report(result, entry=entry, depth=depth)
    if fmt == "json":
        return _json(result_dict(result, entry))
    if fmt == "csv":
        return result.to_csv(max_depth=depth)
    if fmt == "tree":
        return result.tree(max_depth=depth)
    if fmt == "markdown":
        text = result.to_markdown(max_depth=depth)
        return text + ("\n" + operator_table(result, fmt="github", footer=False) if operators else "")
    text = result.table(max_depth=depth)
    return text + ("\n\n" + operator_table(result, fmt="simple", footer=False) if operators else "")


def render_bench(result: FlopResult, timing: BenchmarkResult, fmt: str, *, entry: str, depth: Optional[int] = None) -> str:
    """What ``flopcount bench`` prints: the latency summary (and the tree for ``fmt='tree'``)."""
    if fmt == "json":
        return _json(result_dict(result, entry))
    rows = bench_rows(result, timing)
    if fmt == "html":
        latency = tabulate([[label, text] for label, text, _ in rows], headers=["Latency", "Value"], colalign=("left", "right"))
        return html_report(result, entry=entry, depth=depth, sections=[("Latency", latency)], latencies_ms=timing.stats.samples_ms)
    if fmt == "csv":
        lines = ["metric,value"] + [f"{_csv_key(label)},{raw}" for label, _, raw in rows]
        return "\n".join(lines)
    mode = "eager" if not getattr(timing, "compiled", False) else "torch.compile"
    heading = (
        f"{entry} | inputs {result.input_description or '()'} | {timing.device} ({timing.timing}, {mode}, "
        f"dtype {timing.dtype or 'as model'}) | {timing.warmup} warm-up calls"
    )
    table = tabulate([[label, text] for label, text, _ in rows], headers=["Latency", "Value"],
                     tablefmt="github" if fmt == "markdown" else "simple", colalign=("left", "right"))
    parts = [f"**{heading}**\n" if fmt == "markdown" else heading, table]
    if fmt == "tree":
        parts.append(result.tree(max_depth=depth))
    return "\n".join(parts)


def _csv_key(label: str) -> str:
    return label.split(" (")[0].lower().replace(" ", "_")


def render_check(result: FlopResult, report: BudgetReport, fmt: str, *, entry: str, depth: Optional[int] = None) -> str:
    """What ``flopcount check`` prints: budget vs actual with PASS/FAIL and the verdict."""
    if fmt == "json":
        data = result_dict(result, entry)
        data["budget"] = report.to_dict()
        return _json(data)
    if fmt == "csv":
        return report.to_csv()
    failed = [line.name for line in report.exceeded]
    verdict = (
        f"PASS: all {len(report.lines)} budget(s) met"
        if report.passed
        else f"FAIL: {len(failed)} of {len(report.lines)} budget(s) exceeded: {', '.join(failed)}"
    )
    heading = f"{entry} | inputs {result.input_description or '()'}"
    if fmt == "html":
        return html_report(result, entry=entry, depth=depth, sections=[("Budgets", f"{report.table()}\n{verdict}")], budget=report)
    if fmt == "markdown":
        return f"**{heading}**\n\n{report.table(fmt='github')}\n\n**{verdict}**"
    parts = [heading, report.table(), verdict]
    if fmt == "tree":
        parts += ["", result.tree(max_depth=depth)]
    return "\n".join(parts)

