"""Roofs of a datasheet part under the modeled device's math modes (plain data, no torch)."""

from __future__ import annotations

from typing import Optional

from flopcount.devices.parts import MathModes, Part, resolve_part
from flopcount.devices.roofline import MemoryLevel, Roofs


def part_roofs(part: Part, modes: Optional[MathModes] = None) -> Roofs:
    """``part``'s dense peaks, its L2 (bandwidth only where published) and HBM bandwidth;
    float32 convolutions and RNN layers priced at TF32 and matmuls at FP32 unless ``modes``
    say otherwise (attention: ``Roofs.column``)."""
    modes = modes or MathModes()
    levels = (MemoryLevel("L2", part.l2_bytes, None if part.l2_gbps is None else part.l2_gbps * 1e9),) if part.l2_bytes else ()
    details = {
        "part": part.name, "datasheet": part.source, "memory_bytes": part.memory_bytes, "links": list(part.links),
        "conv_tf32": modes.conv_tf32, "matmul_tf32": modes.matmul_tf32,
    }
    return Roofs(part.peak_flops, part.bandwidth, part.name, f"datasheet ({part.source})", details, levels, modes.math(part))


def datasheet_roofs(name: str, *, conv_tf32: bool = MathModes.conv_tf32, matmul_tf32: bool = MathModes.matmul_tf32) -> Roofs:
    """Roofs of the part ``name`` names (exactly or by a documented alias; an unknown name
    is an error listing the parts). ``Roofs.device`` echoes the part used."""
    return part_roofs(resolve_part(name), MathModes(conv_tf32, matmul_tf32))
