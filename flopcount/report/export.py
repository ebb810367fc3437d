"""Machine-readable exports: a JSON-safe dict and CSV."""

from __future__ import annotations

import csv
import io
from typing import TYPE_CHECKING, Any, Dict, Literal, Optional, Tuple

from flopcount.core.rendering import renders
from flopcount.report.table import module_rows
from flopcount.types import CONVENTION, REPORT_SCHEMA_VERSION

if TYPE_CHECKING:
    from flopcount.core.results import FlopResult


#: a phase's and a module's figures, in the order the report writes them
_METRICS: Tuple[Literal["macs", "flops", "bytes_read", "bytes_written"], ...] = ("macs", "flops", "bytes_read", "bytes_written")


def _module(result: FlopResult, info: Any) -> Dict[str, Any]:
    """A module's row: its type, depth, calls, params and the cost of its calls (children included)."""
    totals = result._module_sums(info.name)
    return {"type": info.type_name, "depth": info.depth, "calls": info.calls, "params": info.params,
            **{metric: getattr(totals, metric) for metric in _METRICS}}


@renders("FlopResult", "dict")
def result_to_dict(result: FlopResult) -> Dict[str, Any]:
    """Stable keys (documented in docs/api.md); every value is a str, int, float, list or dict."""
    params = result.parameters
    phases = {metric: result.by_phase(metric) for metric in _METRICS}
    data: Dict[str, Any] = {
        "schema_version": REPORT_SCHEMA_VERSION,
        "convention": CONVENTION,
        "tracer": result.tracer,
        "inputs": result.input_description,
        **{key: getattr(result, key) for key in ("flops", "macs", "params", "active_params")},
        "trainable_params": params.trainable,
        "frozen_params": params.frozen,
        "param_bytes_by_dtype": dict(params.bytes_by_dtype),
        "buffer_bytes_by_dtype": dict(params.buffer_bytes_by_dtype),
        "size_bytes": params.size_bytes,
        **{key: getattr(result, key) for key in ("bytes_read", "bytes_written")},
        "by_phase": {phase: {metric: phases[metric][phase] for metric in _METRICS} for phase in phases["flops"]},
        "by_operator": {op: {"count": t.calls, **{metric: getattr(t, metric) for metric in _METRICS}}
                        for op, t in result.operator_totals().items()},
        "by_module": {m.name: _module(result, m) for m in result.modules},
        "unsupported_ops": {u.op: {"count": u.count, "modules": list(u.modules)} for u in result.unsupported_details()},
        "complete": result.complete,
        "incomplete_reasons": list(result.incomplete_reasons()),
        "warnings": list(result.warnings),
    }
    if result.benchmark is not None and hasattr(result.benchmark, "to_dict"):
        data["benchmark"] = result.benchmark.to_dict()
    # sections a saved report carried besides the count (entry, memory, benchmark...), in its order
    data.update(result.sections)
    order = result._key_order
    if order:
        data = {**{key: data[key] for key in order if key in data}, **data}
    return data


@renders("FlopResult", "csv")
def result_to_csv(result: FlopResult, max_depth: Optional[int] = None) -> str:
    """One row per module: name, type, depth, calls, params, macs, flops (raw integers)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["module", "type", "depth", "calls", "params", "macs", "flops"])
    for m, t in module_rows(result, max_depth):
        writer.writerow([m.name, m.type_name, m.depth, m.calls, m.params, t.macs, t.flops])
    return out.getvalue()
