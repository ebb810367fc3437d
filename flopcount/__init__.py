"""flopcount: FLOPs, MACs, parameters and latency of PyTorch models, per operator and per module.

Convention: 1 MAC = 2 FLOPs; MACs count contraction ops (matmul, linear, conv, attention).
"""

from . import peaks
from .analysis import count_flops
from .bench import BenchmarkResult, LatencyStats, benchmark, compute_stats
from .budget import Budget, BudgetReport, check_budget, load_budget_file
from .errors import (
    FlopcountError,
    FlopcountWarning,
    HandlerError,
    TraceError,
    UnsupportedOpError,
    UsageError,
)
from .params import ParamSummary, summarize_parameters
from .registry import HandlerRegistry, default_registry, register_handler
from .results import FlopResult, OpTotals, UnsupportedOp
from .module_timing import ModuleLatency, ModuleLatencyResult, module_latency
from .specs import parse_quantity
from .step_timer import StepRecord, StepSummary, StepTimer
from .types import Cost, OpCall, TensorMeta

__version__ = "0.1.0"

__all__ = [
    "Budget",
    "BudgetReport",
    "check_budget",
    "load_budget_file",
    "parse_quantity",
    "BenchmarkResult",
    "LatencyStats",
    "ModuleLatency",
    "ModuleLatencyResult",
    "StepRecord",
    "StepSummary",
    "StepTimer",
    "benchmark",
    "compute_stats",
    "module_latency",
    "peaks",
    "Cost",
    "FlopResult",
    "FlopcountError",
    "FlopcountWarning",
    "HandlerError",
    "HandlerRegistry",
    "OpCall",
    "OpTotals",
    "ParamSummary",
    "TensorMeta",
    "TraceError",
    "UnsupportedOp",
    "UnsupportedOpError",
    "UsageError",
    "count_flops",
    "default_registry",
    "register_handler",
    "summarize_parameters",
]
