"""The cost difference of two counts: plain data, no torch, no renderer imports."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Any, Dict, List, Literal, Mapping, Optional, Tuple, Union

from flopcount.core.diagnostics import unique
from flopcount.core.rendering import Rendered, render
from flopcount.types import Diagnostic

Number = Union[int, float]

#: every metric a diff can carry, in display order: counts first, then what only some
#: reports hold (the estimated peak memory of ``count --memory``, the median latency of
#: ``bench``, the latency lower bound of ``count --on PART``), in bytes and seconds
METRICS: Tuple[str, ...] = ("params", "macs", "flops", "bytes", "peak_memory", "latency", "latency_bound")
#: the metrics of a module row (params owned, children included) and of an operator row
MODULE_METRICS: Tuple[str, ...] = ("params", "macs", "flops", "bytes")
OPERATOR_METRICS: Tuple[str, ...] = ("count", "macs", "flops", "bytes")

#: ``respelled``: an operator row whose change is only a spelling of the same work, its MACs,
#: FLOPs and bytes moving to other rows of the same operation (``aten::linear`` in A,
#: ``aten::addmm`` + ``aten::t`` in B: a TorchScript program's linear, as the dispatch tracer
#: sees it run below Python); see :func:`flopcount.diffs.compute.diff`
Status = Literal["added", "removed", "changed", "unchanged", "respelled"]


@dataclass(frozen=True)
class Change:
    """One row of a diff: a module (matched by path and type), an operator (by name) or the
    totals, with its values on each side (``None`` where that side has no such row/metric)."""

    kind: Literal["total", "module", "operator"]
    name: str
    type_name: str
    depth: int
    status: Status
    a: Optional[Mapping[str, Number]]
    b: Optional[Mapping[str, Number]]
    #: how many modules this row sums: > 1 for repeated layers shown as one row, their
    #: numbered path parts written ``*`` (``layers.*.mlp``); see :meth:`DiffResult.top_changes`
    repeats: int = 1

    def before(self, metric: str) -> Optional[Number]:
        """The A side's value (0 for a row that A does not have; None for a metric A lacks)."""
        return 0 if self.a is None else self.a.get(metric)

    def after(self, metric: str) -> Optional[Number]:
        return 0 if self.b is None else self.b.get(metric)

    def delta(self, metric: str) -> Optional[Number]:
        """B - A; None when either side lacks the metric."""
        a, b = self.before(metric), self.after(metric)
        return None if a is None or b is None else b - a

    def relative(self, metric: str) -> Optional[float]:
        """(B - A) / A; None when A is 0 (a new cost) or either side lacks the metric."""
        a, d = self.before(metric), self.delta(metric)
        return None if a is None or d is None or a == 0 else d / a

    def metrics(self) -> Tuple[str, ...]:
        """The metrics both sides of this row have (an added or removed row: its side's)."""
        sides = [side for side in (self.a, self.b) if side is not None]
        names = set(sides[0]).intersection(*sides[1:]) if sides else set()
        return tuple(dict.fromkeys(m for m in METRICS + OPERATOR_METRICS if m in names))

    @property
    def changed(self) -> bool:
        return self.status not in ("unchanged", "respelled")


def _pattern(name: str) -> str:
    """``model.layers.12.mlp`` -> ``model.layers.*.mlp``: the path of a repeated layer."""
    return ".".join("*" if part.isdigit() else part for part in name.split("."))


def _summed(sides: List[Optional[Mapping[str, Number]]]) -> Optional[Dict[str, Number]]:
    present = [side for side in sides if side is not None]
    return {key: sum(side.get(key, 0) for side in present) for key in present[0]} if present else None


