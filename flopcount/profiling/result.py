"""The immutable result of :func:`flopcount.profile`: measured time joined with counted
cost per op, under a device's roofs (no torch here)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, Iterable, Literal, Mapping, Optional, Tuple

from flopcount.core.diagnostics import from_texts
from flopcount.core.rendering import render
from flopcount.devices.roofline import PROFILE_CONVENTION, Bound, Roofs, bound, efficiency, intensity
from flopcount.types import Diagnostic

Category = Literal["flops", "data movement", "other"]

#: Where a row's time comes from: the profiler's own measurement of its calls, or a fused
#: kernel's (or a split composite's) time apportioned among the ops it stands for by a model
#: (their attainable time, their FLOPs), or both across its calls.
TimeSource = Literal["measured", "apportioned", "mixed"]

#: A compute-bound row whose efficiency passes this ran faster than its compute roof allows:
#: the roof is below what was achieved (a library beating the roof's micro-benchmark), 5 %
#: above 1.0 left for timer noise.
ROOF_BELOW_ACHIEVED = 1.05
ROOF_FLAG = "roof below achieved"


@dataclass(frozen=True)
class ProfileRow:
    """One operator in one module and phase, per step: what it costs and how long it took.

    ``calls``, ``flops``, ``macs``, ``bytes``, ``time_s``, ``host_time_s`` are per step;
    ``compute_s`` = FLOPs / peak and ``memory_s`` = bytes / bandwidth (summed per call),
    ``attainable_s`` = the sum over calls of max(compute, memory).
    """

    name: str
    module: str
    phase: str
    calls: float
    flops: float
    macs: float
    bytes: float
    time_s: float
    host_time_s: float
    compute_s: float
    memory_s: float
    attainable_s: float
    dtype: str = "float32"
    time_source: TimeSource = "measured"

    @property
    def achieved_flops_per_s(self) -> Optional[float]:
        return self.flops / self.time_s if self.time_s > 0 else None

    @property
    def achieved_bytes_per_s(self) -> Optional[float]:
        """Bytes moved per second of the row's time (the axis of ops with no FLOPs)."""
        return self.bytes / self.time_s if self.time_s > 0 else None

    @property
    def intensity(self) -> Optional[float]:
        """FLOPs per byte moved."""
        return intensity(self.flops, self.bytes)

    @property
    def bound(self) -> Bound:
        return bound(self.compute_s, self.memory_s)

    @property
    def efficiency(self) -> Optional[float]:
        """attainable_s / time_s: 1.0 runs at the roof. None when the time was apportioned
        from a fused kernel (a model's share, not this op's measurement) or nothing is roofed."""
        if self.time_source != "measured":
            return None
        return efficiency(self.attainable_s, self.time_s)

    @property
    def flag(self) -> Optional[str]:
        """"roof below achieved" for a compute-bound row above :data:`ROOF_BELOW_ACHIEVED`:
        the compute roof is lower than what this op reached, so the roof is wrong for it."""
        eff = self.efficiency
        if eff is not None and eff > ROOF_BELOW_ACHIEVED and self.flops > 0 and self.bound == "compute":
            return ROOF_FLAG
        return None

    @property
    def category(self) -> Category:
        """"flops" (does arithmetic), "data movement" (moves bytes only), or "other"."""
        if self.flops > 0:
            return "flops"
        return "data movement" if self.bytes > 0 else "other"

    def to_dict(self) -> Dict[str, Any]:
        data = asdict(self)
        data.update(
            achieved_flops_per_s=self.achieved_flops_per_s,
            achieved_bytes_per_s=self.achieved_bytes_per_s,
            intensity=self.intensity,
            bound=self.bound,
            efficiency=self.efficiency,
            category=self.category,
            flag=self.flag,
        )
        return data


