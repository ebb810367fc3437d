"""Side path: timing. ``benchmark`` (latency of a forward), ``module_latency`` (per-module
times), ``StepTimer`` (training steps), the statistics behind them and the GPU peaks table."""

from __future__ import annotations

from flopcount.devices import peaks

from .latency import benchmark
from .loop import LoopPlan, run_iterations
from .modules import ModuleLatency, ModuleLatencyResult, module_latency
from .result import BenchmarkResult
from .stats import LatencyStats, compute_stats, percentile
from .steps import StepRecord, StepSummary, StepTimer

__all__ = [
    "BenchmarkResult",
    "LatencyStats",
    "LoopPlan",
    "ModuleLatency",
    "ModuleLatencyResult",
    "StepRecord",
    "StepSummary",
    "StepTimer",
    "benchmark",
    "compute_stats",
    "module_latency",
    "peaks",
    "percentile",
    "run_iterations",
]
