"""What a report must say besides its numbers: why a count may be short, every warning of
the result (tracer, fallback, benchmark), and that a figure on roofs measured under load is an
estimate, not a bound. Shared by every text report."""

from __future__ import annotations

from typing import TYPE_CHECKING, List, Tuple

from flopcount.devices.roofline import ESTIMATE_MARK, Roofs, doubts_text
from flopcount.units import ROOT_LABEL

if TYPE_CHECKING:
    from flopcount.core.results import FlopResult


def incomplete_lines(result: FlopResult) -> Tuple[str, ...]:
    """One sentence per reason the count may be short, from the result's typed diagnostics:
    each op without a handler (with where it ran), then each gap a tracer reported."""
    reasons = []
    for d in result.diagnostics():
        if d.kind == "unsupported":
            where = ", ".join(m or ROOT_LABEL for m in d.modules[:3]) + (", ..." if len(d.modules) > 3 else "")
            reasons.append(f"{d.op} ran {d.count}x without a handler and is NOT counted (in {where})")
        elif d.kind == "gap":
            reasons.append(d.text)
    return tuple(reasons)


def other_warnings(result: FlopResult) -> Tuple[str, ...]:
    """The result's diagnostics that do not make it incomplete (estimates, warnings), then
    the benchmark's warnings, each once, in order."""
    out = [d.text for d in result.diagnostics() if not d.makes_incomplete]
    seen = set(out) | set(result.gaps)
    return tuple(out + [text for text in dict.fromkeys(getattr(result.benchmark, "warnings", ()) or ()) if text not in seen])


def note_lines(result: FlopResult, *, markdown: bool = False) -> List[str]:
    """Lines for the foot of a text report: an INCOMPLETE heading with one line per
    reason, then ``warning: ...`` lines. Empty when the count is complete and clean."""
    lines: List[str] = []
    reasons = incomplete_lines(result)
    if reasons:
        heading = f"INCOMPLETE: the count may be short ({len(reasons)} reason(s)); the totals are what could be counted:"
        lines.append(f"**{heading}**" if markdown else heading)
        lines.extend(f"- {_md(r)}" if markdown else f"  - {r}" for r in reasons)
    lines.extend(f"- warning: {_md(text)}" if markdown else f"warning: {text}" for text in other_warnings(result))
    return lines


def _md(text: str) -> str:
    """Plain text inside markdown: ``_``, ``*`` and ``|`` would start emphasis or end a
    cell, and ``<`` would open an HTML tag."""
    for char in ("\\", "*", "_", "|"):
        text = text.replace(char, "\\" + char)
    return text.replace("<", "&lt;").replace(">", "&gt;")


def estimate_line(roofs: Roofs) -> str:
    """The line a report on ``roofs`` with doubts prints with its figures ("" without doubts):
    what the ``~`` beside a figure means, and why."""
    if roofs.certain:
        return ""
    return (f"{ESTIMATE_MARK} marks {doubts_text(roofs.doubts)}: rates below what this machine does, so a real run "
            "can be faster than such a figure (measure the roofs again when the load is below the cores: "
            "flopcount roofs --remeasure)")


def marked(text: str, roofs: Roofs) -> str:
    """``text`` (a figure) with the estimate mark before it where ``roofs`` have doubts."""
    return text if roofs.certain else f"{ESTIMATE_MARK} {text}"
