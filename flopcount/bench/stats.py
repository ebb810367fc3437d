"""Statistics of latency samples: a pure function from samples to :class:`LatencyStats`
(numpy does the arithmetic; no torch, no clock)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Sequence, Tuple

import numpy as np

from flopcount.core.deprecation import ms_aliases, ms_keys, warn_renamed
from flopcount.errors import UsageError

#: Relative spread (IQR / median) above which a measurement is called noisy.
NOISE_SPREAD = 0.10


@ms_aliases("median", "mean", "p90", "p99", "min", "max", "std", "iqr", "samples")
@dataclass(frozen=True)
class LatencyStats:
    """Summary of per-iteration latencies, in seconds (milliseconds only when rendered).

    Percentiles use linear interpolation between closest ranks (numpy's default
    ``method="linear"``: rank ``p/100 * (n-1)`` in the sorted samples); ``std_s`` is the
    sample standard deviation (``ddof=1``, 0 for one sample); ``cv = std / mean``;
    ``iqr_s = p75 - p25``; ``rel_iqr = iqr / median``, the robust spread used to
    call a run noisy (the CV is reported too, but one interrupt or GC pause inflates it).
    The 0.2 millisecond names (``median_ms``, ..., ``samples_ms``) are deprecated properties.
    """

    iters: int
    median_s: float
    mean_s: float
    p90_s: float
    p99_s: float
    min_s: float
    max_s: float
    std_s: float
    cv: float
    iqr_s: float
    rel_iqr: float
    samples_s: Tuple[float, ...] = field(default=(), repr=False)

    def is_noisy(self, threshold: float = NOISE_SPREAD) -> bool:
        """True when the robust relative spread (IQR / median) exceeds ``threshold``,
        the criterion ``torch.utils.benchmark`` warns on."""
        return self.rel_iqr > threshold

    def to_dict(self, samples: bool = False) -> Dict[str, Any]:
        """Seconds under ``*_s`` keys; the 0.2 ``*_ms`` keys (milliseconds) are kept beside
        them for one release (docs/migration.md)."""
        out: Dict[str, Any] = {"iters": self.iters, **{f"{name}_s": getattr(self, f"{name}_s") for name in _TIMES}}
        out.update(cv=self.cv, rel_iqr=self.rel_iqr, **ms_keys(self, _TIMES))
        if samples:
            out["samples_s"] = list(self.samples_s)
            out.update(ms_keys(self, ("samples",)))
        return out


#: the time fields of LatencyStats, by their stem
_TIMES = ("median", "mean", "p90", "p99", "min", "max", "std", "iqr")


def percentile(sorted_values: Sequence[float], p: float) -> float:
    """The ``p``-th percentile (0..100), linear interpolation between closest ranks
    (numpy's default method: rank ``p/100 * (n-1)``)."""
    if len(sorted_values) == 0:
        raise UsageError("percentile of no samples")
    if not 0.0 <= p <= 100.0:
        raise UsageError(f"percentile must be within 0..100, got {p}")
    return float(np.percentile(np.asarray(sorted_values, dtype=np.float64), p))


def compute_stats(samples_ms: Optional[Sequence[float]] = None, *, samples_s: Optional[Sequence[float]] = None) -> LatencyStats:
    """Statistics of per-iteration latencies in seconds (``samples_s=``); see
    :class:`LatencyStats` for the conventions. Pure: no torch, no clock. The 0.2 form,
    milliseconds as the first argument, is deprecated (it warns and is converted)."""
    if samples_ms is not None:
        if samples_s is not None:
            raise UsageError("compute_stats: give the samples once, as samples_s= (seconds)")
        warn_renamed("compute_stats(samples_ms)", "compute_stats(samples_s=...) in seconds")
        samples_s = [float(v) * 1e-3 for v in samples_ms]
    values = np.asarray(() if samples_s is None else samples_s, dtype=np.float64)
    n = int(values.size)
    if n == 0:
        raise UsageError("no latency samples to summarise")
    p25, median, p75, p90, p99 = (float(v) for v in np.percentile(values, [25.0, 50.0, 75.0, 90.0, 99.0]))
    mean = float(values.mean())
    std = float(values.std(ddof=1)) if n > 1 else 0.0
    iqr = p75 - p25
    return LatencyStats(
        iters=n,
        median_s=median,
        mean_s=mean,
        p90_s=p90,
        p99_s=p99,
        min_s=float(values.min()),
        max_s=float(values.max()),
        std_s=std,
        cv=std / mean if mean > 0 else 0.0,
        iqr_s=iqr,
        rel_iqr=iqr / median if median > 0 else 0.0,
        samples_s=tuple(float(v) for v in values),
    )
