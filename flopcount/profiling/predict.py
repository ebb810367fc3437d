"""``flopcount.predict``: a roofline lower bound of a model's latency on a device you may
not have, counted on fake tensors (nothing runs).

Each op takes at least ``max(flops / peak, bytes / bandwidth)`` on the device; the
model takes at least the sum. A bound, not a forecast: launch and framework overhead,
caches and imperfect kernels only add time (and fusion a compiler might do is not
assumed, so a fused real run can beat the memory term of the ops it fuses).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple, Union

from ..analysis import cost_events, uncompiled
from ..errors import UsageError
from ..handlers import default_registry
from ..registry import HandlerRegistry
from ..rendering import render
from ..roofline import Bound, Roofs, bound, compute_time, intensity, memory_time
from ..tracers import trace
from ._bytes import bytes_as, call_dtype


@dataclass(frozen=True)
class PredictRow:
    """One operator in one module and phase: its cost and its lower bound on the roofs."""

    name: str
    module: str
    phase: str
    calls: int
    flops: int
    macs: int
    bytes: int
    compute_s: float
    memory_s: float
    latency_s: float  # sum over calls of max(compute, memory)
    dtype: str

    @property
    def intensity(self) -> Optional[float]:
        return intensity(self.flops, self.bytes)

    @property
    def bound(self) -> Bound:
        return bound(self.compute_s, self.memory_s)

    def to_dict(self) -> Dict[str, Any]:
        data = asdict(self)
        data.update(intensity=self.intensity, bound=self.bound)
        return data


@dataclass(frozen=True)
class PredictResult:
    """Lower bounds per op row and in total (``latency_s``) on ``roofs``."""

    rows: Tuple[PredictRow, ...]
    roofs: Roofs
    dtype: Optional[str]
    unsupported: Tuple[str, ...] = ()
    warnings: Tuple[str, ...] = ()

    @property
    def latency_s(self) -> float:
        """The model's latency lower bound: the sum of each op's bound."""
        return sum(r.latency_s for r in self.rows)

    @property
    def compute_s(self) -> float:
        return sum(r.compute_s for r in self.rows)

    @property
    def memory_s(self) -> float:
        return sum(r.memory_s for r in self.rows)

    @property
    def complete(self) -> bool:
        """False when an op without a handler ran: the bound leaves its cost out."""
        return not self.unsupported

    def by_operator(self) -> Dict[str, PredictRow]:
        """``{op: row}`` summed over modules and phases, largest bound first."""
        groups: Dict[str, List[PredictRow]] = {}
        for row in self.rows:
            groups.setdefault(row.name, []).append(row)
        merged = {name: _merge(rows, name) for name, rows in groups.items()}
        return dict(sorted(merged.items(), key=lambda kv: (-kv[1].latency_s, kv[0])))

    def to_dict(self) -> Dict[str, Any]:
        return {
            "device": self.roofs.device,
            "roofs": self.roofs.to_dict(),
            "dtype": self.dtype,
            "latency_s": self.latency_s,
            "compute_s": self.compute_s,
            "memory_s": self.memory_s,
            "complete": self.complete,
            "unsupported": list(self.unsupported),
            "rows": [r.to_dict() for r in self.rows],
            "warnings": list(self.warnings),
            "note": "a lower bound, not a forecast: sum over ops of max(FLOPs / peak, bytes / bandwidth)",
        }

    def table(self, limit: Optional[int] = 25) -> str:
        return render(self, "table", limit=limit)

    def __str__(self) -> str:
        return self.table()


def _merge(rows: List[PredictRow], name: str) -> PredictRow:
    dtypes = {r.dtype for r in rows}
    return PredictRow(
        name, "", "all" if len({r.phase for r in rows}) > 1 else rows[0].phase,
        sum(r.calls for r in rows), sum(r.flops for r in rows), sum(r.macs for r in rows), sum(r.bytes for r in rows),
        sum(r.compute_s for r in rows), sum(r.memory_s for r in rows), sum(r.latency_s for r in rows),
        dtypes.pop() if len(dtypes) == 1 else "mixed",
    )


def predict(
    model: Any,
    inputs: Any = (),
    kwargs: Optional[Mapping[str, Any]] = None,
    *,
    device: Union[str, Roofs] = "h100",
    dtype: Any = None,
    backward: bool = False,
    loss_fn: Optional[Callable[[Any], Any]] = None,
    registry: Optional[HandlerRegistry] = None,
) -> PredictResult:
    """The roofline lower bound of one forward (``backward=True``: forward + backward) of
    ``model`` on ``device``: a datasheet GPU ("h100", "h200", "a100", "l4", "t4"...),
    "this machine" (roofs measured here, cached), or a :class:`~flopcount.roofline.Roofs`.
    ``dtype`` ("bfloat16", torch.float16...) prices floating tensors and FLOPs as if the
    model ran in it (default: the dtypes the trace saw). Counted on fake tensors."""
    from torch import nn

    if not isinstance(model, nn.Module):
        raise UsageError(f"predict expects a torch.nn.Module, got {type(model).__name__}")
    roofs = device if isinstance(device, Roofs) else _named(device)
    as_dtype = None if dtype is None else str(dtype).replace("torch.", "")
    table = registry if registry is not None else default_registry()
    run = trace(uncompiled(model), () if inputs is None else inputs, kwargs, backward=backward, loss_fn=loss_fn)
    groups: Dict[Tuple[str, str, str], List[Any]] = {}
    unsupported: Dict[str, None] = {}
    for event, cost in cost_events(run.events, table):
        if cost is None:
            unsupported[event.call.op] = None
            continue
        op_dtype = as_dtype if as_dtype is not None and _floating(call_dtype(event.call)) else call_dtype(event.call)
        moved = bytes_as(event.call, cost, as_dtype)
        c, m = compute_time(cost.flops, roofs, op_dtype), memory_time(moved, roofs)
        key = (event.call.op, event.module, event.phase)
        sums = groups.setdefault(key, [0, 0, 0, 0, 0.0, 0.0, 0.0, op_dtype])
        for slot, value in enumerate((1, cost.flops, cost.macs, moved, c, m, max(c, m))):
            sums[slot] += value
        if sums[7] != op_dtype:
            sums[7] = "mixed"
    rows = [PredictRow(name, module, phase, *sums) for (name, module, phase), sums in groups.items()]
    rows.sort(key=lambda r: (-r.latency_s, r.name, r.module))
    warnings = tuple(run.warnings)
    if unsupported:
        warnings += (f"ops without a handler are left out of the bound: {', '.join(unsupported)}",)
    return PredictResult(tuple(rows), roofs, as_dtype, tuple(unsupported), warnings)


def _floating(dtype: str) -> bool:
    return "float" in dtype or "half" in dtype or "double" in dtype


def _named(name: Any) -> Roofs:
    from ..bench.roofs import named_roofs

    if not isinstance(name, str):
        raise UsageError(f"device must be a device name ('h100', 't4', 'this machine'...) or a Roofs, got {name!r}")
    return named_roofs(name)
