"""ONE device model: named datasheet parts (:mod:`.parts`), this machine's measured roofs
(:mod:`.measured`, with the CPU's ISA peak and caches from :mod:`.cpu`) and the one
roofline function (:mod:`.roofline`). Every reading that bounds time (predict, profile,
plan, ``check --on``, the trainer integrations' peak) asks here; nothing else divides
FLOPs by a peak.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional, Union

from flopcount.devices.datasheet import datasheet_roofs, part_roofs
from flopcount.devices.parts import (
    LINKS,
    PARTS,
    MathModes,
    Part,
    column_of,
    find_part,
    known_names,
    part_hint,
    resolve_part,
)
from flopcount.devices.roofline import (
    BOUND_KINDS,
    AnyBound,
    Bound,
    BoundKind,
    MemoryLevel,
    OpTime,
    Roofs,
    any_implementation,
    op_time,
)
from flopcount.errors import UsageError

#: names that mean the roofs measured on this machine (its CPU)
THIS_MACHINE = ("this machine", "this-machine", "this cpu", "this-cpu", "local", "cpu", "here")
#: names that mean the roofs measured on this machine's current CUDA GPU
THIS_GPU = ("this gpu", "this-gpu", "gpu", "cuda")

__all__ = [
    "BOUND_KINDS", "LINKS", "PARTS", "THIS_MACHINE", "AnyBound", "Bound", "BoundKind", "MathModes", "MemoryLevel",
    "OpTime", "Part", "Roofs", "THIS_GPU", "any_implementation", "gpu_ceiling", "column_of", "datasheet_roofs", "default_bound", "find_part",
    "is_this_machine", "known_names", "named_roofs", "op_time", "part_hint", "part_roofs", "resolve_part",
    "roofs_for",
]


def is_this_machine(name: str) -> bool:
    return name.strip().lower() in THIS_MACHINE


def named_roofs(name: str, *, conv_tf32: bool = MathModes.conv_tf32, matmul_tf32: bool = MathModes.matmul_tf32) -> Roofs:
    """Roofs for a device name: a datasheet part ("h100", "H100 NVL", "A100 40GB PCIe",
    "NVIDIA A100-SXM4-80GB"...; the result's ``device`` echoes the part) under the given math
    modes, or "this machine" (measured here, seconds, unless ``$XDG_CACHE_HOME/flopcount/roofs.json``
    holds sane roofs for this machine; written there after measuring unless
    ``FLOPCOUNT_NO_ROOFS_CACHE=1``), or "this gpu" (the same, measured on the current CUDA
    GPU; "this machine" is the CPU). A datasheet part measures and writes nothing."""
    if not isinstance(name, str):
        raise UsageError(f"on must be a part name ('h100', 't4', 'this machine'...) or a Roofs, got {name!r}")
    if is_this_machine(name):
        from flopcount.devices.measured import machine_roofs

        return machine_roofs("cpu")
    if name.strip().lower() in THIS_GPU:
        import torch

        from flopcount.devices.measured import machine_roofs

        if not torch.cuda.is_available():
            raise UsageError(f"{name!r} means this machine's CUDA GPU, and torch sees none here; name a part "
                             "('h100', 'l4'...) to model one, or 'this machine' for this CPU")
        dev = torch.device("cuda", torch.cuda.current_device())
        measured = machine_roofs(dev)
        part = find_part(torch.cuda.get_device_name(dev))
        return measured if part is None else gpu_ceiling(measured, part_roofs(part, MathModes(conv_tf32=conv_tf32, matmul_tf32=matmul_tf32)))
    return datasheet_roofs(name, conv_tf32=conv_tf32, matmul_tf32=matmul_tf32)


def gpu_ceiling(measured: Roofs, sheet: Roofs) -> Roofs:
    """A GPU's measured roofs as a bound: each rate raised to the datasheet's where that is
    higher, with the datasheet's math modes (cuDNN's TF32 convolutions) and memory levels. A
    rate our own kernels reached is beaten by tuned ones: on an H200 an 8192^3 bfloat16 GEMM
    ran 2.3 % above the measured bfloat16 roof and a DRAM-bound elementwise chain 4.3 % above
    the measured bandwidth (docs/performance.md, "On a GPU"), so a bound on the raw measurement
    was no bound."""
    peaks = {**sheet.peak_flops, **{dtype: max(rate, sheet.peak_flops.get(dtype, 0.0)) for dtype, rate in measured.peak_flops.items()}}
    ceiling = f"each rate the higher of the measured one and the {sheet.device} datasheet's (tuned kernels beat a measured GPU rate)"
    details = {**measured.details, "ceiling": ceiling, "datasheet": sheet.to_dict()}
    # a rate measured under load is raised to the datasheet's like any other; one the datasheet
    # lacks stays as measured, and so do the doubts about it
    doubts = measured.doubts if any(dtype not in sheet.peak_flops for dtype in measured.peak_flops) else ()
    return Roofs(peaks, max(measured.bandwidth, sheet.bandwidth), measured.device, "measured, datasheet ceiling",
                 details, sheet.levels or measured.levels, sheet.math, doubts)


def default_bound(roofs: Roofs) -> BoundKind:
    """Which bound ``check --on`` holds a budget to unless told: the eager per-op sum on this
    machine (the program flopcount would run here), the any-implementation bound on a
    datasheet part (the user may run any engine there)."""
    return "any" if roofs.source.startswith("datasheet") else "eager"


def roofs_for(device: Any, given: Optional[Roofs] = None) -> Roofs:
    """The roofs a profile on ``device`` uses: ``given`` (nothing measured or written), else
    this machine's from ``$XDG_CACHE_HOME/flopcount/roofs.json``, measured and written there when
    missing (not with ``FLOPCOUNT_NO_ROOFS_CACHE=1``). On CUDA the datasheet figures are kept in
    ``details`` as the second source."""
    import torch

    from flopcount.devices.measured import machine_roofs

    if given is not None:
        return given
    dev: Union[torch.device, Any] = torch.device(device)
    measured = machine_roofs(dev)
    if dev.type != "cuda":
        return measured
    part = find_part(torch.cuda.get_device_name(dev))
    if part is None:
        return measured
    return dataclasses.replace(measured, details={**measured.details, "datasheet": part_roofs(part).to_dict()})
