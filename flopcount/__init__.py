"""flopcount: FLOPs, MACs, parameters and latency of PyTorch models, per operator and per module.

Convention: 1 MAC = 2 FLOPs; MACs count contraction ops (matmul, linear, conv, attention).

Names load on first use (PEP 562), so ``import flopcount`` and the CLI's ``--help`` do not
import torch until something needs it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Callable, Dict, Tuple

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
    "EstimatedBoundWarning": "errors",
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
    from flopcount.bench import BenchmarkResult as BenchmarkResult
    from flopcount.bench import LatencyStats as LatencyStats
    from flopcount.bench import ModuleLatency as ModuleLatency
    from flopcount.bench import ModuleLatencyResult as ModuleLatencyResult
    from flopcount.bench import StepSummary as StepSummary
    from flopcount.bench import StepTimer as StepTimer
    from flopcount.bench import StepTiming as StepTiming
    from flopcount.bench import benchmark as benchmark
    from flopcount.bench import compute_stats as compute_stats
    from flopcount.bench import module_latency as module_latency
    from flopcount.bench import peaks as peaks
    from flopcount.budget import Budget as Budget
    from flopcount.budget import BudgetReport as BudgetReport
    from flopcount.budget import check_budget as check_budget
    from flopcount.budget import check_result as check_result
    from flopcount.budget import load_budget_file as load_budget_file
    from flopcount.budget import parse_bytes as parse_bytes
    from flopcount.budget import parse_quantity as parse_quantity
    from flopcount.core.params import summarize_parameters as summarize_parameters
    from flopcount.core.registry import HandlerRegistry as HandlerRegistry
    from flopcount.core.results import FlopResult as FlopResult
    from flopcount.core.results import UnsupportedOp as UnsupportedOp
    from flopcount.core.results import load_report as load_report
    from flopcount.counting import count_flops as count_flops
    from flopcount.devices.roofline import Roofs as Roofs
    from flopcount.diffs import DiffResult as DiffResult
    from flopcount.diffs import GrowthReport as GrowthReport
    from flopcount.diffs import diff as diff
    from flopcount.errors import EstimatedBoundWarning as EstimatedBoundWarning
    from flopcount.errors import FlopcountError as FlopcountError
    from flopcount.errors import FlopcountWarning as FlopcountWarning
    from flopcount.errors import HandlerError as HandlerError
    from flopcount.errors import TraceError as TraceError
    from flopcount.errors import UnsupportedOpError as UnsupportedOpError
    from flopcount.errors import UnsupportedOpsWarning as UnsupportedOpsWarning
    from flopcount.errors import UsageError as UsageError
    from flopcount.generation import GenerationResult as GenerationResult
    from flopcount.generation import count_generation as count_generation
    from flopcount.handlers import default_registry as default_registry
    from flopcount.handlers import register_handler as register_handler
    from flopcount.memory import MemoryEstimate as MemoryEstimate
    from flopcount.memory import estimate_memory as estimate_memory
    from flopcount.planning import PlanResult as PlanResult
    from flopcount.planning import plan as plan
    from flopcount.profiling import PredictResult as PredictResult
    from flopcount.profiling import ProfileResult as ProfileResult
    from flopcount.profiling import predict as predict
    from flopcount.profiling import profile as profile
    from flopcount.serving import ServeResult as ServeResult
    from flopcount.serving import serve as serve
    from flopcount.types import Cost as Cost
    from flopcount.types import Diagnostic as Diagnostic
    from flopcount.types import OpCall as OpCall
    from flopcount.types import ParamSummary as ParamSummary
    from flopcount.types import Status as Status
    from flopcount.types import TensorMeta as TensorMeta


#: 0.2 names kept for one release: name -> (its new spelling, a loader of what it names). Each
#: access warns (DeprecationWarning) and is never cached; docs/migration.md.
_DEPRECATED: Dict[str, Tuple[str, Callable[[], Any]]] = {
    "StepRecord": ("flopcount.StepTiming", lambda: importlib.import_module("flopcount.bench.steps").StepTiming),
    "OpTotals": ("flopcount.core.rows.CostRow", lambda: importlib.import_module("flopcount.core.rows").CostRow),
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:  # a 0.2 name (warns), else AttributeError
        from flopcount.core.deprecation import module_getattr

        return module_getattr(__name__, _DEPRECATED, stacklevel=4)(name)  # 4: the caller of this __getattr__
    loaded = importlib.import_module(f"flopcount.{module}")
    value = loaded if module.endswith("." + name) else getattr(loaded, name)
    globals()[name] = value
    return value


def __dir__() -> Any:
    """The public API: ``__all__`` (loaded or not) and ``__version__``; the typing names and
    the submodules this file imports or loads are not API."""
    return sorted(set(__all__) | {"__version__"})
