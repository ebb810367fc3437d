"""Tables (via tabulate) of a FlopResult: per module and per operator."""

from __future__ import annotations

import unicodedata
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Optional, Sequence, Tuple

import tabulate as _tabulate
from tabulate import tabulate

from flopcount.core.rendering import renders
from flopcount.report.notes import note_lines
from flopcount.types import CONVENTION
from flopcount.units import ROOT_LABEL, SIZE_UNITS, escape_markdown, format_bytes, format_count, format_share, with_unit

if TYPE_CHECKING:
    from flopcount.core.results import FlopResult, ModuleInfo, Totals


#: a private-use character, written after each wide character while tabulate lays a table out
#: (it counts one column a character) and removed from the table it returns
_SECOND_COLUMN = "\ue000"

#: where the stand-ins for characters with zero-width marks start (Unicode plane 15, private use:
#: one column each for tabulate)
_STAND_INS = 0xF0000
_STAND_IN_COUNT = 0xFFFE

#: general categories a terminal shows in no column of their own: nonspacing and enclosing marks
#: (U+0301 COMBINING ACUTE ACCENT, U+20DD ENCLOSING CIRCLE), format characters (U+200B ZERO
#: WIDTH SPACE, U+200D ZERO WIDTH JOINER); not the spacing marks (Mc: a Devanagari vowel sign
#: takes its column), nor U+00AD SOFT HYPHEN (format, but shown as a hyphen)
_ZERO_WIDTH = frozenset({"Mn", "Me", "Cf"})
_SHOWN_FORMAT = "\u00ad"


def _zero_width(ch: str) -> bool:
    return unicodedata.category(ch) in _ZERO_WIDTH and ch != _SHOWN_FORMAT


def _widened(cell: Any, stand_ins: Optional[Dict[str, str]] = None) -> Any:
    """``cell`` as tabulate should measure it: :data:`_SECOND_COLUMN` after each character a
    terminal shows two columns wide (Unicode East Asian Width W or F: CJK, fullwidth forms, emoji),
    and each character with the zero-width characters after it (``e`` + U+0301: one column, ``é``)
    replaced by a one-column stand-in recorded in ``stand_ins`` (text -> stand-in); other cells as
    they are."""
    if not isinstance(cell, str) or cell.isascii():
        return cell
    out: List[str] = []
    for glyph in _glyphs(cell):
        if len(glyph) > 1 and stand_ins is not None and len(stand_ins) < _STAND_IN_COUNT:
            out.append(stand_ins.setdefault(glyph, chr(_STAND_INS + len(stand_ins))))
        else:
            out.append(glyph)
        visible = next((ch for ch in glyph if not _zero_width(ch)), None)
        if visible is not None and unicodedata.east_asian_width(visible) in ("W", "F"):
            out.append(_SECOND_COLUMN)
    return "".join(out)


def _glyphs(text: str) -> Iterator[str]:
    """``text`` cut into glyphs: a character with the zero-width characters after it (those before
    the first visible character go with it)."""
    glyph, visible = "", False
    for ch in text:
        zero = _zero_width(ch)
        if visible and not zero:
            yield glyph
            glyph, visible = "", False
        glyph += ch
        visible = visible or not zero
    if glyph:
        yield glyph


def text_table(rows: Sequence[Sequence[Any]], headers: Sequence[str], **options: Any) -> str:
    """``tabulate(rows, headers, **options)`` with each character counted as the columns a terminal
    gives it (a module named ``层`` or ``🚀``: two; a combining accent: none), so rows stay aligned;
    tabulate counts them so itself only with the optional ``wcwidth`` installed (then the table is
    its own)."""
    if getattr(_tabulate, "wcwidth", None) is not None and getattr(_tabulate, "WIDE_CHARS_MODE", False):
        return tabulate(rows, headers=headers, **options)
    stand_ins: Dict[str, str] = {}
    widened = [[_widened(cell, stand_ins) for cell in row] for row in rows]
    table = tabulate(widened, headers=[_widened(h, stand_ins) for h in headers], **options).replace(_SECOND_COLUMN, "")
    for glyph, stand_in in stand_ins.items():
        table = table.replace(stand_in, glyph)
    return table


def grid(rows: Sequence[Sequence[Any]], headers: Sequence[str], fmt: str = "simple", align: Optional[Sequence[str]] = None,
         **options: Any) -> str:
    """The one table of the reports: ``rows`` under ``headers`` in tabulate's ``fmt`` (``align``: each
    column's), every cell escaped in a GitHub markdown table (``|`` would end the cell)."""
    if fmt == "github":
        rows = [[escape_markdown(cell) for cell in row] for row in rows]
    return text_table(rows, headers, tablefmt=fmt, colalign=align, **options)


def module_rows(result: FlopResult, max_depth: Optional[int] = None) -> Iterator[Tuple[ModuleInfo, Totals]]:
    """Each module down to ``max_depth`` (all without it) with its sums, children included."""
    return ((info, result._module_sums(info.name)) for info in result.modules if max_depth is None or info.depth <= max_depth)