def merge(rows: Iterable[ProfileRow], name: str, module: str, phase: str) -> ProfileRow:
    """One row summing ``rows`` under the given labels."""
    rows = list(rows)
    dtypes = {r.dtype for r in rows}
    sources = {r.time_source for r in rows}
    return ProfileRow(
        name, module, phase,
        sum(r.calls for r in rows), sum(r.flops for r in rows), sum(r.macs for r in rows),
        sum(r.bytes for r in rows), sum(r.time_s for r in rows), sum(r.host_time_s for r in rows),
        sum(r.compute_s for r in rows), sum(r.memory_s for r in rows), sum(r.attainable_s for r in rows),
        dtypes.pop() if len(dtypes) == 1 else "mixed",
        sources.pop() if len(sources) == 1 else "mixed",
    )


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


def _module_prefixes(module: str) -> Tuple[str, ...]:
    parts = module.split(".") if module else []
    return ("",) + tuple(".".join(parts[:end]) for end in range(1, len(parts) + 1))


@dataclass(frozen=True)
class ProfileResult:
    """Per-op rows (name, module, phase) of a profiled run, largest time first.

    ``total_time_s`` is the mean wall time of a profiled step; ``roofs`` the roofs used
    (``roofs.source`` says where from); ``unmatched`` what could not be joined.
    """

    rows: Tuple[ProfileRow, ...]
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

    def diagnostics(self) -> Tuple[Diagnostic, ...]:
        """The profile's warnings as typed records ("warning"), each once."""
        return from_texts((), self.warnings)

    @property
    def total_time_s(self) -> float:
        return self.overview.step_s

    @property
    def op_time_s(self) -> float:
        """Sum of the joined rows' times per step."""
        return sum(r.time_s for r in self.rows)

    @property
    def flops(self) -> float:
        return sum(r.flops for r in self.rows)

    def by_operator(self) -> Dict[str, ProfileRow]:
        """``{op: row}`` over every module and phase, largest time first."""
        groups: Dict[str, list] = {}
        for row in self.rows:
            groups.setdefault(row.name, []).append(row)
        phases = {r.phase for r in self.rows}
        phase = phases.pop() if len(phases) == 1 else "all"
        merged = {name: merge(rows, name, "", phase) for name, rows in groups.items()}
        return dict(sorted(merged.items(), key=lambda kv: (-kv[1].time_s, kv[0])))

    def by_module(self) -> Dict[str, ProfileRow]:
        """``{module: row}``: each module with every op of its submodules, in name order."""
        groups: Dict[str, list] = {}
        for row in self.rows:
            for prefix in _module_prefixes(row.module):
                groups.setdefault(prefix, []).append(row)
        phases = {r.phase for r in self.rows}
        phase = phases.pop() if len(phases) == 1 else "all"
        return {name: merge(groups[name], name, name, phase) for name in sorted(groups)}

    def data_movement(self) -> Dict[str, ProfileRow]:
        """``{op: row}`` of the ops that move bytes but do no arithmetic (gathers, copies,
        ``cat``, embedding...), largest time first: a roofline of FLOPs has no place for
        them, so they are grouped here with their achieved bandwidth."""
        return {name: row for name, row in self.by_operator().items() if row.category == "data movement"}

    def by_phase(self) -> Dict[str, ProfileRow]:
        groups: Dict[str, list] = {}
        for row in self.rows:
            groups.setdefault(row.phase, []).append(row)
        return {phase: merge(rows, phase, "", phase) for phase, rows in groups.items()}

    def to_dict(self) -> Dict[str, Any]:
        """A JSON-safe dict: settings, roofs, overview, rows, per-operator rows, unmatched."""
        return {
            "device": self.device,
            "timing": self.timing,
            "steps": self.steps,
            "warmup": self.warmup,
            "backward": self.backward,
            "total_time_s": self.total_time_s,
            "roofs": self.roofs.to_dict(),
            "overview": self.overview.to_dict(),
            "rows": [r.to_dict() for r in self.rows],
            "by_operator": [r.to_dict() for r in self.by_operator().values()],
            "data_movement": [r.to_dict() for r in self.data_movement().values()],
            "unmatched": [asdict(u) for u in self.unmatched],
            "warnings": list(self.warnings),
            "convention": PROFILE_CONVENTION,
        }

    def to_json(self, indent: Optional[int] = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    # Renderers live in flopcount.report (profile, chrome_trace, roofline_plot), reached
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

    def __str__(self) -> str:
        return self.table()
