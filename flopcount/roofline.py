"""The roofline model as plain data and arithmetic (no torch).

A :class:`Roofs` holds a device's peak FLOP/s per dtype and its memory bandwidth, and
says where they came from ("measured on this machine", "datasheet", "given"). The
time an op cannot beat is ``attainable_s = max(flops / peak, bytes / bandwidth)``; the
op is compute-bound when the first term is the larger, memory-bound otherwise; its
efficiency is ``attainable_s / measured_s`` (1.0 = at the roof).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Literal, Mapping, Optional

from .errors import UsageError

Bound = Literal["compute", "memory"]

#: How a profile's figures are made, printed under every profile report.
PROFILE_CONVENTION = (
    "time: self time of the op's whole call tree per step (device time on CUDA, CPU time on CPU); "
    "bytes: input tensors read + output tensors written (views 0); "
    "attainable = max(FLOPs / peak, bytes / bandwidth); efficiency = attainable / time."
)

#: dtype used when an op's dtype has no peak of its own (integer ops, bool masks, no tensor)
DEFAULT_DTYPE = "float32"


@dataclass(frozen=True)
class Roofs:
    """Peak FLOP/s per dtype name ("float32", "bfloat16"...) and bandwidth in bytes/s.

    ``source`` says where the figures come from ("measured", "datasheet", "given");
    ``device`` names the machine or GPU; ``details`` keeps how each figure was made.
    """

    peak_flops: Mapping[str, float]
    bandwidth: float
    device: str = ""
    source: str = "given"
    details: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.peak_flops:
            raise UsageError("Roofs need at least one peak FLOP/s (peak_flops={'float32': ...})")
        for dtype, value in self.peak_flops.items():
            if not (isinstance(value, (int, float)) and value > 0):
                raise UsageError(f"Roofs: peak_flops[{dtype!r}] must be > 0 FLOP/s, got {value!r}")
        if not (isinstance(self.bandwidth, (int, float)) and self.bandwidth > 0):
            raise UsageError(f"Roofs: bandwidth must be > 0 bytes/s, got {self.bandwidth!r}")

    def peak(self, dtype: Optional[str]) -> float:
        """Peak FLOP/s for ``dtype``: its own figure, else float32's, else the largest."""
        if dtype is not None and dtype in self.peak_flops:
            return float(self.peak_flops[dtype])
        if DEFAULT_DTYPE in self.peak_flops:
            return float(self.peak_flops[DEFAULT_DTYPE])
        return float(max(self.peak_flops.values()))

    @property
    def ridge(self) -> float:
        """FLOPs per byte where float32 compute and memory roofs meet."""
        return self.peak(DEFAULT_DTYPE) / self.bandwidth

    def describe(self) -> str:
        peaks = ", ".join(f"{k} {v / 1e9:.4g} GFLOP/s" for k, v in self.peak_flops.items())
        return f"{self.device or 'device'}: {peaks}; bandwidth {self.bandwidth / 1e9:.4g} GB/s ({self.source})"

    def to_dict(self) -> Dict[str, Any]:
        return {
            "device": self.device,
            "source": self.source,
            "peak_flops": dict(self.peak_flops),
            "bandwidth": self.bandwidth,
            "details": dict(self.details),
        }

    @staticmethod
    def from_dict(data: Mapping[str, Any]) -> Roofs:
        return Roofs(
            {str(k): float(v) for k, v in data["peak_flops"].items()},
            float(data["bandwidth"]),
            str(data.get("device", "")),
            str(data.get("source", "given")),
            dict(data.get("details", {})),
        )


def compute_time(flops: float, roofs: Roofs, dtype: Optional[str]) -> float:
    """Seconds the compute roof allows: ``flops / peak(dtype)``."""
    return flops / roofs.peak(dtype)


def memory_time(bytes_moved: float, roofs: Roofs) -> float:
    """Seconds the memory roof allows: ``bytes / bandwidth``."""
    return bytes_moved / roofs.bandwidth


def attainable(flops: float, bytes_moved: float, roofs: Roofs, dtype: Optional[str]) -> float:
    """``max(flops / peak, bytes / bandwidth)``: the fastest this work can run on ``roofs``."""
    return max(compute_time(flops, roofs, dtype), memory_time(bytes_moved, roofs))


def bound(compute_s: float, memory_s: float) -> Bound:
    """"compute" when the compute roof is the binding one (ties: compute), else "memory"."""
    return "compute" if compute_s >= memory_s else "memory"


def intensity(flops: float, bytes_moved: float) -> Optional[float]:
    """Arithmetic intensity in FLOPs per byte (None when no bytes move)."""
    return flops / bytes_moved if bytes_moved else None


def efficiency(attainable_s: float, measured_s: float) -> Optional[float]:
    """``attainable_s / measured_s`` (None without a measured time, or for work the roofs
    do not see: no FLOPs and no bytes)."""
    return attainable_s / measured_s if measured_s > 0 and attainable_s > 0 else None
