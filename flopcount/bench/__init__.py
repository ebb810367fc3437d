"""Side path: timing. ``benchmark`` (latency of a forward), ``module_latency`` (per-module
times), ``StepTimer`` (training steps), the statistics behind them and the GPU peaks table."""

from __future__ import annotations

from flopcount.bench.latency import benchmark
from flopcount.bench.loop import LoopPlan, run_iterations
from flopcount.bench.modules import ModuleLatency, ModuleLatencyResult, module_latency
from flopcount.bench.result import BenchmarkResult
from flopcount.bench.stats import LatencyStats, compute_stats, percentile
from flopcount.bench.steps import StepSummary, StepTimer, StepTiming
from flopcount.core.deprecation import module_getattr
from flopcount.devices import peaks

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
