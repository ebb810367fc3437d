"""One row type for every reading's per-op and per-module rows: a booked cost vector
(calls, FLOPs, MACs, bytes read and written) with the time columns a reading books beside
it (roofline seconds, measured seconds). Seconds in the data; milliseconds only when
rendered. No torch here."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Dict, Literal, Mapping, Optional, Tuple

from flopcount.core.deprecation import warn_renamed
from flopcount.devices.roofline import Bound, bound, efficiency, intensity

__all__ = ["ROOF_BELOW_ACHIEVED", "ROOF_FLAG", "BookedRows", "Category", "CostRow", "TimeSource", "category_of"]

Category = Literal["flops", "data movement", "other"]


def category_of(flops: float, bytes_moved: float) -> Category:
    """"flops" (does arithmetic), "data movement" (moves bytes only), or "other"."""
    if flops > 0:
        return "flops"
    return "data movement" if bytes_moved > 0 else "other"


#: Where a row's measured time comes from: the profiler's own measurement of its calls, or a
#: fused kernel's (or a split composite's) time apportioned among the ops it stands for by a
#: model (their attainable time, their FLOPs), or both across its calls.
TimeSource = Literal["measured", "apportioned", "mixed"]

#: A compute-bound row whose efficiency passes this ran faster than its compute roof allows:
#: the roof is below what was achieved (a library beating the roof's micro-benchmark), 5 %
#: above 1.0 left for timer noise.
ROOF_BELOW_ACHIEVED = 1.05
ROOF_FLAG = "roof below achieved"


@dataclass(frozen=True)
class CostRow:
    """One operator in one module and phase (or one module, one phase, one operator summed),
    as the ledger booked it: ``calls``, ``flops``, ``macs``, ``bytes_read``, ``bytes_written``;
    ``dtype`` the one its calls computed in ("mixed" when they differ).

    Time columns, in seconds, filled by the reading that has them: ``compute_s`` = FLOPs /
    peak and ``memory_s`` = bytes / bandwidth, summed per call, ``attainable_s`` = the sum
    over calls of max(compute, memory) (``predict``, ``profile``); ``time_s`` and
    ``host_time_s`` the measured time (``profile``; None where nothing was measured) and
    ``time_source`` where it came from. A fused op's time columns are shared among the
    operations it performs by their FLOPs (:class:`flopcount.core.ledger.Ledger`).
    """

    name: str
    module: str
    phase: str
    calls: float
    flops: float
    macs: float
    bytes_read: float = 0
    bytes_written: float = 0
    dtype: str = "float32"
    compute_s: float = 0.0
    memory_s: float = 0.0
    attainable_s: float = 0.0
    time_s: Optional[float] = None
    host_time_s: Optional[float] = None
    time_source: TimeSource = "measured"

    @property
    def bytes(self) -> float:
        """Bytes read plus bytes written (the roofline's memory traffic)."""
        return self.bytes_read + self.bytes_written

    @property
    def count(self) -> float:
        """``calls`` under the count's 0.2 name (``OpTotals.count``, and the ``count`` key of
        ``FlopResult.to_dict()``'s operators)."""
        return self.calls

    def get(self, metric: str) -> float:
        """Deprecated (0.2's ``OpTotals.get``): the field or property ``metric``
        ("flops", "macs", "count", "bytes", ...); read the attribute instead."""
        warn_renamed("CostRow.get(metric)", "the attribute (row.flops, row.calls, row.bytes...)")
        value: float = getattr(self, metric)
        return value

    @property
    def latency_s(self) -> float:
        """``attainable_s`` under ``predict``'s 0.2 name: the row's eager lower bound."""
        return self.attainable_s

    @property
    def measured_s(self) -> float:
        """``time_s``, 0.0 where nothing was measured."""
        return self.time_s or 0.0

    @property
    def intensity(self) -> Optional[float]:
        """FLOPs per byte moved."""
        return intensity(self.flops, self.bytes)

    @property
    def bound(self) -> Bound:
        return bound(self.compute_s, self.memory_s)

    @property
    def achieved_flops_per_s(self) -> Optional[float]:
        return self.flops / self.time_s if self.time_s else None

    @property
    def achieved_bytes_per_s(self) -> Optional[float]:
        """Bytes moved per second of the row's time (the axis of ops with no FLOPs)."""
        return self.bytes / self.time_s if self.time_s else None

    @property
    def efficiency(self) -> Optional[float]:
        """attainable_s / time_s: 1.0 runs at the roof. None without a measured time, when
        the time was apportioned from a fused kernel (a model's share, not this op's
        measurement), or when nothing is roofed."""
        if self.time_s is None or self.time_source != "measured":
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
        """:func:`category_of` the row's FLOPs and bytes."""
        return category_of(self.flops, self.bytes)

    def to_dict(self) -> Dict[str, Any]:
        """The fields and the derived figures; the measured ones only where time was measured
        (a bound's rows also carry ``latency_s``, predict's 0.2 key)."""
        data = asdict(self)
        data.update(bytes=self.bytes, intensity=self.intensity, bound=self.bound, category=self.category)
        if self.time_s is None:
            for key in ("time_s", "host_time_s", "time_source"):
                del data[key]
            data["latency_s"] = self.attainable_s
        else:
            data.update({key: getattr(self, key) for key in ("achieved_flops_per_s", "achieved_bytes_per_s", "efficiency", "flag")})
        return data


class BookedRows:
    """A reading's rows as the ledger booked them, one per (op, module, phase), and its
    tables by operator, module and phase (a mixin of the reading's dataclass: ``predict``,
    ``profile``)."""

    rows: Tuple[CostRow, ...]
    _modules: Mapping[str, CostRow]
    _phases: Mapping[str, CostRow]

    def column_sum(self, column: str) -> float:
        """``column`` of every row (a field or property of :class:`CostRow`), summed in row order."""
        return sum(getattr(row, column) for row in self.rows)

    def by_module(self) -> Dict[str, CostRow]:
        """``{module: row}``, in name order: each module with every op run while it was on the
        call stack, a module shared under several names credited to each caller that ran it
        (as :meth:`flopcount.FlopResult.by_module` books it)."""
        return dict(sorted(self._modules.items()))

    def by_phase(self) -> Dict[str, CostRow]:
        return dict(self._phases)
