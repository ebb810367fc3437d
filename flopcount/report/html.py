"""A self-contained HTML report (``--format html``): the summary, the budget / latency /
memory sections a command has, the module table, the operator table, the module tree and
the plot inline as a base64 PNG. No scripts, no stylesheets or fonts from the network: the
file opens the same offline. The plot needs the optional matplotlib; without it the report
says so and carries everything else."""

from __future__ import annotations

import base64
import html
from typing import TYPE_CHECKING, List, Optional, Sequence, Tuple

from flopcount.errors import UsageError
from flopcount.report.table import operator_table
from flopcount.types import CONVENTION
from flopcount.units import format_count, with_unit

if TYPE_CHECKING:
    from flopcount.budget.check import BudgetReport
    from flopcount.core.results import FlopResult

_STYLE = """
body { font-family: system-ui, -apple-system, Segoe UI, Helvetica, Arial, sans-serif; margin: 2em auto;
       max-width: 1100px; color: #222; padding: 0 1em; }
h1 { font-size: 1.4em; margin-bottom: 0.2em; } h2 { font-size: 1.1em; margin-top: 1.8em; }
.summary { color: #444; } .note { color: #8a5a00; }
pre { background: #f6f8fa; padding: 0.8em; overflow-x: auto; font-size: 0.85em; line-height: 1.35; }
img { max-width: 100%; border: 1px solid #ddd; }
table { border-collapse: collapse; } td, th { padding: 2px 8px; border-bottom: 1px solid #ddd; text-align: right; }
td:first-child { text-align: left; }
.PASS { color: #2e7d32; font-weight: bold; } .FAIL { color: #c0392b; font-weight: bold; } .INCOMPLETE, .UNDECIDED { color: #b7791f; font-weight: bold; }
"""


def page(title: str, body: Sequence[str]) -> str:
    """A self-contained page: ``title`` as its title and heading, then the ``body`` HTML parts."""
    head = f'<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title><style>{_STYLE}</style></head><body>'
    return "\n".join(["<!DOCTYPE html>", head, f"<h1>{html.escape(title)}</h1>", *body, "</body></html>"])


def _pre(text: str) -> str:
    return f"<pre>{html.escape(text)}</pre>"


def html_report(
    result: FlopResult,
    *,
    entry: str,
    depth: Optional[int] = None,
    sections: Sequence[Tuple[str, str]] = (),
    budget: Optional[BudgetReport] = None,
    latencies_ms: Optional[Sequence[float]] = None,
) -> str:
    """One HTML page. ``sections``: ``(heading, preformatted text)`` pairs shown first (the
    budget table, the latency summary, ...); ``budget`` and ``latencies_ms`` add their panels
    to the plot."""
    title = f"flopcount: {entry}"
    summary = (f"{with_unit(result.flops, 'FLOPs')}, {with_unit(result.macs, 'MACs')}, "
               f"{format_count(result.params)} params; inputs {result.input_description or '()'}; tracer {result.tracer}")
    parts: List[str] = [
        f'<p class="summary">{html.escape(summary)}</p>',
        f'<p class="summary">{html.escape(CONVENTION)}</p>',
    ]
    if budget is not None:
        verdict = str(budget.status)
        parts.append(f'<p>Budgets: <span class="{verdict}">{verdict}</span></p>')
    if not result.complete:
        reasons = "; ".join(result.incomplete_reasons())
        parts.append(f'<p class="note">INCOMPLETE: the count may be short: {html.escape(reasons)}</p>')
    for heading, text in sections:
        parts += [f"<h2>{html.escape(heading)}</h2>", _pre(text)]
    parts += ["<h2>Plot</h2>", _plot(result, entry, depth, budget, latencies_ms)]
    parts += ["<h2>FLOPs by module</h2>", _pre(result.table(max_depth=depth))]
    parts += ["<h2>By operator</h2>", _pre(operator_table(result, fmt="simple", footer=False))]
    parts += ["<h2>Module tree</h2>", _pre(result.tree(max_depth=depth))]
    return page(title, parts)


def _plot(result: FlopResult, entry: str, depth: Optional[int],
          budget: Optional[BudgetReport], latencies_ms: Optional[Sequence[float]]) -> str:
    from flopcount.report.plot import png_bytes

    try:
        data = png_bytes(result, depth=depth, title=entry, latencies_ms=latencies_ms, budget=budget)
    except UsageError as exc:  # no matplotlib: the report stands without its picture
        return f'<p class="note">{html.escape(str(exc))}</p>'
    encoded = base64.b64encode(data).decode("ascii")
    return f'<img alt="FLOPs by module of {html.escape(entry)}" src="data:image/png;base64,{encoded}">'
