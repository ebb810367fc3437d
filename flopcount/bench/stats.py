"""Statistics of latency samples: a pure function from samples to :class:`LatencyStats`
(numpy does the arithmetic; no torch, no clock)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Sequence, Tuple

import numpy as np

from ..errors import UsageError

#: Relative spread (IQR / median) above which a measurement is called noisy.
NOISE_SPREAD = 0.10


@dataclass(frozen=True)
class LatencyStats:
    """Summary of per-iteration latencies, in milliseconds.

    Percentiles use linear interpolation between closest ranks (numpy's default
    ``method="linear"``: rank ``p/100 * (n-1)`` in the sorted samples); ``std_ms`` is the
    sample standard deviation (``ddof=1``, 0 for one sample); ``cv = std / mean``;
    ``iqr_ms = p75 - p25``; ``rel_iqr = iqr / median``, the robust spread used to
    call a run noisy (the CV is reported too, but one interrupt or GC pause inflates it).
    """

    iters: int
    median_ms: float
    mean_ms: float
    p90_ms: float
    p99_ms: float
    min_ms: float
    max_ms: float
    std_ms: float
    cv: float
    iqr_ms: float
    rel_iqr: float
    samples_ms: Tuple[float, ...] = field(default=(), repr=False)

    def is_noisy(self, threshold: float = NOISE_SPREAD) -> bool:
        """True when the robust relative spread (IQR / median) exceeds ``threshold``,
        the criterion ``torch.utils.benchmark`` warns on."""
        return self.rel_iqr > threshold

    def to_dict(self, samples: bool = False) -> Dict[str, Any]:
        out: Dict[str, Any] = {
            "iters": self.iters,
            "median_ms": self.median_ms,
            "mean_ms": self.mean_ms,
            "p90_ms": self.p90_ms,
            "p99_ms": self.p99_ms,
            "min_ms": self.min_ms,
            "max_ms": self.max_ms,
            "std_ms": self.std_ms,
            "cv": self.cv,
            "iqr_ms": self.iqr_ms,
            "rel_iqr": self.rel_iqr,
        }
        if samples:
            out["samples_ms"] = list(self.samples_ms)
        return out


def percentile(sorted_values: Sequence[float], p: float) -> float:
    """The ``p``-th percentile (0..100), linear interpolation between closest ranks
    (numpy's default method: rank ``p/100 * (n-1)``)."""
    if len(sorted_values) == 0:
        raise UsageError("percentile of no samples")
    if not 0.0 <= p <= 100.0:
        raise UsageError(f"percentile must be within 0..100, got {p}")
    return float(np.percentile(np.asarray(sorted_values, dtype=np.float64), p))


def compute_stats(samples_ms: Sequence[float]) -> LatencyStats:
    """Statistics of per-iteration latencies (ms); see :class:`LatencyStats` for the
    conventions. Pure: no torch, no clock."""
    values = np.asarray(samples_ms, dtype=np.float64)
    n = int(values.size)
    if n == 0:
        raise UsageError("no latency samples to summarise")
    p25, median, p75, p90, p99 = (float(v) for v in np.percentile(values, [25.0, 50.0, 75.0, 90.0, 99.0]))
    mean = float(values.mean())
    std = float(values.std(ddof=1)) if n > 1 else 0.0
    iqr = p75 - p25
    return LatencyStats(
        iters=n,
        median_ms=median,
        mean_ms=mean,
        p90_ms=p90,
        p99_ms=p99,
        min_ms=float(values.min()),
        max_ms=float(values.max()),
        std_ms=std,
        cv=std / mean if mean > 0 else 0.0,
        iqr_ms=iqr,
        rel_iqr=iqr / median if median > 0 else 0.0,
        samples_ms=tuple(float(v) for v in values),
    )
