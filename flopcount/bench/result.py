"""What a benchmark returns: latency statistics plus what they were measured on, and the
rates derived from them. Plain data; its text is rendered by flopcount.report.bench, reached
through flopcount.core.rendering."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

from flopcount.bench.stats import NOISE_SPREAD, LatencyStats
from flopcount.core.deprecation import ms_aliases, ms_keys
from flopcount.core.diagnostics import FromWarnings
from flopcount.core.rendering import render


class _FromStats:
    """A read-only attribute answered by the result's ``stats`` under the same name."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, result: Any, owner: Optional[type] = None) -> Any:
        return self if result is None else getattr(result.stats, self.name)


#: ``BenchmarkResult.to_dict()``'s keys after the statistics, in order (``compile_ms`` between the two)
_CONTEXT = ("device", "timing", "warmup", "batch_size", "batch_source", "dtype", "compiled", "compile_s")
_RATES = ("wall_s", "throughput", "iters_per_s", "flops", "achieved_flops_per_s", "peak_flops", "peak_source", "mfu",
          "peak_memory_bytes", "memory_kind", "threads", "training", "noisy")


@ms_aliases("median", "mean", "p90", "p99", "min", "max", "std", "compile")
@dataclass(frozen=True)
class BenchmarkResult(FromWarnings):
    """One benchmark: latency statistics plus what they were measured on.

    ``throughput`` = ``batch_size`` / median latency (samples/s); ``iters_per_s`` =
    1 / median latency; ``achieved_flops_per_s`` = ``flops`` / median latency;
    ``mfu`` = achieved / ``peak_flops`` (dense peak, FLOP/s). ``peak_memory_bytes`` is
    CUDA ``max_memory_allocated`` over the timed region (absolute, model included) or,
    on CPU, the growth of the process RSS from before warm-up to after timing
    (``memory_kind`` says which). ``compile_s`` is the first (compiling) call of a
    ``compile=True`` run, excluded from the statistics. Times are in seconds (``median_s``,
    ...); the 0.2 millisecond names (``median_ms``, ..., ``compile_ms``) are deprecated
    properties, and ``to_dict()`` keeps their keys beside the ``_s`` ones for one release.
    """

    stats: LatencyStats
    device: str
    timing: str  # "cuda_event" or "perf_counter"
    warmup: int
    batch_size: int
    batch_source: Optional[str] = None  # "as given", "dim 0 of Tensor[8, 3, 224, 224]", ...
    dtype: Optional[str] = None
    compiled: bool = False
    compile_s: Optional[float] = None
    wall_s: float = 0.0
    flops: Optional[float] = None
    peak_flops: Optional[float] = None
    peak_source: Optional[str] = None
    peak_memory_bytes: Optional[int] = None
    memory_kind: Optional[str] = None
    threads: int = 0
    training: bool = False
    noise_threshold: float = NOISE_SPREAD
    warnings: Tuple[str, ...] = ()

    # -- statistics, delegated (seconds) ----------------------------------------------
    median_s = _FromStats()
    mean_s = _FromStats()
    p90_s = _FromStats()
    p99_s = _FromStats()
    min_s = _FromStats()
    max_s = _FromStats()
    std_s = _FromStats()
    cv = _FromStats()
    iters = _FromStats()

    @property
    def noisy(self) -> bool:
        return self.stats.is_noisy(self.noise_threshold)

    # -- derived rates ------------------------------------------------------------
    @property
    def iters_per_s(self) -> float:
        return 1.0 / self.median_s if self.median_s > 0 else math.inf

    @property
    def throughput(self) -> float:
        """Samples per second: batch size / median latency."""
        return self.batch_size * self.iters_per_s

    @property
    def achieved_flops_per_s(self) -> Optional[float]:
        return None if self.flops is None or self.median_s <= 0 else self.flops / self.median_s

    @property
    def mfu(self) -> Optional[float]:
        """Model FLOPs utilisation: achieved FLOP/s over the dense peak (0..1)."""
        achieved = self.achieved_flops_per_s
        return None if achieved is None or not self.peak_flops else achieved / self.peak_flops

    # -- rendering ------------------------------------------------------------------
    def to_dict(self, samples: bool = False) -> Dict[str, Any]:
        """Plain JSON-ready data: statistics, context and derived rates."""
        out = self.stats.to_dict(samples=samples)
        out.update({name: getattr(self, name) for name in _CONTEXT}, **ms_keys(self, ("compile",)),  # 0.2's key, one release
                   **{name: getattr(self, name) for name in _RATES}, warnings=list(self.warnings))
        return out

    def __str__(self) -> str:
        return render(self, "text")
