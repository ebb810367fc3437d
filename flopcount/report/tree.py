"""A model printout annotated with costs."""

from __future__ import annotations

from typing import TYPE_CHECKING, List, Optional

from ..types import CONVENTION
from .units import format_count, format_share, with_unit

if TYPE_CHECKING:
    from ..results import FlopResult


def module_tree(result: FlopResult, max_depth: Optional[int] = None) -> str:
    """``Model(...)``-like tree: each line names a module and its params, MACs, FLOPs, share."""
    lines: List[str] = []
    total = result.flops
    for info in result.modules:
        if max_depth is not None and info.depth > max_depth:
            continue
        totals = result.module_totals(info.name)
        calls = f", {info.calls} calls" if info.calls > 1 else ""
        costs = (
            f"[{format_count(info.params)} params, {with_unit(totals.macs, 'MACs')}, "
            f"{with_unit(totals.flops, 'FLOPs')}, {format_share(totals.flops, total)}{calls}]"
        )
        label = f"({info.name.rsplit('.', 1)[-1]}): {info.type_name}" if info.name else info.type_name
        lines.append(f"{'  ' * info.depth}{label}  {costs}")
    lines.append(CONVENTION)
    if result.unsupported_details():
        lines.append("WARNING: ops without a handler were not counted: " + ", ".join(result.unsupported_ops()))
    return "\n".join(lines)

