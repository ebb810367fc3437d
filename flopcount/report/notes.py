"""What a report must say besides its numbers: why a count may be short, and every
warning of the result (tracer, fallback, benchmark). Shared by every text report."""

from __future__ import annotations

from typing import TYPE_CHECKING, List, Tuple

if TYPE_CHECKING:
    from ..results import FlopResult


def incomplete_lines(result: FlopResult) -> Tuple[str, ...]:
    """One sentence per reason the count may be short: each op without a handler (with
    where it ran), then each gap a tracer reported."""
    reasons = []
    for u in result.unsupported_details():
        where = ", ".join(m or "<root>" for m in u.modules[:3]) + (", ..." if len(u.modules) > 3 else "")
        reasons.append(f"{u.op} ran {u.count}x without a handler and is NOT counted (in {where})")
    return tuple(reasons) + tuple(result.gaps)


def other_warnings(result: FlopResult) -> Tuple[str, ...]:
    """The result's warnings that are not already a reason it is incomplete, then the
    benchmark's warnings, each once, in order."""
    seen = set(result.gaps)
    out: List[str] = []
    timing = result.benchmark
    for text in tuple(result.warnings) + tuple(getattr(timing, "warnings", ()) or ()):
        if text not in seen:
            seen.add(text)
            out.append(text)
    return tuple(out)


def note_lines(result: FlopResult, *, markdown: bool = False) -> List[str]:
    """Lines for the foot of a text report: an INCOMPLETE heading with one line per
    reason, then ``warning: ...`` lines. Empty when the count is complete and clean."""
    lines: List[str] = []
    reasons = incomplete_lines(result)
    if reasons:
        heading = f"INCOMPLETE: the count may be short ({len(reasons)} reason(s)); the totals are what could be counted:"
        lines.append(f"**{heading}**" if markdown else heading)
        lines.extend(f"- {_md(r)}" if markdown else f"  - {r}" for r in reasons)
    for text in other_warnings(result):
        lines.append(f"- warning: {_md(text)}" if markdown else f"warning: {text}")
    return lines


def _md(text: str) -> str:
    """Plain text inside markdown: ``_``, ``*`` and ``|`` would start emphasis or end a
    cell, and ``<root>`` would be read as an HTML tag."""
    for char in ("\\", "*", "_", "|"):
        text = text.replace(char, "\\" + char)
    return text.replace("<", "&lt;").replace(">", "&gt;")
