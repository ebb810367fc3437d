"""Renderers of a device's roofs (:class:`flopcount.devices.Roofs`): a table of compute
roofs per dtype and bandwidth per memory level, with where the figures came from."""

from __future__ import annotations

import json
from typing import Any, List

from tabulate import tabulate

from flopcount.core.rendering import renders
from flopcount.devices.roofline import FAMILIES, FAMILY_NAMES, doubts_text
from flopcount.units import format_bytes


def _rate(value: float, unit: str) -> str:
    """``989.5 TFLOP/s`` / ``23.04 GFLOP/s``: tera above 10^12, giga below."""
    return f"{value / 1e12:,.4g} T{unit}" if value >= 1e12 else f"{value / 1e9:,.4g} G{unit}"


@renders("Roofs", "table")
def roofs_table(roofs: Any, fmt: str = "simple") -> str:
    isa = roofs.details.get("isa_peak_flops") or {}  # this machine's: a column of ceilings
    compute = [[dtype, _rate(value, "FLOP/s"), *([_rate(isa[dtype], "FLOP/s") if isa.get(dtype) else ""] if isa else [])]
               for dtype, value in roofs.peak_flops.items()]
    memory = [
        [level.name, "unbounded" if level.capacity is None else format_bytes(level.capacity),
         "not published" if level.bandwidth is None else _rate(level.bandwidth, "B/s")]
        for level in roofs.all_levels()
    ]
    heads = ["dtype", "compute roof"] + (["ISA peak (ceiling)"] if isa else [])
    lines: List[str] = [f"{roofs.device or 'device'} ({roofs.source})", "", tabulate(compute, headers=heads, tablefmt=fmt), "",
                        tabulate(memory, headers=["memory level", "working set", "bandwidth"], tablefmt=fmt)]
    for family, column in roofs.float32_math(FAMILIES).items():
        # tfloat32x3 is derived (a third of the TF32 peak), no row of the table: its rate is said here
        rate = _rate(roofs.column_rate(column) or 0.0, "FLOP/s")
        lines.append(f"float32 {FAMILY_NAMES[family]} priced at the {column} peak ({rate})")
    keys = ("isa_formula", "measured_at", "load", "threads", "how", "not_cached", "raised_to_achieved")
    lines += [f"{key}: {roofs.details[key]}" for key in keys if key in roofs.details]
    lines += [f"{key}: {value}" for key, value in roofs.details.items() if key.startswith(("compute_", "bandwidth"))]
    if roofs.doubts:
        lines.append(f"A bound on these roofs is {doubts_text(roofs.doubts)}: rates below what this machine does "
                     "(count --on, check --on, profile and serve mark each figure on them ~)")
    return "\n".join(lines) + "\n"


@renders("Roofs", "json")
def roofs_json(roofs: Any) -> str:
    return json.dumps(roofs.to_dict(), indent=2, default=str)
