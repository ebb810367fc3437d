"""A model printout annotated with costs."""

from __future__ import annotations

from typing import TYPE_CHECKING, List, Optional

from flopcount.core.rendering import renders
from flopcount.report.notes import note_lines
from flopcount.report.table import module_rows
from flopcount.types import CONVENTION
from flopcount.units import format_count, format_share, with_unit

if TYPE_CHECKING:
    from flopcount.core.results import FlopResult


@renders("FlopResult", "tree")
def module_tree(result: FlopResult, max_depth: Optional[int] = None) -> str:
    """``Model(...)``-like tree: each line names a module and its params, MACs, FLOPs, share;
    then what the totals cover (the phases), the convention and every note."""
    lines: List[str] = []
    total = result.flops
    for info, totals in module_rows(result, max_depth):
        calls = f", {info.calls} calls" if info.calls > 1 else ""
        costs = (
            f"[{format_count(info.params)} params, {with_unit(totals.macs, 'MACs')}, "
            f"{with_unit(totals.flops, 'FLOPs')}, {format_share(totals.flops, total)}{calls}]"
        )
        label = f"({info.name.rsplit('.', 1)[-1]}): {info.type_name}" if info.name else info.type_name
        lines.append(f"{'  ' * info.depth}{label}  {costs}")
    phases = result.by_phase()
    if len(phases) > 1:
        macs = result.by_phase("macs")
        split = ", ".join(f"{p} {with_unit(f, 'FLOPs')} ({with_unit(macs[p], 'MACs')})" for p, f in phases.items())
        lines.append(f"Costs above are {' + '.join(phases)}: {split}")
    lines.append(CONVENTION)
    lines.extend(note_lines(result))
    return "\n".join(lines)
