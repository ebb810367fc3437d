"""Tables (via tabulate) of a FlopResult: per module and per operator."""

from __future__ import annotations

from typing import TYPE_CHECKING, List, Optional

from tabulate import tabulate

from ..types import CONVENTION
from .units import format_bytes, format_count, format_share, with_unit

if TYPE_CHECKING:
    from ..results import FlopResult


def _footer(result: FlopResult) -> List[str]:
    size = result.parameters
    active = "" if size.active is None else f"{format_count(size.active)} active per token, "
    lines = [
        f"Total: {with_unit(result.flops, 'FLOPs')}, {with_unit(result.macs, 'MACs')}, "
        f"{format_count(result.params)} params ({active}{format_count(size.trainable)} trainable), "
        f"weights {format_bytes(size.size_bytes)}; tracer: {result.tracer}; inputs: {result.input_description}",
        CONVENTION,
    ]
    timing = result.benchmark
    if timing is not None:
        achieved = timing.achieved_flops_per_s
        lines.append(
            f"Measured: median {timing.median_ms:.3f} ms (p90 {timing.p90_ms:.3f} ms, CV {100 * timing.cv:.1f}%, "
            f"{timing.iters} iters), {timing.throughput:.1f} samples/s"
            + (f", {with_unit(achieved, 'FLOP/s')} achieved" if achieved else "")
        )
    unsupported = result.unsupported_details()
    if unsupported:
        parts = []
        for u in unsupported:
            where = ", ".join(m or "<root>" for m in u.modules[:3]) + (", ..." if len(u.modules) > 3 else "")
            parts.append(f"{u.op} x{u.count} (in {where})")
        lines.append(
            f"WARNING: {len(unsupported)} op type(s) ran without a handler and are NOT counted: " + "; ".join(parts)
        )
    return lines


def module_table(
    result: FlopResult, max_depth: Optional[int] = None, *, show_zero: bool = True, fmt: str = "simple"
) -> str:
    """One row per module down to ``max_depth`` (the whole model is depth 0)."""
    rows = []
    total = result.flops
    for info in result.modules:
        if max_depth is not None and info.depth > max_depth:
            continue
        totals = result.module_totals(info.name)
        if not show_zero and info.name and totals.flops == 0 and info.params == 0:
            continue
        rows.append(
            [
                info.name or "(model)",
                info.type_name,
                format_count(info.params),
                format_count(totals.macs),
                format_count(totals.flops),
                format_share(totals.flops, total),
            ]
        )
    headers = ["Module", "Type", "Params", "MACs", "FLOPs", "FLOPs %"]
    body = tabulate(rows, headers=headers, tablefmt=fmt, colalign=("left", "left", "right", "right", "right", "right"))
    footer = _footer(result)
    if fmt == "github":
        return body + "\n\n" + "\n".join(f"_{line}_" if i else f"**{line}**" for i, line in enumerate(footer)) + "\n"
    return body + "\n" + "\n".join(footer)


def operator_table(result: FlopResult, fmt: str = "simple", *, footer: bool = True) -> str:
    """One row per aten operator with calls, MACs, FLOPs and share; unsupported ops last;
    ``footer=False`` leaves out the totals lines (when a module table above shows them)."""
    total = result.flops
    rows = [
        [op, t.count, format_count(t.macs), format_count(t.flops), format_share(t.flops, total)]
        for op, t in result.operator_totals().items()
    ]
    rows += [[f"{u.op} (no handler)", u.count, "?", "?", "-"] for u in result.unsupported_details()]
    body = tabulate(
        rows,
        headers=["Operator", "Calls", "MACs", "FLOPs", "FLOPs %"],
        tablefmt=fmt,
        colalign=("left", "right", "right", "right", "right"),
    )
    return body + "\n" + "\n".join(_footer(result)) if footer else body
