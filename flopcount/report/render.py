"""What each CLI command prints, per output format: plain functions from results to text."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Optional, Tuple

from flopcount.report.bench import bench_rows, bench_unit, device_text
from flopcount.report.html import html_report
from flopcount.report.memory import peak_summary
from flopcount.report.notes import note_lines
from flopcount.report.table import grid, operator_table
from flopcount.units import escape_markdown

if TYPE_CHECKING:
    from flopcount.bench.result import BenchmarkResult
    from flopcount.budget.check import BudgetReport
    from flopcount.core.results import FlopResult
    from flopcount.diffs.gate import GrowthReport
    from flopcount.generation.count import GenerationResult
    from flopcount.memory.estimate import MemoryEstimate


def entry_json(result: Any, entry: str, **more: Any) -> str:
    """A reading's JSON document: the ENTRY it was counted from first, then its ``to_dict()``
    (and ``more`` keys)."""
    return json.dumps({"entry": entry, **result.to_dict(), **more}, indent=2)


def render_count(result: FlopResult, fmt: str, *, entry: str, depth: Optional[int] = None, operators: bool = False) -> str:
    """What ``flopcount count`` prints in format ``fmt`` (table, tree, json, csv, markdown, html)."""
    if fmt == "html":
        return html_report(result, entry=entry, depth=depth)
    if fmt == "json":
        return entry_json(result, entry)
    if fmt == "csv":
        return result.to_csv(max_depth=depth)
    if fmt == "tree":
        return result.tree(max_depth=depth)
    markdown = fmt == "markdown"
    text = result.to_markdown(max_depth=depth) if markdown else result.table(max_depth=depth)
    return text + (("\n" if markdown else "\n\n") + operator_table(result, fmt="github" if markdown else "simple", footer=False)
                   if operators else "")


def render_bench(result: FlopResult, timing: BenchmarkResult, fmt: str, *, entry: str, depth: Optional[int] = None) -> str:
    """What ``flopcount bench`` prints: the latency summary (and the tree for ``fmt='tree'``)."""
    if fmt == "json":
        return entry_json(result, entry)
    rows = bench_rows(result, timing)
    table = grid([[label, text] for label, text, _ in rows], ["Latency", "Value"], "github" if fmt == "markdown" else "simple",
                 ("left", "right"))
    if fmt == "html":
        return html_report(result, entry=entry, depth=depth, sections=[("Latency", table)], latencies_ms=[v * 1e3 for v in timing.stats.samples_s])
    if fmt == "csv":
        return "\n".join(["metric,value,unit"] + [f"{_csv_key(label)},{raw},{bench_unit(label)}" for label, _, raw in rows])
    mode = "eager" if not getattr(timing, "compiled", False) else "torch.compile"
    heading = (
        f"{entry} | inputs {result.input_description or '()'} | {device_text(timing)} ({timing.timing}, {mode}, "
        f"dtype {timing.dtype or 'as model'}) | {timing.warmup} warm-up calls"
    )
    parts = [f"**{escape_markdown(heading)}**\n" if fmt == "markdown" else heading, table]
    if fmt == "tree":  # the tree ends with the notes
        parts.append(result.tree(max_depth=depth))
    else:
        notes = note_lines(result, markdown=fmt == "markdown")
        parts += [""] + notes if notes else []
    return "\n".join(parts)


def _csv_key(label: str) -> str:
    return label.split(" (")[0].lower().replace(" ", "_")


def overall_status(report: Optional[BudgetReport], growth: Optional[GrowthReport]) -> str:
    """The check's one status: FAIL before INCOMPLETE before UNDECIDED before PASS."""
    statuses = [str(r.status) for r in (report, growth) if r is not None]
    return next((status for status in ("FAIL", "INCOMPLETE", "UNDECIDED") if status in statuses), "PASS")


def render_check(
    result: FlopResult,
    report: Optional[BudgetReport],
    fmt: str,
    *,
    entry: str,
    depth: Optional[int] = None,
    memory: Optional[MemoryEstimate] = None,
    growth: Optional[GrowthReport] = None,
    planned: Optional[Tuple[int, str]] = None,
) -> str:
    """What ``flopcount check`` prints: budget vs actual with PASS/FAIL/INCOMPLETE per line,
    the verdict, growth over the baseline (``growth``, from ``--baseline``), what a memory
    budget's peak includes (``memory``; or ``planned``, a plan's peak in bytes and the one line
    saying what it is of), and why the count may be short. The markdown suits a GitHub step summary."""
    status = overall_status(report, growth)
    if fmt == "json":
        sections = {"budget": report, "baseline": growth, "memory": memory}
        data = {"status": status, **{k: s.to_dict() for k, s in sections.items() if s is not None}}
        if planned is not None:
            data["memory"] = {"peak_bytes": planned[0], "of": planned[1]}
        return entry_json(result, entry, **data)
    if fmt == "csv":
        rows = report.to_csv() if report is not None else ""
        if growth is not None:
            lines = ["growth,baseline,current,allowed,status"]
            lines += [f"{line.metric},{line.baseline},{line.current},{line.allowance},{line.status}" for line in growth.lines]
            lines.append(f"overall,,,,{growth.status}")
            rows += ("\n" if rows else "") + "\n".join(lines) + "\n"
        return rows
    heading = f"{entry} | inputs {result.input_description or '()'}"
    notes = note_lines(result, markdown=fmt == "markdown")
    peak = [peak_summary(memory)] if memory is not None else [planned[1]] if planned else []
    budget_parts = [] if report is None else [report.table(), report.verdict()]
    growth_title = "" if growth is None else f"against the baseline {growth.diff.a_label}"
    growth_parts = [] if growth is None else [growth_title, growth.table(), growth.verdict(), *growth.notes]
    if fmt == "html":
        budgets = "\n".join([*budget_parts, *growth_parts, *peak])
        return html_report(result, entry=entry, depth=depth, sections=[("Budgets", budgets)], budget=report)
    if fmt == "markdown":
        parts = [f"### flopcount check: {status}", f"**{escape_markdown(heading)}**"]
        if report is not None:
            parts += [report.table(fmt="github"), f"**{escape_markdown(report.verdict())}**"]
        if growth is not None:
            parts += [f"#### Growth {escape_markdown(growth_title)}", growth.table(fmt="github"), f"**{escape_markdown(growth.verdict())}**"]
            parts += [escape_markdown(note) for note in growth.notes]
        parts += [escape_markdown(line) for line in peak]
        if notes:
            parts.append("\n".join(notes))
        return "\n\n".join(parts)
    parts = [heading, *budget_parts, *growth_parts, *peak]
    if fmt == "tree":  # the tree ends with the notes
        return "\n".join([*parts, "", result.tree(max_depth=depth)])
    return "\n".join(parts + notes)


def render_generation(result: GenerationResult, fmt: str, *, entry: str) -> str:
    """What ``flopcount count --generate N`` prints: prefill, decode and totals."""
    from flopcount.report.generation import generation_table

    if fmt == "json":
        return entry_json(result, entry)
    if fmt == "csv":
        rows = [f"prefill,,{result.prefill.macs},{result.prefill.flops}"]
        rows += [f"decode,{i},{s.macs},{s.flops}" for i, s in enumerate(result.steps)]
        return "\n".join(["phase,step,macs,flops"] + rows)
    heading = f"{entry} | generate {result.new_tokens} new tokens after a {result.batch}x{result.prompt_tokens} prompt"
    if fmt == "markdown":
        return f"**{heading}**\n\n" + generation_table(result, fmt="github")
    return heading + "\n" + generation_table(result)
