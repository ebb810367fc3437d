"""flopcount: FLOPs, MACs, parameters and latency of PyTorch models, per operator and per module.

Convention: 1 MAC = 2 FLOPs; MACs count contraction ops (matmul, linear, conv, attention).
"""

from .analysis import count_flops
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
from .types import Cost, OpCall, TensorMeta

__version__ = "0.1.0"

__all__ = [
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
