"""The peak an MFU is measured against: one resolver for ``benchmark``, ``StepTimer`` and the
trainer callbacks (``integrations._rates.resolve_peak`` words its absence); and the model
FLOPs it divides (:func:`model_flops`: the trainer callbacks' and ``plan``'s)."""

from __future__ import annotations

from typing import Any, Optional, Tuple, Union

import torch

from flopcount.devices import peaks
from flopcount.devices.parts import resolve_part
from flopcount.errors import UsageError


def model_flops(forward: int, hardware: int, frozen: bool) -> int:
    """Model FLOPs of a training step: PaLM's 3 x its ``forward`` FLOPs (a matmul's backward is
    twice its forward; torchtitan's MFU), which assumes every parameter is trained. With
    ``frozen`` parameters (a frozen backbone under a trainable head, adapters) the step computes
    fewer gradients than that: at most the ``hardware`` FLOPs it ran (forward, backward with any
    recomputation, optimizer step), so such a step's MFU never exceeds its HFU (plan printed an
    MFU of 299 % at its step-time bound for a frozen 2048-wide backbone)."""
    return min(3 * forward, hardware) if frozen else 3 * forward


def has_frozen(model: Any) -> bool:
    """Whether a floating parameter of ``model`` does not require grad (frozen)."""
    return any(not p.requires_grad for p in model.parameters() if p.is_floating_point())


def checked_peak(peak_flops: Optional[float]) -> Optional[float]:
    """``peak_flops`` (FLOP/s) as given, None included; a value not above 0 is a UsageError."""
    if peak_flops is not None and not peak_flops > 0:
        raise UsageError(f"peak_flops must be a positive FLOP/s figure, got {peak_flops!r}")
    return peak_flops


def mfu_part(owner: str, on: Optional[str], peak_flops: Optional[float]) -> Optional[str]:
    """``on=`` of a timer or a trainer callback (``StepTimer``, ``FlopcountCallback``,
    ``FlopcountMonitor``), checked when it is made: the name of a known part (an unknown one is a
    UsageError listing the parts), never beside ``peak_flops``; None without ``on``."""
    if on is None:
        return None
    if peak_flops is not None:
        raise UsageError(f"{owner}: give the MFU's peak once: peak_flops={peak_flops!r} or on={on!r}")
    return resolve_part(str(on)).name


def mfu_peak(dev: torch.device, dtype: Union[None, str, torch.dtype], peak_flops: Optional[float], on: Optional[str]) -> Tuple[Optional[float], Optional[str]]:
    """The MFU denominator and where it came from: ``peak_flops`` as given, else the dense datasheet
    peak of the part ``on`` (default: the CUDA device's name) at ``dtype``; none on the CPU. The one
    resolver of the modeled peak: benchmark, StepTimer and the trainer callbacks call it."""
    given = checked_peak(peak_flops)
    if given is not None:
        return float(given), "given"
    name = on
    if name is None and dev.type == "cuda":
        name = torch.cuda.get_device_name(dev)
    value = None if name is None else peaks.peak_flops(name, dtype)
    if name is None or value is None:
        return None, None
    return value, f"{peaks.match_gpu(name)} {peaks.dtype_key(dtype)} dense, flopcount.peaks"