def _grouped(rows: List[Change]) -> List[Change]:
    """Rows of repeated layers summed into one row with ``repeats`` > 1: the same path but
    for layer numbers, the same type and status, and the same change each (80 identical
    ``layers.N.mlp``); the numbers that differ are written ``*`` (``layers.*.mlp``)."""
    groups: Dict[Tuple[Any, ...], List[Change]] = {}
    for row in rows:
        key = (_pattern(row.name), row.type_name, row.status, tuple(row.delta(k) for k in MODULE_METRICS))
        groups.setdefault(key, []).append(row)
    out = []
    for members in groups.values():
        if len(members) == 1:
            out.append(members[0])
            continue
        parts = [m.name.split(".") for m in members]
        name = ".".join(p if all(q[i] == p for q in parts) else "*" for i, p in enumerate(parts[0]))
        first = members[0]
        out.append(Change("module", name, first.type_name, first.depth, first.status,
                          _summed([m.a for m in members]), _summed([m.b for m in members]), repeats=len(members)))
    return out


@dataclass(frozen=True)
class DiffResult(Rendered):
    """What changes from report A to report B: totals, modules and operators.

    Modules are matched by path and type (a path whose type changed is one removed and one
    added row); operators by name. ``delta`` is B - A, ``relative`` is (B - A) / A. Params
    of a module include its children's, like its MACs, FLOPs and bytes."""

    a_label: str
    b_label: str
    totals: Change
    modules: Tuple[Change, ...]
    operators: Tuple[Change, ...]
    #: why each side's count may be short (empty when complete)
    a_incomplete: Tuple[str, ...] = ()
    b_incomplete: Tuple[str, ...] = ()
    #: each side's count is short only by ops without a handler (no gap: nothing a placeholder
    #: or an unseen piece of work may have moved either way), so its MACs, FLOPs and bytes
    #: are lower bounds; False for a complete side
    a_lower: bool = False
    b_lower: bool = False
    #: what each side covers: forward, forward + backward...; and its inputs
    a_phases: str = "forward"
    b_phases: str = "forward"
    a_inputs: str = ""
    b_inputs: str = ""
    #: what each side's latency bound is ("any-implementation lower bound on H100 SXM"; "" without one)
    a_bound: str = ""
    b_bound: str = ""
    #: each side's TorchScript modules whose submodules' costs are booked on them (their rows
    #: compared by params only; ``""`` is the whole model); empty without such a module
    a_scripted: Tuple[str, ...] = ()
    b_scripted: Tuple[str, ...] = ()

    def diagnostics(self) -> Tuple[Diagnostic, ...]:
        """Why each side's count may be short, as "gap" records (each text prefixed with its
        side's label), each once."""
        return unique(Diagnostic("gap", f"{label}: {reason}") for label, reasons in
                      ((self.a_label, self.a_incomplete), (self.b_label, self.b_incomplete)) for reason in reasons)

    @property
    def metrics(self) -> Tuple[str, ...]:
        """The total metrics both sides have (peak memory and latency only when both do)."""
        return self.totals.metrics()

    @property
    def complete(self) -> bool:
        return not self.a_incomplete and not self.b_incomplete

    def changed_modules(self, max_depth: Optional[int] = None) -> Tuple[Change, ...]:
        return tuple(m for m in self.modules if m.changed and (max_depth is None or m.depth <= max_depth))

    def respelled(self) -> Tuple[Tuple[str, ...], Tuple[str, ...]]:
        """The operators whose change is only a spelling (status ``respelled``): A's names, B's."""
        rows = [row for row in self.operators if row.status == "respelled"]
        return (tuple(r.name for r in rows if r.a is not None and (r.before("count") or 0) > (r.after("count") or 0)),
                tuple(r.name for r in rows if r.b is not None and (r.after("count") or 0) > (r.before("count") or 0)))

    def counts(self) -> Dict[str, int]:
        """``{"added": n, "removed": n, "changed": n, "unchanged": n}`` of the module rows."""
        return {status: sum(row.status == status for row in self.modules) for status in ("added", "removed", "changed", "unchanged")}

    def top_changes(self, n: Optional[int] = 10, max_depth: Optional[int] = None) -> Tuple[Change, ...]:
        """The module rows that changed most, largest |ΔFLOPs| first (then |Δparams|, |ΔMACs|,
        |Δbytes|), without the whole model (the totals say it), without a container whose change
        is exactly one child's or one group of repeated children's (they say it more precisely),
        and with repeated layers summed into one row: ``layers.*.mlp`` with ``repeats`` = 80
        and the 80 layers' changes added up."""
        rows = _grouped([m for m in self.changed_modules(max_depth) if m.name and not self._passes_through(m)])
        rows.sort(key=lambda r: (*(-abs(r.delta(k) or 0) for k in ("flops", "params", "macs", "bytes")), r.name))
        return tuple(rows if n is None else rows[:n])

    def grew_most(self, metric: str, n: int = 3) -> Tuple[Change, ...]:
        """The modules whose ``metric`` grew most (largest B - A first), containers that only
        pass their children's growth through left out, repeated layers summed into one row; where
        no module below the model has the metric's growth, a TorchScript module (the model itself
        too) whose submodules' costs are booked on it (``a_scripted``, ``b_scripted``)."""
        rows = _grouped([m for m in self.modules if m.name and (m.delta(metric) or 0) > 0 and not self._passes_through(m, (metric,))])
        if not rows:  # a TorchScript module's layers carry no costs (their work is booked on it): it
            scripted = set(self.a_scripted + self.b_scripted)
            rows = [m for m in self.modules if m.name in scripted and (m.delta(metric) or 0) > 0]
        rows.sort(key=lambda r: (-(r.delta(metric) or 0), -r.depth, r.name))
        return tuple(rows[:n])

    def _passes_through(self, row: Change, metrics: Tuple[str, ...] = MODULE_METRICS) -> bool:
        """The row's change is exactly one child's, or the sum of one group of repeated
        children's (``layers`` = the sum of ``layers.0`` ... ``layers.79``)."""
        children = self._children.get(row.name, ())
        mine = tuple(row.delta(k) or 0 for k in metrics)
        sums: Dict[Tuple[str, str], Tuple[Number, ...]] = {}
        for child in children:
            deltas = tuple(child.delta(k) or 0 for k in metrics)
            if deltas == mine:
                return True
            key = (_pattern(child.name), child.type_name)
            sums[key] = tuple(total + d for total, d in zip(sums.get(key, (0,) * len(metrics)), deltas))
        return mine in sums.values()

    @functools.cached_property
    def _children(self) -> Dict[str, List[Change]]:
        """``{module path: its child rows}`` (both sides' children: added, removed, changed)."""
        found: Dict[str, List[Change]] = {}
        for row in self.modules:
            if row.name:
                found.setdefault(row.name.rpartition(".")[0], []).append(row)
        return found

    # -- reports ------------------------------------------------------------------
    def table(self, max_depth: Optional[int] = None, top: Optional[int] = None, *, operators: bool = True) -> str:
        """Totals, then the module rows (``top``: only the N largest changes), then the operators."""
        return str(render(self, "table", max_depth=max_depth, top=top, operators=operators))

    def to_markdown(self, max_depth: Optional[int] = None, top: int = 10) -> str:
        """A pull-request comment: a summary line, the top changes, the full tables folded."""
        return str(render(self, "markdown", max_depth=max_depth, top=top))

    def to_dict(self, max_depth: Optional[int] = None) -> Dict[str, Any]:
        """A JSON-safe dict (keys in docs/api.md, "Diffs")."""
        data: Dict[str, Any] = render(self, "dict", max_depth=max_depth)
        return data

    def to_json(self, indent: Optional[int] = 2, max_depth: Optional[int] = None) -> str:
        return json.dumps(self.to_dict(max_depth=max_depth), indent=indent)

    def to_csv(self, max_depth: Optional[int] = None) -> str:
        return str(render(self, "csv", max_depth=max_depth))
