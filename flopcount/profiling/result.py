"""The immutable result of :func:`flopcount.profile`: measured time joined with counted
cost per op, under a device's roofs (no torch here)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, Literal, Mapping, Optional, Tuple

from flopcount.core.diagnostics import OnRoofs
from flopcount.core.rendering import Rendered, render
from flopcount.core.rows import ROOF_BELOW_ACHIEVED, ROOF_FLAG, BookedRows, Category, CostRow, TimeSource
from flopcount.devices.roofline import PROFILE_CONVENTION, Roofs

__all__ = [
    "ROOF_BELOW_ACHIEVED", "ROOF_FLAG", "Category", "Overview", "ProfileResult", "ProfileRow", "TimeSource", "Unmatched",
]

#: what a profile computes on its roofs, as the sentence on roofs measured under load names it
ESTIMATED = "profile: each attainable time (and the efficiency and bound read from it)"

#: profile's rows are the ledger's rows (0.2 name kept)
ProfileRow = CostRow


@dataclass(frozen=True)
class Unmatched:
    """A profiled call that got no cost (``kind="profiled"``) or a counted call that got
    no time (``kind="counted"``), per step, with the reason."""

    kind: Literal["profiled", "counted"]
    name: str
    module: str
    phase: str
    calls: float
    time_s: float
    flops: float
    reason: str


@dataclass(frozen=True)
class Overview:
    """Where one step's time went (seconds per step), in the spirit of TensorBoard's Overview."""

    step_s: float
    flops_s: float  # ops that do arithmetic
    data_movement_s: float  # ops that only move bytes (copies, layout, cat, index)
    other_s: float  # views, allocation, and profiled ops without a cost
    host_uncovered_s: float  # step wall time no top-level op covers (Python, hooks, launches)

    def to_dict(self) -> Dict[str, float]:
        return asdict(self)


@dataclass(frozen=True)
class ProfileResult(OnRoofs, BookedRows, Rendered):
    """Per-op rows (name, module, phase) of a profiled run, largest time first.

    ``total_time_s`` is the mean wall time of a profiled step; ``roofs`` the roofs used
    (``roofs.source`` says where from); ``unmatched`` what could not be joined.
    """

    ESTIMATED = ESTIMATED  # what its figures are (OnRoofs)

    rows: Tuple[CostRow, ...]
    unmatched: Tuple[Unmatched, ...]
    roofs: Roofs
    overview: Overview
    device: str
    steps: int
    warmup: int
    backward: bool
    timing: str  # "cpu" (self CPU time) or "device" (kernel time by correlation)
    warnings: Tuple[str, ...] = ()
    trace: Optional[Mapping[str, Any]] = field(default=None, repr=False)
    trace_args: Mapping[int, Mapping[str, Any]] = field(default_factory=dict, repr=False)
    _operators: Mapping[str, CostRow] = field(default_factory=dict, repr=False)
    _modules: Mapping[str, CostRow] = field(default_factory=dict, repr=False)
    _phases: Mapping[str, CostRow] = field(default_factory=dict, repr=False)

    @property
    def total_time_s(self) -> float:
        return self.overview.step_s

    @property
    def op_time_s(self) -> float:
        """Sum of the joined rows' times per step."""
        return self.column_sum("measured_s")

    @property
    def flops(self) -> float:
        return self.column_sum("flops")

    def by_operator(self) -> Dict[str, CostRow]:
        """``{op: row}`` over every module and phase, largest time first."""
        return dict(sorted(self._operators.items(), key=lambda kv: (-kv[1].measured_s, kv[0])))

    def data_movement(self) -> Dict[str, CostRow]:
        """``{op: row}`` of the ops that move bytes but do no arithmetic (gathers, copies,
        ``cat``, embedding...), largest time first: a roofline of FLOPs has no place for
        them, so they are grouped here with their achieved bandwidth."""
        return {name: row for name, row in self.by_operator().items() if row.category == "data movement"}

    def to_dict(self) -> Dict[str, Any]:
        """A JSON-safe dict: settings, roofs, overview, rows, per-operator rows, unmatched."""
        return {
            **{name: getattr(self, name) for name in ("device", "timing", "steps", "warmup", "backward", "total_time_s")},
            "roofs": self.roofs.to_dict(),
            "overview": self.overview.to_dict(),
            "rows": [r.to_dict() for r in self.rows],
            "by_operator": [r.to_dict() for r in self.by_operator().values()],
            "data_movement": [r.to_dict() for r in self.data_movement().values()],
            "unmatched": [asdict(u) for u in self.unmatched],
            "warnings": list(self.warnings),
            **self.bound_fields(),
            "convention": PROFILE_CONVENTION,
        }

    # Renderers live in flopcount.report (profile, roofline_plot), reached
    # through flopcount.core.rendering so this module stays data.
    def table(self, by: str = "operator", limit: Optional[int] = 25) -> str:
        return render(self, "table", by=by, limit=limit)

    def to_markdown(self, by: str = "operator", limit: Optional[int] = None) -> str:
        return render(self, "table", by=by, limit=limit, fmt="github")

    def to_csv(self, by: str = "op") -> str:
        return render(self, "csv", by=by)

    def export_chrome_trace(self, path: str) -> None:
        """Write the profiler's Chrome trace, each joined op event's ``args`` extended by
        its flops, macs, bytes, intensity, attainable time and efficiency."""
        trace = render(self, "chrome_trace")  # raises before the file is opened: no trace kept
        with open(path, "w") as fh:
            json.dump(trace, fh)

    def plot_roofline(self, path: str, *, by: str = "operator", label_top: int = 6) -> None:
        """A log-log roofline (PNG or SVG by the file name): the roofs, one point per
        operator (or per op row: ``by="op"``), area by time, the top ops labelled."""
        render(self, "roofline_plot", path=path, by=by, label_top=label_top)
