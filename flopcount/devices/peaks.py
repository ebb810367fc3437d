"""Moved to :mod:`flopcount.devices.parts` (the one table of datasheet parts). The old
names stay as thin views of that table: ``PEAK_TFLOPS[part][dtype]`` (dense TFLOP/s),
``BANDWIDTH_GBPS[part]``, ``match_gpu(name)`` (the part's name or None), ``peak_flops`` and
``bandwidth``. ``dtype_key`` no longer reads the host's TF32 flag: float32 is the FP32
column (the modeled device's math modes are arguments of :func:`flopcount.devices.named_roofs`)."""

from __future__ import annotations

from types import MappingProxyType
from typing import Mapping, Optional, Union

import torch

from flopcount.devices import parts as _parts
from flopcount.devices.parts import column_of
from flopcount.errors import UsageError

DTYPE_KEYS = _parts.DTYPE_COLUMNS

PEAK_TFLOPS: Mapping[str, Mapping[str, float]] = MappingProxyType(
    {name: MappingProxyType(dict(part.peaks_tflops)) for name, part in _parts.PARTS.items()}
)
BANDWIDTH_GBPS: Mapping[str, float] = MappingProxyType({name: part.memory_gbps for name, part in _parts.PARTS.items()})


def match_gpu(name: str) -> Optional[str]:
    """The part a device name names (exactly or by a documented alias), or None."""
    part = _parts.find_part(name)
    return None if part is None else part.name


def dtype_key(dtype: Union[None, str, torch.dtype]) -> str:
    """The peak column of a dtype (None: "float32")."""
    key = "float32" if dtype is None else column_of(dtype)
    if key not in DTYPE_KEYS:
        raise UsageError(f"no peak column for dtype {dtype!r}; known: {', '.join(DTYPE_KEYS)}")
    return key


def peak_flops(gpu_name: str, dtype: Union[None, str, torch.dtype] = None) -> Optional[float]:
    """Dense peak FLOP/s of the part at ``dtype``'s column, or None (unknown part or no such peak)."""
    part = _parts.find_part(gpu_name)
    if part is None:
        return None
    tflops = part.peaks_tflops.get(dtype_key(dtype))
    return None if tflops is None else tflops * 1e12


def bandwidth(gpu_name: str) -> Optional[float]:
    """Datasheet memory bandwidth in bytes/s, or None when the part is unknown."""
    part = _parts.find_part(gpu_name)
    return None if part is None else part.bandwidth