def phases_label(result: FlopResult) -> str:
    """``"forward"``, ``"forward + backward"`` or ``"forward + backward + optimizer"``: what the totals cover."""
    return " + ".join(result.by_phase()) or "forward"


_SHORT = {"forward": "fwd", "backward": "bwd", "optimizer": "opt"}


def phases_short(result: FlopResult) -> str:
    """The phases for a column header: ``"fwd+bwd"``, ``"fwd+bwd+opt"``."""
    return "+".join(_SHORT.get(phase, phase) for phase in result.by_phase()) or "fwd"


def _footer(result: FlopResult) -> List[str]:
    size = result.parameters
    covered = phases_label(result)
    active = "" if size.active is None else f"{format_count(size.active)} active per token, "
    lines = [
        f"Total{'' if covered == 'forward' else f' ({covered})'}: {with_unit(result.flops, 'FLOPs')}, {with_unit(result.macs, 'MACs')}, "
        f"{format_count(result.params)} params ({active}{format_count(size.trainable)} trainable), "
        f"weights {format_bytes(size.size_bytes)} (params + buffers, {SIZE_UNITS}); tracer: {result.tracer}; "
        f"inputs: {result.input_description}",
        CONVENTION,
    ]
    timing = result.benchmark
    if timing is not None:
        achieved = timing.achieved_flops_per_s
        lines.append(
            f"Measured: median {timing.median_s * 1e3:.3f} ms (p90 {timing.p90_s * 1e3:.3f} ms, CV {100 * timing.cv:.1f}%, "
            f"{timing.iters} iters), {timing.throughput:.1f} samples/s"
            + (f", {with_unit(achieved, 'FLOP/s')} achieved" if achieved else "")
        )
    return lines


def _finish(body: str, result: FlopResult, fmt: str, footer: bool = True) -> str:
    """The table, then (with ``footer``) the totals and convention, then every note."""
    lines = _footer(result) if footer else []
    notes = note_lines(result, markdown=fmt == "github")
    if fmt == "github":
        parts = [body]
        if lines:
            parts.append("\n".join(f"_{line}_" if i else f"**{escape_markdown(line)}**" for i, line in enumerate(lines)))
        if notes:
            parts.append("\n".join(notes))
        return "\n\n".join(parts) + "\n"
    return "\n".join([body, *lines, *notes])


def phase_table(result: FlopResult, fmt: str = "simple") -> str:
    """Rows per phase (forward, backward) and their total: MACs, FLOPs, share."""
    macs = result.by_phase("macs")
    flops = result.by_phase()
    rows: List[List[Any]] = [
        [phase, format_count(macs[phase]), format_count(flops[phase]), format_share(flops[phase], result.flops)] for phase in flops
    ]
    rows.append([f"total ({phases_label(result)})", format_count(result.macs), format_count(result.flops), format_share(result.flops, result.flops)])
    return grid(rows, ["Phase", "MACs", "FLOPs", "FLOPs %"], fmt, ("left", "right", "right", "right"))


@renders("FlopResult", "table")
def module_table(
    result: FlopResult, max_depth: Optional[int] = None, *, show_zero: bool = True, fmt: str = "simple"
) -> str:
    """One row per module down to ``max_depth`` (the whole model is depth 0); with a
    backward pass, a second table gives each phase's share."""
    rows = []
    total = result.flops
    for info, totals in module_rows(result, max_depth):
        if not show_zero and info.name and totals.flops == 0 and info.params == 0:
            continue
        rows.append(
            [
                info.name or ROOT_LABEL,
                info.type_name,
                format_count(info.params),
                format_count(totals.macs),
                format_count(totals.flops),
                format_share(totals.flops, total),
            ]
        )
    phases = len(result.by_phase()) > 1
    short = f" ({phases_short(result)})" if phases else ""  # the module rows sum every phase: say so in the headers
    headers = ["Module", "Type", "Params", f"MACs{short}", f"FLOPs{short}", "FLOPs %"]
    body = grid(rows, headers, fmt, ("left", "left", "right", "right", "right", "right"))
    if phases:
        body += "\n\n" + phase_table(result, fmt)
    return _finish(body, result, fmt)


@renders("FlopResult", "operator_table")
def operator_table(result: FlopResult, fmt: str = "simple", *, footer: bool = True) -> str:
    """One row per aten operator with calls, MACs, FLOPs and share; unsupported ops last;
    ``footer=False`` leaves out the totals lines and notes (when a module table above shows them)."""
    total = result.flops
    rows: List[List[Any]] = [
        [op, t.calls, format_count(t.macs), format_count(t.flops), format_share(t.flops, total)]
        for op, t in result.operator_totals().items()
    ]
    rows += [[f"{u.op} (no handler)", u.count, "?", "?", "-"] for u in result.unsupported_details()]
    body = grid(rows, ["Operator", "Calls", "MACs", "FLOPs", "FLOPs %"], fmt, ("left", "right", "right", "right", "right"))
    return _finish(body, result, fmt) if footer else body
