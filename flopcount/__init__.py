"""flopcount: FLOPs, MACs, parameters and latency of PyTorch models, per operator and per module.

Convention: 1 MAC = 2 FLOPs; MACs count contraction ops (matmul, linear, conv, attention).

Names load on first use (PEP 562), so ``import flopcount`` and the CLI's ``--help`` do not
import torch until something needs it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Dict, Tuple

__version__ = "0.2.0"

# public name -> the module that defines it
_EXPORTS: Dict[str, str] = {
    "count_flops": "counting",
    "count_generation": "generation",
    "GenerationResult": "generation",
    "FlopResult": "core.results",
    "load_report": "core.results",
    "diff": "diffs",
    "DiffResult": "diffs",
    "GrowthReport": "diffs",
    "OpTotals": "core.results",
    "UnsupportedOp": "core.results",
    "Cost": "types",
    "OpCall": "types",
    "TensorMeta": "types",
    "ParamSummary": "types",
    "summarize_parameters": "core.params",
    "HandlerRegistry": "core.registry",
    "default_registry": "handlers",
    "register_handler": "handlers",
    "FlopcountError": "errors",
    "FlopcountWarning": "errors",
    "HandlerError": "errors",
    "TraceError": "errors",
    "UnsupportedOpError": "errors",
    "UsageError": "errors",
    "UnsupportedOpsWarning": "errors",
    "Status": "types",
    "Diagnostic": "types",
    "benchmark": "bench",
    "BenchmarkResult": "bench",
    "LatencyStats": "bench",
    "compute_stats": "bench",
    "module_latency": "bench",
    "ModuleLatency": "bench",
    "ModuleLatencyResult": "bench",
    "StepTimer": "bench",
    "StepTiming": "bench",
    "StepSummary": "bench",
    "peaks": "devices.peaks",
    "Budget": "budget",
    "BudgetReport": "budget",
    "check_budget": "budget",
    "check_result": "budget",
    "load_budget_file": "budget",
    "parse_quantity": "budget",
    "parse_bytes": "budget",
    "estimate_memory": "memory",
    "MemoryEstimate": "memory",
    "profile": "profiling",
    "ProfileResult": "profiling",
    "predict": "profiling",
    "PredictResult": "profiling",
    "Roofs": "devices.roofline",
    "plan": "planning",
    "PlanResult": "planning",
    "serve": "serving",
    "ServeResult": "serving",
}

__all__ = [
    "BenchmarkResult",
    "Budget",
    "BudgetReport",
    "Cost",
    "Diagnostic",
    "DiffResult",
    "FlopResult",
    "FlopcountError",
    "FlopcountWarning",
    "GenerationResult",
    "GrowthReport",
    "HandlerError",
    "HandlerRegistry",
    "LatencyStats",
    "MemoryEstimate",
    "ModuleLatency",
    "ModuleLatencyResult",
    "OpCall",
    "OpTotals",
    "PlanResult",
    "ParamSummary",
    "PredictResult",
    "ProfileResult",
    "Roofs",
    "ServeResult",
    "StepSummary",
    "Status",
    "StepTimer",
    "StepTiming",
    "TensorMeta",
    "TraceError",
    "UnsupportedOp",
    "UnsupportedOpError",
    "UnsupportedOpsWarning",
    "UsageError",
    "benchmark",
    "check_budget",
    "check_result",
    "compute_stats",
    "count_flops",
    "count_generation",
    "default_registry",
    "diff",
    "estimate_memory",
    "load_budget_file",
    "load_report",
    "module_latency",
    "parse_bytes",
    "parse_quantity",
    "peaks",
    "predict",
    "profile",
    "plan",
    "register_handler",
    "serve",
    "summarize_parameters",
]

if TYPE_CHECKING:
    from .bench import (
        BenchmarkResult,
        LatencyStats,
        ModuleLatency,
        ModuleLatencyResult,
        StepSummary,
        StepTimer,
        StepTiming,
        benchmark,
        compute_stats,
        module_latency,
        peaks,
    )
    from .budget import Budget, BudgetReport, check_budget, check_result, load_budget_file, parse_bytes, parse_quantity
    from .core.params import summarize_parameters
    from .core.registry import HandlerRegistry
    from .core.results import FlopResult, OpTotals, UnsupportedOp, load_report
    from .counting import count_flops
    from .devices.roofline import Roofs
    from .diffs import DiffResult, GrowthReport, diff
    from .errors import (
        FlopcountError,
        FlopcountWarning,
        HandlerError,
        TraceError,
        UnsupportedOpError,
        UnsupportedOpsWarning,
        UsageError,
    )
    from .generation import GenerationResult, count_generation
    from .handlers import default_registry, register_handler
    from .memory import MemoryEstimate, estimate_memory
    from .planning import PlanResult, plan
    from .profiling import PredictResult, ProfileResult, predict, profile
    from .serving import ServeResult, serve
    from .types import Cost, Diagnostic, OpCall, ParamSummary, Status, TensorMeta


#: 0.2 names kept for one release: name -> (its new spelling, the module that defines it, the
#: name there). Each access warns (DeprecationWarning) and is never cached; docs/migration.md.
_DEPRECATED: Dict[str, Tuple[str, str, str]] = {
    "StepRecord": ("flopcount.StepTiming", "bench.steps", "StepTiming"),
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None and name in _DEPRECATED:
        import warnings

        new, where, attr = _DEPRECATED[name]
        warnings.warn(f"flopcount.{name} is deprecated and will be removed in flopcount 0.4; use {new}",
                      DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module(f".{where}", __name__), attr)
    if module is None:
        raise AttributeError(f"module 'flopcount' has no attribute {name!r}")
    loaded = importlib.import_module(f".{module}", __name__)
    value = loaded if module.endswith("." + name) else getattr(loaded, name)
    globals()[name] = value
    return value


def __dir__() -> Any:
    return sorted(set(globals()) | set(_EXPORTS))
