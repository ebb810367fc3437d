"""Side path: timing. ``benchmark`` (latency of a forward), ``module_latency`` (per-module
times), ``StepTimer`` (training steps), the statistics behind them and the GPU peaks table."""

from __future__ import annotations

from flopcount.core.deprecation import module_getattr
from flopcount.devices import peaks

from .latency import benchmark
from .loop import LoopPlan, run_iterations
from .modules import ModuleLatency, ModuleLatencyResult, module_latency
from .result import BenchmarkResult
from .stats import LatencyStats, compute_stats, percentile
from .steps import StepSummary, StepTimer, StepTiming

__all__ = [
    "BenchmarkResult",
    "LatencyStats",
    "LoopPlan",
    "ModuleLatency",
    "ModuleLatencyResult",
    "StepSummary",
    "StepTimer",
    "StepTiming",
    "benchmark",
    "compute_stats",
    "module_latency",
    "peaks",
    "percentile",
    "run_iterations",
]


# 0.2's name of StepTiming (two public-facing classes were called StepRecord)
__getattr__ = module_getattr(__name__, {"StepRecord": ("flopcount.bench.StepTiming", lambda: StepTiming)})
