"""Text and markdown for a :class:`flopcount.planning.result.PlanResult` (pure functions)."""

from __future__ import annotations

from typing import TYPE_CHECKING, List, Optional, Tuple

from flopcount.core.rendering import renders
from flopcount.report.table import grid
from flopcount.units import format_bytes, format_count, format_seconds

if TYPE_CHECKING:
    from flopcount.planning.result import PlanResult


def _percent(value: Optional[float]) -> str:
    return "-" if value is None else f"{value * 100:.1f}%"


def _rate(tokens: int, seconds: Optional[float]) -> str:
    return "-" if not tokens or not seconds else format_count(tokens / seconds)


def _sections(result: PlanResult) -> List[Tuple[str, List[str], List[List[str]]]]:
    phases = [[p, format_count(result.flops[p]), format_count(result.macs.get(p, 0))] for p in result.flops]
    phases.append(["total (HFU's FLOPs)", format_count(result.total_flops), format_count(sum(result.macs.values()))])
    if result.model_flops is not None:
        phases.append(["model FLOPs (MFU's: 3 x forward of the model as written / tp; with frozen parameters at most the rank's FLOPs)", format_count(result.model_flops), ""])
    memory = [[name, format_bytes(value)] for name, value in result.memory.items() if value]
    memory.append(["peak (MemTracker)", format_bytes(result.peak_bytes)])
    state = [[name, format_bytes(value)] for name, value in result.state_bytes.items()]
    comm = [
        [r.kind, r.dim, str(r.group_size), str(r.calls), format_bytes(r.tensor_bytes), format_bytes(r.wire_bytes), format_seconds(r.seconds)]
        for r in result.comm
    ]
    sections = [
        ("compute per rank (1 MAC = 2 FLOPs)", ["phase", "FLOPs", "MACs"], phases),
        ("memory of rank 0 at its peak", ["category", "bytes"], memory),
        ("state held by each rank", ["tensor", "bytes"], state),
        ("communication per rank (ring)", ["collective", "mesh dim", "ranks", "calls", "tensor bytes", "wire bytes", "time"], comm),
    ]
    bounds = result.step_time
    if bounds is not None:
        rows = [
            ["compute (roofline)", format_seconds(bounds.compute_s), "", "", ""],
            ["communication", format_seconds(bounds.comm_s), "", "", ""],
            ["no overlap", format_seconds(bounds.no_overlap_s), _percent(bounds.mfu_no_overlap), _percent(bounds.hfu_no_overlap),
             _rate(result.tokens, bounds.no_overlap_s)],
            ["perfect overlap", format_seconds(bounds.overlap_s), _percent(bounds.mfu_overlap), _percent(bounds.hfu_overlap),
             _rate(result.tokens, bounds.overlap_s)],
        ]
        headers = ["bound", "time", "MFU", "HFU", "tokens/s per rank"]
        sections.append((f"step time on {result.on} ({result.dtype})", headers, rows))
    return sections


def _header(result: PlanResult) -> str:
    blocks = f"; FSDP2 on {result.wrapped_blocks} blocks of '{result.blocks}' + root" if result.wrapped_blocks else ""
    return (f"plan: fsdp={result.fsdp} x tp={result.tp} = {result.world_size} ranks, rank 0, one training step{blocks}; "
            f"{result.backend} collectives")


def _batch(result: PlanResult) -> List[str]:
    return [f"micro-batch per rank: {result.inputs}"] if result.inputs else []


@renders("PlanResult", "table")
def plan_table(result: PlanResult, markdown: bool = False) -> str:
    """The header, each section's table, the notes; ``markdown``: as a GitHub comment."""
    parts = [f"**{_header(result)}**" if markdown else _header(result), *(f"\n{line}" if markdown else line for line in _batch(result))]
    for title, headers, rows in _sections(result):
        if rows:
            heading = f"\n*{title}*\n\n" if markdown else f"\n{title}\n"
            parts.append(heading + grid(rows, headers, "github" if markdown else "simple", disable_numparse=True))
    parts.extend(f"\n> note: {note}" if markdown else f"note: {note}" for note in result.notes)
    return "\n".join(parts)


@renders("PlanResult", "markdown")
def plan_markdown(result: PlanResult) -> str:
    return plan_table(result, markdown=True)
