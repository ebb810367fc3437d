"""Diff renderers: a text table, a pull-request comment (markdown), JSON and CSV; and the
baseline gate's table."""

from __future__ import annotations

import csv
import io
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence

from flopcount.core.rendering import renders
from flopcount.diffs.result import MODULE_METRICS, OPERATOR_METRICS
from flopcount.report.table import text_table
from flopcount.types import CONVENTION, REPORT_SCHEMA_VERSION
from flopcount.units import ROOT_LABEL, escape_markdown, format_bytes, format_count, format_seconds, markdown_code

if TYPE_CHECKING:
    from flopcount.diffs.gate import GrowthReport
    from flopcount.diffs.result import Change, DiffResult

_NAMES = {"params": "Params", "count": "Calls", "macs": "MACs", "flops": "FLOPs", "bytes": "Bytes", "peak_memory": "Peak memory",
          "latency": "Latency", "latency_bound": "Latency bound"}


def _table(rows: Any, *, headers: Sequence[str], colalign: Sequence[str], tablefmt: str = "simple") -> str:
    """A table of cells that are already text: GitHub markdown written directly, each cell
    escaped (tabulate's type sniffing took 0.2 s on a 70B diff's rows), the text form through tabulate."""
    if tablefmt != "github":
        return text_table(rows, headers, colalign=colalign, disable_numparse=True)
    rule = {"left": ":---", "right": "---:"}
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(rule.get(a, "---") for a in colalign) + "|"]
    lines += ["| " + " | ".join(escape_markdown(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def show(metric: str, value: Optional[float]) -> str:
    """A value in its unit: counts with K/M/G, bytes in decimal units, latency as a time (s, ms, us)."""
    if value is None:
        return "-"
    if metric in ("bytes", "peak_memory"):
        return format_bytes(value)
    return format_seconds(value) if metric in ("latency", "latency_bound") else format_count(value)


def signed(metric: str, value: Optional[float]) -> str:
    """A change with its sign: ``+1.200 G``, ``-512``, ``0``."""
    if value is None:
        return "-"
    return "0" if value == 0 else ("+" if value > 0 else "-") + show(metric, abs(value))


def percent(row: Change, metric: str) -> str:
    """``+14.0%``; ``new`` for a cost from nothing; ``-`` when unknown or both 0."""
    rel = row.relative(metric)
    if rel is not None:
        return f"{100 * rel:+.1f}%" if rel else "0.0%"
    return "new" if row.delta(metric) else "-"


def _rows(rows: Sequence[Change]) -> List[List[str]]:
    """A module row (name, type, status, Δ params) or an operator row (name, status, Δ calls),
    then Δ MACs, FLOPs of A and of B, Δ FLOPs, Δ FLOPs % and Δ bytes."""
    out = []
    for row in rows:
        if row.kind == "module":
            name = (row.name or ROOT_LABEL) + (f" (x{row.repeats})" if row.repeats > 1 else "")
            cells = [name, row.type_name, row.status, signed("params", row.delta("params"))]
        else:
            cells = [row.name, row.status, signed("count", row.delta("count"))]
        cells += [
            signed("macs", row.delta("macs")),
            show("flops", row.before("flops") if row.a is not None else None), show("flops", row.after("flops") if row.b is not None else None),
            signed("flops", row.delta("flops")), percent(row, "flops"), signed("bytes", row.delta("bytes")),
        ]
        out.append(cells)
    return out


_MODULE_HEADERS = ["Module", "Type", "Status", "Δ Params", "Δ MACs", "FLOPs A", "FLOPs B", "Δ FLOPs", "Δ FLOPs %", "Δ Bytes"]
_MODULE_ALIGN = ("left", "left", "left", "right", "right", "right", "right", "right", "right", "right")


_OPERATOR_HEADERS = ["Operator", "Status", "Δ Calls", "Δ MACs", "FLOPs A", "FLOPs B", "Δ FLOPs", "Δ FLOPs %", "Δ Bytes"]
_OPERATOR_ALIGN = ("left", "left", "right", "right", "right", "right", "right", "right", "right")


def _totals_rows(diff: DiffResult) -> List[List[str]]:
    t = diff.totals
    return [[_NAMES[m], show(m, t.before(m)), show(m, t.after(m)), signed(m, t.delta(m)), percent(t, m)] for m in diff.metrics]


_TOTAL_HEADERS = ["Metric", "A", "B", "Δ", "Δ %"]
_TOTAL_ALIGN = ("left", "right", "right", "right", "right")


def summary_line(diff: DiffResult) -> str:
    """``FLOPs +14.0% (1.200 G -> 1.368 G) · params +2.100 M (+3.5%) · modules: 3 changed, 1 added, 0 removed``."""
    t = diff.totals
    counts = diff.counts()
    modules = f"modules: {counts['changed']} changed, {counts['added']} added, {counts['removed']} removed"
    if not t.changed and not (counts["added"] or counts["removed"] or counts["changed"]):
        return f"no cost change ({modules})"
    parts = []
    for metric in sorted(diff.metrics, key=lambda m: m != "flops"):
        delta = t.delta(metric)
        if metric == "flops":
            parts.append(f"FLOPs {percent(t, metric)} ({show(metric, t.before(metric))} -> {show(metric, t.after(metric))})")
        elif delta:
            parts.append(f"{_NAMES[metric]} {signed(metric, delta)} ({percent(t, metric)})")
    return " · ".join(parts + [modules])


def unlike_sides(diff: DiffResult) -> List[str]:
    """Why A and B may not be two versions of one workload: different models (the roots'
    types differ), different inputs; one line each (none when they are alike)."""
    notes = []
    roots = {change.status: change.type_name for change in diff.modules if change.name == ""}
    if "removed" in roots and "added" in roots:  # the roots' types differ: no module matches
        notes.append(f"A and B are different models ({roots['removed']} -> {roots['added']}): modules match by path and "
                     "type, so each of A's modules reads removed and each of B's added")
    if diff.a_inputs != diff.b_inputs:
        notes.append(f"inputs differ: A {diff.a_inputs or '()'}, B {diff.b_inputs or '()'}")
    return notes


def _bound_notes(diff: DiffResult) -> List[str]:
    """What the latency bound row is, or why there is none though a side holds one."""
    if diff.a_bound and diff.a_bound == diff.b_bound and diff.totals.before("latency_bound") is not None:
        return [f"latency bound: the {diff.a_bound} (count --on), a bound, not a measurement"]
    if diff.a_bound and diff.b_bound:
        return [f"latency bounds not compared: A's is the {diff.a_bound}, B's the {diff.b_bound}"]
    if diff.a_bound or diff.b_bound:
        side, basis = ("A", diff.a_bound) if diff.a_bound else ("B", diff.b_bound)
        return [f"latency bound: only {side}'s report holds one (the {basis}): count the other with the same --on"]
    return []


def _notes(diff: DiffResult) -> List[str]:
    notes = unlike_sides(diff)
    if diff.a_phases != diff.b_phases:
        notes.append(f"A counts {diff.a_phases}, B counts {diff.b_phases}: the totals differ in what they cover")
    notes += _bound_notes(diff)
    in_a, in_b = diff.respelled()
    if in_a or in_b:
        notes.append(f"operators: {' + '.join(in_a) or '-'} (A) and {' + '.join(in_b) or '-'} (B) are the same work spelled "
                     "two ways (equal MACs, FLOPs and bytes), not a change: a TorchScript program's linear runs below "
                     "Python, where it is counted as the t + addmm it becomes")
    for side, roots in (("A", diff.a_scripted), ("B", diff.b_scripted)):
        if roots:
            places = ", ".join(name or ROOT_LABEL for name in roots)
            notes.append(f"{side} runs {places} as TorchScript, whose submodules run without Python module hooks: their "
                         f"MACs, FLOPs and bytes are booked on {places}, so their rows compare params only ('-' where unknown)")
    for side, reasons in (("A", diff.a_incomplete), ("B", diff.b_incomplete)):
        if reasons:
            notes.append(f"INCOMPLETE: {side}'s count may be short: " + "; ".join(reasons[:3]) + (f" (+{len(reasons) - 3} more)" if len(reasons) > 3 else ""))
    return notes


@renders("DiffResult", "table")
def diff_table(diff: DiffResult, max_depth: Optional[int] = None, top: Optional[int] = None, operators: bool = True) -> str:
    """Totals, the changed modules (all, in module order; or the ``top`` largest changes),
    the changed operators, then the notes and the convention."""
    parts = [f"flopcount diff: A = {diff.a_label} -> B = {diff.b_label}", summary_line(diff), "",
             _table(_totals_rows(diff), headers=_TOTAL_HEADERS, colalign=_TOTAL_ALIGN)]
    rows = diff.top_changes(top, max_depth) if top is not None else diff.changed_modules(max_depth)
    if rows:
        title = f"Top {len(rows)} module changes" if top is not None else f"Changed modules ({len(rows)})"
        unchanged = diff.counts()["unchanged"]
        parts += ["", title + (f"; {unchanged} unchanged not shown" if unchanged and top is None else ""),
                  _table(_rows(rows), headers=_MODULE_HEADERS, colalign=_MODULE_ALIGN)]
    ops = [row for row in diff.operators if row.changed]
    if operators and ops:
        parts += ["", f"Changed operators ({len(ops)})", _table(_rows(ops), headers=_OPERATOR_HEADERS, colalign=_OPERATOR_ALIGN)]
    parts += [""] + _notes(diff) + ["Δ = B - A; " + CONVENTION]
    return "\n".join(parts)


#: the longest comment (and issue or pull-request body) GitHub accepts, in characters: a longer
#: one is refused ("Body is too long (maximum is 65536 characters)")
COMMENT_LIMIT = 65_536


@renders("DiffResult", "markdown")
def diff_markdown(diff: DiffResult, max_depth: Optional[int] = None, top: int = 10, limit: int = COMMENT_LIMIT) -> str:
    """A pull-request comment: heading, summary line, totals, the top changes, then every
    changed module and operator folded in ``<details>``; at most ``limit`` characters
    (GitHub's :data:`COMMENT_LIMIT`): the folded tables keep their first rows that fit and say
    how many more there are (a 70B model whose every layer changed has thousands)."""
    head = [
        f"### flopcount diff: {markdown_code(diff.a_label)} → {markdown_code(diff.b_label)}",
        f"**{escape_markdown(summary_line(diff))}**",
        _table(_totals_rows(diff), headers=_TOTAL_HEADERS, tablefmt="github", colalign=_TOTAL_ALIGN),
    ]
    best = diff.top_changes(top, max_depth)
    if best:
        head += [f"#### Top {len(best)} module changes",
                 _table(_rows(best), headers=_MODULE_HEADERS, tablefmt="github", colalign=_MODULE_ALIGN)]
    tail = [f"- {escape_markdown(n)}" for n in _notes(diff)]
    tail = (["\n".join(tail)] if tail else []) + [f"_Δ = B - A; {CONVENTION}_"]
    folded = [(title, _table(_rows(rows), headers=headers, tablefmt="github", colalign=align).split("\n"))
              for title, rows, headers, align in (
                  ("All changed modules", diff.changed_modules(max_depth), _MODULE_HEADERS, _MODULE_ALIGN),
                  ("Changed operators", [row for row in diff.operators if row.changed], _OPERATOR_HEADERS, _OPERATOR_ALIGN))
              if rows]
    whole = "\n\n".join(head + [_details(title, lines, len(lines) - 2) for title, lines in folded] + tail) + "\n"
    if len(whole) <= limit:
        return whole
    # too long: each folded table keeps the rows that fit in what the rest leaves (its frame, header
    # and a line saying how many more there are counted first), the shorter table served first (the
    # operators' few rows whole, the thousands of module rows cut)
    frames = [_details(title, lines[:2], len(lines) - 2) + _cut(len(lines) - 2, limit) for title, lines in folded]
    room = limit - len("\n\n".join(head + frames + tail) + "\n")
    shown = [0] * len(folded)
    for i in sorted(range(len(folded)), key=lambda i: len(folded[i][1])):
        for row in folded[i][1][2:]:
            if len(row) + 1 > room:
                break
            room -= len(row) + 1
            shown[i] += 1
    parts = list(head)
    for (title, lines), n in zip(folded, shown):
        rows = lines[2:]
        parts.append(_details(title, lines[:2] + rows[:n], len(rows)) + (_cut(len(rows) - n, limit) if n < len(rows) else ""))
    return "\n\n".join(parts + tail) + "\n"


def _details(title: str, lines: Sequence[str], rows: int) -> str:
    return f"<details><summary>{title} ({rows})</summary>\n\n" + "\n".join(lines) + "\n\n</details>"


def _cut(left_out: int, limit: int) -> str:
    return (f"\n\n_{left_out:,} more rows not shown: the comment is kept within {limit:,} characters (GitHub's limit); "
            "`flopcount diff --format table` (or `json`, `csv`) has every row._")


def _values(row: Change, metrics: Sequence[str]) -> Dict[str, Any]:
    return {
        "a": None if row.a is None else {m: row.a[m] for m in metrics if m in row.a},
        "b": None if row.b is None else {m: row.b[m] for m in metrics if m in row.b},
        "delta": {m: row.delta(m) for m in metrics},
        "relative": {m: row.relative(m) for m in metrics},
    }


@renders("DiffResult", "dict")
def diff_to_dict(diff: DiffResult, max_depth: Optional[int] = None) -> Dict[str, Any]:
    """Every row with both sides' values, B - A and (B - A) / A (keys in docs/api.md)."""
    metrics = diff.metrics
    return {
        "schema_version": REPORT_SCHEMA_VERSION,
        "kind": "diff",
        "convention": CONVENTION,
        "a": diff.a_label,
        "b": diff.b_label,
        **{key: getattr(diff, key) for key in ("a_inputs", "b_inputs", "a_phases", "b_phases", "a_bound", "b_bound")},
        **{key: list(getattr(diff, key)) for key in ("a_scripted", "b_scripted")},
        "metrics": list(metrics),
        "totals": {m: {"a": diff.totals.before(m), "b": diff.totals.after(m), "delta": diff.totals.delta(m),
                       "relative": diff.totals.relative(m)} for m in metrics},
        "summary": diff.counts(),
        "complete": diff.complete,
        "a_incomplete": list(diff.a_incomplete),
        "b_incomplete": list(diff.b_incomplete),
        "modules": [
            {"name": row.name, "type": row.type_name, "depth": row.depth, "status": row.status, **_values(row, MODULE_METRICS)}
            for row in diff.modules if max_depth is None or row.depth <= max_depth
        ],
        "operators": [{"name": row.name, "status": row.status, **_values(row, OPERATOR_METRICS)} for row in diff.operators],
    }


@renders("DiffResult", "csv")
def diff_to_csv(diff: DiffResult, max_depth: Optional[int] = None) -> str:
    """One row for the totals, one per module, one per operator: raw values of A, B and B - A."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["kind", "name", "type", "depth", "status"] + [f"{m}_{s}" for m in _NAMES for s in ("a", "b", "delta")])
    rows = [diff.totals] + [m for m in diff.modules if max_depth is None or m.depth <= max_depth] + list(diff.operators)
    for row in rows:
        present = {"total": diff.metrics, "module": MODULE_METRICS, "operator": OPERATOR_METRICS}[row.kind]
        cells: List[Any] = [row.kind, row.name, row.type_name, row.depth if row.kind == "module" else "", row.status]
        for m in _NAMES:  # A, B and B - A of each metric the row has; blank cells for the others
            values = (row.a.get(m) if row.a is not None else None, row.b.get(m) if row.b is not None else None, row.delta(m))
            cells += ["" if v is None or m not in present else v for v in values]
        writer.writerow(cells)
    return out.getvalue()


#: how the current value of a growth line reads: ``>= x`` can only be higher, ``~ x`` either way
_GROWTH_MARK = {"exact": "", "lower": ">= ", "estimate": "~ "}


@renders("GrowthReport", "table")
def growth_table(report: GrowthReport, fmt: str = "simple") -> str:
    """Metric, baseline, current, change, allowance and status per line."""
    rows = []
    for line in report.lines:
        metric = "peak_memory" if line.metric == "memory" else line.metric
        rel = line.relative
        if line.allowance.percent is not None:  # the change as the allowance reads, apart from it
            change = signed(metric, line.delta) + ("" if rel is None else f" ({line.growth_text()})")
        else:
            change = line.growth_text() + ("" if rel is None else f" ({100 * rel:+.2f}%)")
        rows.append([line.metric, show(metric, line.baseline), _GROWTH_MARK[line.bound] + show(metric, line.current),
                     change, str(line.allowance), str(line.status)])
    return _table(rows, headers=["Growth", "Baseline", "Current", "Change", "Allowed", "Status"], tablefmt=fmt,
                    colalign=("left", "right", "right", "right", "right", "left"))
