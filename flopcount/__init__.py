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

#: the public names: one list, read by ``from flopcount import *``, ``dir()`` and the docs; the
#: imports below make each a typed re-export (``import X as X``) for mypy and pyright
__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:
    from .bench import BenchmarkResult as BenchmarkResult
    from .bench import LatencyStats as LatencyStats
    from .bench import ModuleLatency as ModuleLatency
    from .bench import ModuleLatencyResult as ModuleLatencyResult
    from .bench import StepSummary as StepSummary
    from .bench import StepTimer as StepTimer
    from .bench import StepTiming as StepTiming
    from .bench import benchmark as benchmark
    from .bench import compute_stats as compute_stats
    from .bench import module_latency as module_latency
    from .bench import peaks as peaks
    from .budget import Budget as Budget
    from .budget import BudgetReport as BudgetReport
    from .budget import check_budget as check_budget
    from .budget import check_result as check_result
    from .budget import load_budget_file as load_budget_file
    from .budget import parse_bytes as parse_bytes
    from .budget import parse_quantity as parse_quantity
    from .core.params import summarize_parameters as summarize_parameters
    from .core.registry import HandlerRegistry as HandlerRegistry
    from .core.results import FlopResult as FlopResult
    from .core.results import OpTotals as OpTotals
    from .core.results import UnsupportedOp as UnsupportedOp
    from .core.results import load_report as load_report
    from .counting import count_flops as count_flops
    from .devices.roofline import Roofs as Roofs
    from .diffs import DiffResult as DiffResult
    from .diffs import GrowthReport as GrowthReport
    from .diffs import diff as diff
    from .errors import FlopcountError as FlopcountError
    from .errors import FlopcountWarning as FlopcountWarning
    from .errors import HandlerError as HandlerError
    from .errors import TraceError as TraceError
    from .errors import UnsupportedOpError as UnsupportedOpError
    from .errors import UnsupportedOpsWarning as UnsupportedOpsWarning
    from .errors import UsageError as UsageError
    from .generation import GenerationResult as GenerationResult
    from .generation import count_generation as count_generation
    from .handlers import default_registry as default_registry
    from .handlers import register_handler as register_handler
    from .memory import MemoryEstimate as MemoryEstimate
    from .memory import estimate_memory as estimate_memory
    from .planning import PlanResult as PlanResult
    from .planning import plan as plan
    from .profiling import PredictResult as PredictResult
    from .profiling import ProfileResult as ProfileResult
    from .profiling import predict as predict
    from .profiling import profile as profile
    from .serving import ServeResult as ServeResult
    from .serving import serve as serve
    from .types import Cost as Cost
    from .types import Diagnostic as Diagnostic
    from .types import OpCall as OpCall
    from .types import ParamSummary as ParamSummary
    from .types import Status as Status
    from .types import TensorMeta as TensorMeta


#: 0.2 names kept for one release: name -> (its new spelling, the module that defines it, the
#: name there). Each access warns (DeprecationWarning) and is never cached; docs/migration.md.
_DEPRECATED: Dict[str, Tuple[str, str, str]] = {
    "StepRecord": ("flopcount.StepTiming", "bench.steps", "StepTiming"),
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None and name in _DEPRECATED:
        from flopcount.core.deprecation import warn_renamed

        new, where, attr = _DEPRECATED[name]
        warn_renamed(f"flopcount.{name}", new)
        return getattr(importlib.import_module(f".{where}", __name__), attr)
    if module is None:
        raise AttributeError(f"module 'flopcount' has no attribute {name!r}")
    loaded = importlib.import_module(f".{module}", __name__)
    value = loaded if module.endswith("." + name) else getattr(loaded, name)
    globals()[name] = value
    return value


def __dir__() -> Any:
    return sorted(set(globals()) | set(_EXPORTS))
