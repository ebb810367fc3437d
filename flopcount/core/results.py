"""The immutable result of a count, and how op costs aggregate into it (no torch here)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Dict, FrozenSet, Iterable, List, Literal, Mapping, Optional, Sequence, Tuple, Type

from flopcount.core.deprecation import module_getattr
from flopcount.core.ledger import TOTAL_FIELDS, Booked, Ledger, cost_change, cost_row, summed_phase
from flopcount.core.rendering import Rendered, render
from flopcount.core.rows import CostRow
from flopcount.errors import UsageError, is_int_at_least
from flopcount.types import CONVENTION, REPORT_SCHEMA_VERSION, Cost, Diagnostic, OpEvent, ParamSummary, ReplayedCall

Metric = Literal["flops", "macs", "count", "bytes", "bytes_read", "bytes_written"]
METRICS: Tuple[str, ...] = ("flops", "macs", "count", "bytes", "bytes_read", "bytes_written")


def _metric(metric: str, where: str) -> str:
    if metric not in METRICS:
        hint = " (parameters per module: FlopResult.modules[i].params)" if metric == "params" else ""
        raise UsageError(f"{where}: metric must be one of {', '.join(map(repr, METRICS))}, got {metric!r}{hint}")
    return metric

__all__ = ["CONVENTION", "FlopResult", "ModuleInfo", "UnsupportedOp", "aggregate", "load_report"]


@dataclass(frozen=True)
class Totals:
    """The count's tables' entry: calls, MACs, FLOPs and bytes moved of one operator (or of
    everything in one module), the ledger's sums frozen (:data:`TOTAL_FIELDS`, in that order).
    Kept small: a count holds one per distinct figures (issue #32). What the API gives is a
    :class:`~flopcount.core.rows.CostRow` made from it (:meth:`FlopResult.operator_totals`)."""

    count: int = 0
    macs: int = 0
    flops: int = 0
    bytes_read: int = 0
    bytes_written: int = 0

    @property
    def bytes(self) -> int:
        """Bytes read plus bytes written (the roofline's memory traffic)."""
        return self.bytes_read + self.bytes_written

    def get(self, metric: Metric) -> int:
        return int(getattr(self, metric))


@dataclass(frozen=True)
class UnsupportedOp:
    """An op that ran without a handler: how often, and in which modules."""

    op: str
    count: int
    modules: Tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ModuleInfo:
    """One module of the model as ``named_modules()`` lists it (slotted: one small object per
    module, not an object and its attribute table; issue #32, what a count keeps per layer)."""

    name: str
    type_name: str
    depth: int
    calls: int
    params: int


@dataclass(frozen=True)
class FlopResult(Rendered):
    """FLOPs, MACs and parameters of one traced run, by operator, by module and by both.

    Convention: 1 MAC = 2 FLOPs; ``macs`` counts contraction ops only; ``flops`` counts
    every floating-point operation that has a handler. Module names are those of
    ``named_modules()``, ``""`` being the whole model; a parent includes its children.
    """

    flops: int
    macs: int
    params: int
    tracer: str
    modules: Tuple[ModuleInfo, ...]
    parameters: ParamSummary
    input_description: str = ""
    _operators: Mapping[str, Totals] = field(default_factory=dict, repr=False)
    _modules: Mapping[str, Totals] = field(default_factory=dict, repr=False)
    _module_ops: Mapping[str, Mapping[str, Totals]] = field(default_factory=dict, repr=False)
    _phases: Mapping[str, Totals] = field(default_factory=dict, repr=False)
    _unsupported: Tuple[UnsupportedOp, ...] = field(default_factory=tuple, repr=False)
    _aliases: Mapping[str, Tuple[str, ...]] = field(default_factory=dict, repr=False)
    warnings: Tuple[str, ...] = ()
    benchmark: Optional[Any] = field(default=None, repr=False)
    gaps: Tuple[str, ...] = ()
    #: ``(op, note, calls)`` of the costs that are estimates (their sentences are in ``warnings``).
    _estimates: Tuple[Tuple[str, str, int], ...] = field(default_factory=tuple, repr=False)
    #: Tensor bytes the ops read and wrote (docs/conventions.md, "Bytes").
    bytes_read: int = 0
    bytes_written: int = 0
    #: Top-level sections of a report besides the count (``entry``, ``memory``, ``benchmark``...):
    #: read back by :meth:`from_dict`, or attached with :meth:`with_sections`; ``to_dict`` writes them.
    _sections: Mapping[str, Any] = field(default_factory=dict, repr=False)
    #: The key order of the document :meth:`from_dict` read (``to_dict`` writes it back in that order).
    _key_order: Tuple[str, ...] = field(default=(), repr=False)
    #: Submodule calls booked from an identical earlier call instead of traced (structural reuse,
    #: docs/internals.md; ``FLOPCOUNT_REUSE=0`` turns it off; only twin groups whose keying is expected to
    #: pay are keyed, ``FLOPCOUNT_REUSE=always`` keys all): how the count was made, not part of
    #: it, so not in ``to_dict()`` (a count with reuse off has the same document).
    reused_calls: int = field(default=0, compare=False)

    @property
    def bytes(self) -> int:
        """Bytes read plus bytes written by every counted op (the roofline's memory traffic)."""
        return self.bytes_read + self.bytes_written

    @property
    def sections(self) -> Dict[str, Any]:
        """The report's sections besides the count (``{"entry": ..., "memory": {...}}``), as
        ``count --format json`` writes them; empty for a fresh count."""
        return dict(self._sections)

    def with_sections(self, **sections: Any) -> FlopResult:
        """This result with more top-level JSON sections (``memory=estimate.to_dict()``)."""
        return replace(self, _sections={**self._sections, **sections})

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "report") -> FlopResult:
        """The result a JSON report describes (``to_dict()``, or ``count --format json``):
        ``FlopResult.from_dict(d).to_dict() == d``, key order included. Version
        :data:`~flopcount.types.REPORT_SCHEMA_VERSION` is read; a newer or missing version is
        refused with a :class:`~flopcount.errors.UsageError` naming ``source``. What the JSON
        does not hold is not restored: ``by_module_and_operator()`` is empty, a module's row
        (``module_totals(name)``) has ``calls`` 0 (the JSON holds how often each module was
        called, in :attr:`modules`, not how many op calls ran inside it) and the estimate notes
        are plain warnings."""
        return _result_from_dict(cls, data, source)

    @property
    def active_params(self) -> int:
        """Parameters one token touches: ``params`` less the routed experts a token does not
        use (k of E per mixture-of-experts layer); equal to ``params`` for a dense model."""
        active = self.parameters.active
        return self.params if active is None else active

    # -- completeness -------------------------------------------------------------
    @property
    def complete(self) -> bool:
        """False when the count may be short: an op without a handler ran, a placeholder
        decided a value on meta/fake tensors, or a tracer could not see some work."""
        return not self._unsupported and not self.gaps

    def diagnostics(self) -> Tuple[Diagnostic, ...]:
        """Every diagnostic of the count as a typed record, each once: ops without a handler
        (with their modules and calls), gaps, estimated costs (op and calls), then the other
        warnings. ``incomplete_reasons()`` and ``warnings`` are their texts."""
        found: List[Diagnostic] = [
            Diagnostic("unsupported", f"{u.op} ran {u.count}x without a handler", u.op, u.modules, u.count)
            for u in self._unsupported
        ]
        found += [Diagnostic("gap", text) for text in self.gaps]
        estimates = {_estimate_text(op, note, n): (op, n) for op, note, n in self._estimates}
        seen = set(self.gaps)
        for text in self.warnings:
            if text in seen:
                continue
            seen.add(text)
            if text in estimates:
                op, n = estimates[text]
                found.append(Diagnostic("estimate", text, op, (), n))
            else:
                found.append(Diagnostic("warning", text))
        return tuple(found)

    def incomplete_reasons(self) -> Tuple[str, ...]:
        """One sentence per reason the count is not complete (empty when complete)."""
        reasons = tuple(f"{u.op} ran {u.count}x without a handler" for u in self._unsupported)
        return reasons + tuple(self.gaps)

    # -- breakdowns ---------------------------------------------------------------
    def by_operator(self, metric: Metric = "flops") -> Dict[str, int]:
        """``{op: FLOPs}`` (or MACs, call counts, bytes), largest first."""
        _metric(metric, "by_operator")
        return _sorted({op: t.get(metric) for op, t in self._operators.items()})

    def by_module(self, metric: Metric = "flops") -> Dict[str, int]:
        """``{module name: FLOPs}`` including children, in ``named_modules()`` order;
        modules that never ran appear with 0."""
        _metric(metric, "by_module")
        return {m.name: self._modules.get(m.name, Totals()).get(metric) for m in self.modules}

    def by_module_and_operator(self, metric: Metric = "flops") -> Dict[str, Dict[str, int]]:
        """``{module name: {op: FLOPs}}`` including children's ops."""
        _metric(metric, "by_module_and_operator")
        return {name: _sorted({op: t.get(metric) for op, t in ops.items()}) for name, ops in self._module_ops.items()}

    def by_phase(self, metric: Metric = "flops") -> Dict[str, int]:
        """``{"forward": ..., "backward": ...}`` (backward only when it was traced)."""
        _metric(metric, "by_phase")
        return {phase: t.get(metric) for phase, t in self._phases.items()}

    def operator_totals(self) -> Dict[str, CostRow]:
        """``{op: row}``: calls, MACs, FLOPs and bytes per operator, summed over modules and
        phases, largest FLOPs first (the row type of ``predict``'s and ``profile``'s
        ``by_operator()``, made from this count's table when called)."""
        ordered = sorted(self._operators.items(), key=lambda kv: (-kv[1].flops, -kv[1].count, kv[0]))
        phase = summed_phase(self._phases)
        return {op: _cost_row("operators", op, totals, phase) for op, totals in ordered}

    def module_totals(self, name: str) -> CostRow:
        """The row of module ``name``: calls, MACs, FLOPs and bytes of the ops run inside it
        (children included; zeros for a module that never ran), as ``predict``'s and
        ``profile``'s ``by_module()[name]``. An unknown name raises ``KeyError``, as fvcore does."""
        return _cost_row("modules", name, self._module_sums(name), summed_phase(self._phases))

    def _module_sums(self, name: str) -> Totals:
        """Module ``name``'s sums as this count keeps them, no row made: what the renderers read
        for each of thousands of modules (a :class:`CostRow` costs ~3 us to make). Zeros for a
        module that never ran; an unknown name raises ``KeyError``."""
        totals = self._modules.get(name)
        if totals is None:
            if name not in self._module_names():
                raise KeyError(f"no module named {name!r} in this result (names are those of named_modules(); '' is the model)")
            totals = Totals()
        return totals

    def _module_names(self) -> FrozenSet[str]:
        names: Optional[FrozenSet[str]] = self.__dict__.get("_names_cache")
        if names is None:
            names = frozenset(m.name for m in self.modules)
            object.__setattr__(self, "_names_cache", names)
        return names

    def unsupported_ops(self) -> Dict[str, int]:
        """``{op: calls}`` of ops that ran without a handler (not counted in the totals)."""
        return {u.op: u.count for u in self._unsupported}

    def unsupported_details(self) -> Tuple[UnsupportedOp, ...]:
        return self._unsupported

    # -- reports ------------------------------------------------------------------
    def table(self, max_depth: Optional[int] = None, *, show_zero: bool = True) -> str:
        """Per-module table (params, MACs, FLOPs, share) with the convention stated below it."""
        return render(self, "table", max_depth=max_depth, show_zero=show_zero)

    def operator_table(self) -> str:
        """Per-operator table: calls, MACs, FLOPs and share."""
        return render(self, "operator_table")

    def tree(self, max_depth: Optional[int] = None) -> str:
        """The module tree like a model printout, annotated with params, MACs, FLOPs and share."""
        return render(self, "tree", max_depth=max_depth)

    def to_dict(self) -> Dict[str, Any]:
        """A JSON-safe dict; keys are documented in docs/api.md."""
        return render(self, "dict")

    def to_csv(self, max_depth: Optional[int] = None) -> str:
        return render(self, "csv", max_depth=max_depth)

    def to_markdown(self, max_depth: Optional[int] = None) -> str:
        return render(self, "table", max_depth=max_depth, fmt="github")


#: a count's rows' ``dtype``: a count books no dtype (``predict``'s rows carry the ones its calls
#: computed in); empty, not CostRow's default "float32", which would be wrong for a bf16 model
NOT_RECORDED = ""


def _cost_row(table: str, key: str, totals: Totals, phase: str) -> CostRow:
    """The ledger's row (:func:`~flopcount.core.ledger.cost_row`) of one entry of a count's table."""
    sums = (totals.count, totals.macs, totals.flops, totals.bytes_read, totals.bytes_written)  # TOTAL_FIELDS' order
    return cost_row(table, key, sums, phase, dtype=NOT_RECORDED)


def _sorted(values: Dict[str, int]) -> Dict[str, int]:
    return dict(sorted(values.items(), key=lambda kv: (-kv[1], kv[0])))


def _frozen(table: Dict[str, Any], rows: Dict[Tuple[int, ...], Totals], in_place: bool = False) -> Dict[str, Totals]:
    """``table`` as Totals; equal sums share one (``rows``: sums -> Totals, per result).
    ``in_place``: ``table`` (a dict its caller lets go: a ledger's) is given its rows and returned,
    the same keys in the same order, rather than a second dict as large beside it."""
    made: Dict[str, Any] = table if in_place else {}
    # a list several keys share (the totals of owners of one tree-booked table) is read once
    # (all of ``table``'s lists are alive here: their ids are distinct)
    seen: Dict[int, Totals] = {}
    for key, sums in table.items():
        row = seen.get(id(sums))
        if row is None:
            figures = tuple(sums)
            row = rows.get(figures)
            if row is None:
                row = rows[figures] = Totals(*figures)
            seen[id(sums)] = row
        made[key] = row
    return made


def _frozen_tables(tables: Dict[str, Any], rows: Dict[Tuple[int, ...], Totals]) -> Dict[str, Mapping[str, Totals]]:
    """Each module's ``{op: sums}`` as Totals, in place: ``tables`` (a ledger's, which its caller
    lets go) is given the frozen tables, the ledger's lists let go as they are read (a second dict
    by module beside it was ~0.3 KiB per LLaMA layer at the count's peak, issue #32); equal tables
    share one (the 80 layers of a model whose layers do the same work: what the result holds per
    layer is its name, not its table)."""
    made = tables
    # equal tables found by their keys and their rows' identities: ``rows`` makes one Totals
    # per figures, so equal rows are one object (hashing ids, not each row's dataclass hash)
    shared: Dict[Tuple[Tuple[str, int], ...], Dict[str, Totals]] = {}
    # a ledger table several owners share (equal subtrees of a tree booking) is frozen once; ids
    # of the ledger's tables are distinct (all alive when called), a replaced one is never looked up
    done: Dict[int, Dict[str, Totals]] = {}
    for name, table in tables.items():  # a value replaced, no key added: the iteration goes on
        frozen = done.get(id(table))
        if frozen is None:
            frozen = _frozen(table, rows)
            frozen = done[id(table)] = shared.setdefault(tuple([(op, id(row)) for op, row in frozen.items()]), frozen)
        made[name] = frozen
    return made


def _with_tables(
    base: FlopResult, operators: Mapping[str, Totals], modules: Mapping[str, Totals],
    module_ops: Mapping[str, Mapping[str, Totals]], phases: Mapping[str, Totals], totals: Optional[Sequence[int]] = None,
) -> FlopResult:
    """``base`` holding these tables and these totals (MACs, FLOPs, bytes read, bytes written),
    by default those of the whole model (module "")."""
    if totals is None:
        whole = modules.get("", Totals())
        totals = (whole.macs, whole.flops, whole.bytes_read, whole.bytes_written)
    macs, flops, read, written = totals
    return replace(base, macs=macs, flops=flops, bytes_read=read, bytes_written=written,
                   _operators=operators, _modules=modules, _module_ops=module_ops, _phases=phases)


def aggregate(
    costed: Iterable[Booked],
    *,
    tracer: str,
    modules: Sequence[ModuleInfo],
    parameters: ParamSummary,
    input_description: str = "",
    warnings: Sequence[str] = (),
    gaps: Sequence[str] = (),
    aliases: Optional[Mapping[str, Sequence[str]]] = None,
    deferred: bool = False,
    reused_calls: int = 0,
) -> FlopResult:
    """Sum op costs by operator, by module (a module includes every op run while it was
    on the call stack, and every op of its submodules: containers that are never called,
    like ModuleList, still include their children) and by phase, with the one
    :class:`~flopcount.core.ledger.Ledger`. ``None`` marks an op without a handler: it is listed
    as unsupported, never counted as zero. A split cost (``Cost.parts``) is booked under
    the ops it names, one call each; a :class:`~flopcount.types.ReplayedCall` as the events it
    stands for (:func:`~flopcount.core.analysis.cost_records`). ``aliases``: ``{canonical name: every name}`` of
    modules reachable under several names. ``reused_calls``: how many submodule calls the trace
    booked from an earlier call (:attr:`FlopResult.reused_calls`).

    ``deferred``: the totals (every event's parts summed: what the ledger books under the
    model, module ``""``), the unsupported ops and the estimate notes are made at once, the
    tables when one is first read (the same result; :func:`count_generation` reads the totals
    of most forwards only, and ``count_flops`` defers: most counts are read for their totals).
    A replay's costs are summed once per distinct tuple, times the replays that share it.
    Non-integer figures are booked at once."""
    if deferred:
        events = list(costed)
        modules = tuple(modules)  # the result's own tuple, held by the booking to come (not a list beside it)
        totals = _summed(events)
        if totals is not None:
            # unsupported ops and estimate notes: booked by the ledger, from the records that have them
            ledger = Ledger(aliases).book_all(_tallied(events))
            base = _unbooked(ledger, tracer, modules, parameters, input_description, warnings, gaps, reused_calls)

            def booked() -> FlopResult:
                return aggregate(events, tracer=tracer, modules=modules, parameters=parameters,
                                 input_description=input_description, warnings=warnings, gaps=gaps, aliases=aliases)

            return _deferred(base, totals, _Deferred(booked))
        costed = events
    ledger = Ledger(aliases).book_all(costed)
    rows: Dict[Tuple[int, ...], Totals] = {}
    return _with_tables(
        _unbooked(ledger, tracer, modules, parameters, input_description, warnings, gaps, reused_calls),
        _frozen(ledger.operators, rows), _frozen(ledger.modules, rows, in_place=True), _frozen_tables(ledger.module_ops, rows),
        _frozen(ledger.phases, rows),
    )


def _unbooked(
    ledger: Ledger, tracer: str, modules: Sequence[ModuleInfo], parameters: ParamSummary, input_description: str,
    warnings: Sequence[str], gaps: Sequence[str], reused_calls: int,
) -> FlopResult:
    """The result of a count before its tables: what it is, its unsupported ops and notes."""
    return FlopResult(
        flops=0,
        macs=0,
        params=parameters.total,
        tracer=tracer,
        modules=tuple(modules),
        parameters=parameters,
        input_description=input_description,
        _unsupported=tuple(UnsupportedOp(op, n, tuple(mods)) for op, (n, mods) in sorted(ledger.unsupported.items())),
        _aliases=ledger.aliases,
        warnings=tuple(warnings) + tuple(_estimate_text(op, note, n) for (op, note), n in ledger.notes.items()),
        _estimates=tuple((op, note, n) for (op, note), n in ledger.notes.items()),
        gaps=tuple(gaps),
        reused_calls=reused_calls,
    )


def _summed(costed: Sequence[Booked]) -> Optional[List[int]]:
    """MACs, FLOPs, bytes read and written of every costed event, part by part (None when a
    figure is not an integer: summed in another order, floats could differ in the last bit;
    a sum stays an ``int`` only while every figure added is one). The replays of one call share
    their costs' tuple (:func:`~flopcount.core.analysis.cost_records`): each tuple is summed once
    and counted as often as it is booked (80 layers: one layer's ops, not 80 x 54 events)."""
    costs: List[Optional[Cost]] = []
    replays: Dict[int, List[Any]] = {}  # id of a replay's costs -> [the costs, how many replays book them]
    for record, cost in costed:
        if type(record) is ReplayedCall:
            seen = replays.get(id(cost))
            if seen is None:
                replays[id(cost)] = [cost, 1]
            else:
                seen[1] += 1
        else:
            costs.append(cost)  # type: ignore[arg-type]  # an event's item: its cost
    totals = _figures(costs)
    for group, times in replays.values():
        for i, figure in enumerate(_figures(group)):
            totals[i] += times * figure
    return totals if all(type(v) is int for v in totals) else None


def _figures(costs: Iterable[Optional[Cost]]) -> List[Any]:
    """MACs, FLOPs, bytes read and bytes written of ``costs`` (None: no handler, nothing), part by part."""
    macs = flops = read = written = 0
    for cost in costs:
        for part in ([] if cost is None else [p for _, p in cost.parts] or [cost]):
            macs += part.macs
            flops += part.flops
            read += part.bytes_read
            written += part.bytes_written
    return [macs, flops, read, written]


def _tallied(costed: Sequence[Booked]) -> List[Booked]:
    """The records of ``costed`` that say something besides figures (an op without a handler,
    an estimate's note), in order: an event that does, a replay whose costs hold one (looked
    at once per costs' tuple), as they are (the ledger tallies a replay's ops in event order)."""
    says: Dict[int, bool] = {}  # id of a replay's costs -> whether one of them does
    kept: List[Booked] = []
    for item in costed:
        record, cost = item
        if type(record) is ReplayedCall:
            found = says.get(id(cost))
            if found is None:
                found = says[id(cost)] = any(c is None or c.note for c in cost)  # type: ignore[union-attr]
            if found:
                kept.append(item)
        elif cost is None or cost.note:  # type: ignore[union-attr]
            kept.append(item)
    return kept


def _deferred(
    base: FlopResult, totals: Sequence[int], tables: _Deferred, operators: Optional[_Deferred] = None,
) -> FlopResult:
    """``base`` with these totals (MACs, FLOPs, bytes read, bytes written) and tables made on
    first use (the per-operator table by ``operators`` where given, else by ``tables``)."""
    return _with_tables(base, _LazyTable(operators or tables, 0), _LazyTable(tables, 1), _LazyTable(tables, 2),
                        _LazyTable(tables, 3), totals)


def _estimate_text(op: str, note: str, count: int) -> str:
    """The sentence for a cost that is an estimate: the count is complete (every op has a
    handler) but this op's figure depends on data the handlers cannot see."""
    return f"{op} ({count} call{'s' if count != 1 else ''}) is an estimate: {note}"


def reprice_groups(result: FlopResult, groups: Iterable[Tuple[Sequence[OpEvent], Cost, Cost]]) -> FlopResult:
    """``result`` with some of its events' costs replaced: the same events ran, only their shapes
    differ (the decode steps of :func:`flopcount.count_generation`), in groups of events that
    each changed from the same old cost to the same new one. Booked by the same ledger as
    :func:`aggregate` (:meth:`Ledger.rebook_group`: the differences only, once per key, not per
    event), split costs included; call counts are unchanged. The result shares every row the
    changes do not touch with ``result`` (copy on write), so re-pricing a step costs what its
    changed events touch, not the size of the model's tables."""
    delta = Ledger(result._aliases)
    for events, old, new in groups:
        if old != new and events:
            delta.rebook_group(events, old, new)
    return _apply(result, delta)


def reprice_deferred(result: FlopResult, groups: Sequence[Tuple[Sequence[OpEvent], Cost, Cost]]) -> FlopResult:
    """:func:`reprice_groups`, its tables booked on first use: the totals (FLOPs, MACs, bytes)
    are ``result``'s plus each group's change times its events (every event is booked under the
    model, module ``""``, once), the per-operator, per-module and per-phase tables are those
    :func:`reprice_groups` books, made when one is first read; the per-operator table is made
    apart, from the same changes (``result``'s plus each operator's change, as
    :meth:`Ledger.rebook_group` books it), so that ``by_operator()`` of every decode step (serve's
    attention FLOPs) costs the operators, not the module tables. A decode step continued from its
    run's first step thus costs the groups it changes, not the model's depth; the same result,
    figure for figure. Non-integer figures are booked at once."""
    sums = [0] * len(TOTAL_FIELDS)
    operators: Dict[str, List[int]] = {}
    changed = False
    for events, old, new in groups:
        if old == new or not events:
            continue
        for name, d in cost_change(events[0].call.op, old, new).items():
            if not all(type(v) is int for v in d):
                return reprice_groups(result, groups)
            changed = True
            into = operators.setdefault(name, [0] * len(TOTAL_FIELDS))
            for i, v in enumerate(d):
                sums[i] += len(events) * v
                into[i] += len(events) * v
    if not changed:
        return result
    totals = [getattr(result, field) + change for field, change in zip(TOTAL_FIELDS[1:], sums[1:])]  # all but calls
    tables = _Deferred(lambda: reprice_groups(result, groups))
    # its operators table only is read: the other three are result's, unread
    operator_table = _Deferred(lambda: replace(result, _operators=_plus(result._operators, operators)))
    return _deferred(result, totals, tables, operators=operator_table)


class _Deferred:
    """A result's four tables, made by ``make`` on first use, once (threads take turns on a lock)."""

    __slots__ = ("_make", "_tables", "_lock")

    def __init__(self, make: Callable[[], FlopResult]):
        self._make: Optional[Callable[[], FlopResult]] = make
        self._tables: Optional[Tuple[Mapping[str, Any], ...]] = None
        self._lock = threading.Lock()

    def tables(self) -> Tuple[Mapping[str, Any], ...]:
        tables = self._tables
        if tables is None:
            with self._lock:
                tables = self._tables
                if tables is None:
                    make = self._make
                    assert make is not None
                    made = make()
                    tables = self._tables = (made._operators, made._modules, made._module_ops, made._phases)
                    self._make = None  # what made them (the step's groups, its base, the events) is let go
        return tables


class _LazyTable(Mapping[str, Any]):
    """One table of a :class:`_Deferred` (operators, modules, module x operator, phases), read
    as the plain dict it stands for (Mapping's own ``get``, ``items``, ``==``... over it);
    pickled and copied as that dict."""

    __slots__ = ("_deferred", "_which")

    def __init__(self, deferred: _Deferred, which: int):
        self._deferred = deferred
        self._which = which

    def _table(self) -> Mapping[str, Any]:
        return self._deferred.tables()[self._which]

    def __getitem__(self, key: str) -> Any:
        return self._table()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._table())

    def __len__(self) -> int:
        return len(self._table())

    # the table's own get and items, not Mapping's (a __getitem__ per key): by_module() reads
    # every module's row through ``get``, 0.25 against 0.11 ms on ResNet-50 (branch deferbook)
    def get(self, key: str, default: Any = None) -> Any:
        return self._table().get(key, default)

    def items(self) -> Any:
        return self._table().items()

    def __repr__(self) -> str:
        return repr(self._table())

    def __reduce__(self) -> Tuple[Any, ...]:
        return (dict, (dict(self._table()),))


def _apply(result: FlopResult, delta: Ledger) -> FlopResult:
    """``result`` with a delta ledger's differences added (rows it does not touch shared)."""
    if not delta.operators:
        return result
    module_ops = dict(result._module_ops)
    for name, ops in delta.module_ops.items():
        module_ops[name] = _plus(result._module_ops.get(name, {}), ops)
    return _with_tables(
        result, _plus(result._operators, delta.operators), _plus(result._modules, delta.modules),
        module_ops, _plus(result._phases, delta.phases),
    )


def _plus(table: Mapping[str, Totals], delta: Mapping[str, Sequence[int]]) -> Dict[str, Totals]:
    """``table`` with ``delta`` added to its rows (new keys appended in the delta's order)."""
    out = dict(table)
    for key, sums in delta.items():
        base = out.get(key)
        if base is None:
            out[key] = Totals(*sums)
        else:
            out[key] = Totals(base.count + sums[0], base.macs + sums[1], base.flops + sums[2],
                                base.bytes_read + sums[3], base.bytes_written + sums[4])
    return out


# --------------------------------------------------------------------------- saved reports

#: the keys ``to_dict`` writes from the count itself; every other key of a document is a section
_COUNT_KEYS = frozenset({
    "schema_version", "convention", "tracer", "inputs", "flops", "macs", "params", "active_params",
    "trainable_params", "frozen_params", "param_bytes_by_dtype", "buffer_bytes_by_dtype", "size_bytes",
    "bytes_read", "bytes_written", "by_phase", "by_operator", "by_module", "unsupported_ops", "complete",
    "incomplete_reasons", "warnings",
})
_TOTAL_KEYS = ("macs", "flops", "bytes_read", "bytes_written")


class _Reader:
    """Typed access to a saved report's values; every error names the source and the key."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, where: str, what: str) -> UsageError:
        return UsageError(f"{self.source}: {where}: {what} (not a flopcount report as count --format json writes it?)")

    def get(self, data: Mapping[str, Any], key: str, where: str = "") -> Any:
        if not isinstance(data, Mapping):
            raise self.fail(where or "the document", f"expected an object, got {type(data).__name__}")
        if key not in data:
            raise self.fail(f"{where}{'.' if where else ''}{key}", "missing")
        return data[key]

    def int(self, data: Mapping[str, Any], key: str, where: str = "") -> int:
        value = data.get(key) if type(data) is dict else None
        if type(value) is int:  # the common case, checked fast: a 70B report holds ~15,000 of them
            return value
        value = self.get(data, key, where)
        if not isinstance(value, int) or isinstance(value, bool):
            raise self.fail(f"{where}{'.' if where else ''}{key}", f"expected an integer, got {value!r}")
        return value

    def table(self, data: Mapping[str, Any], key: str) -> Mapping[str, Any]:
        value = self.get(data, key)
        if not isinstance(value, Mapping):
            raise self.fail(key, f"expected an object, got {type(value).__name__}")
        return value

    def strings(self, data: Mapping[str, Any], key: str) -> Tuple[str, ...]:
        value = self.get(data, key)
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.fail(key, "expected a list of strings")
        return tuple(value)

    def totals(self, row: Mapping[str, Any], where: str, count: bool) -> Totals:
        sums = [self.int(row, key, where) for key in _TOTAL_KEYS]
        return Totals(self.int(row, "count", where) if count else 0, *sums)


def _result_from_dict(cls: Type[FlopResult], data: Mapping[str, Any], source: str) -> FlopResult:
    read = _Reader(source)
    if not isinstance(data, Mapping):
        raise read.fail("the document", f"expected a JSON object, got {type(data).__name__}")
    version = data.get("schema_version")
    if version is None:
        raise read.fail("schema_version", "missing")
    if not is_int_at_least(version, 1):
        raise UsageError(f"{source}: schema_version {version!r} is not one flopcount wrote (this flopcount reads version {REPORT_SCHEMA_VERSION})")
    if version > REPORT_SCHEMA_VERSION:
        raise UsageError(
            f"{source}: schema_version {version} is newer than this flopcount reads ({REPORT_SCHEMA_VERSION}); "
            "upgrade flopcount, or write the report again with this version"
        )
    params = read.int(data, "params")
    active = read.int(data, "active_params")
    dtypes = {key: read.table(data, key) for key in ("param_bytes_by_dtype", "buffer_bytes_by_dtype")}
    for key, table in dtypes.items():
        for dtype in table:
            read.int(table, dtype, key)
    summary = ParamSummary(
        total=params, trainable=read.int(data, "trainable_params"), frozen=read.int(data, "frozen_params"),
        bytes_by_dtype=dict(dtypes["param_bytes_by_dtype"]), buffer_bytes_by_dtype=dict(dtypes["buffer_bytes_by_dtype"]),
        active=None if active == params else active,
    )
    modules: List[ModuleInfo] = []
    module_totals: Dict[str, Totals] = {}
    for name, row in read.table(data, "by_module").items():
        where = f"by_module[{name!r}]"
        type_name = read.get(row, "type", where)
        if not isinstance(type_name, str):
            raise read.fail(f"{where}.type", f"expected a string, got {type_name!r}")
        modules.append(ModuleInfo(name, type_name, read.int(row, "depth", where), read.int(row, "calls", where), read.int(row, "params", where)))
        module_totals[name] = read.totals(row, where, count=False)
    operators = {op: read.totals(row, f"by_operator[{op!r}]", count=True) for op, row in read.table(data, "by_operator").items()}
    phases = {phase: read.totals(row, f"by_phase[{phase!r}]", count=False)
              for phase, row in read.table(data, "by_phase").items()}
    unsupported: List[UnsupportedOp] = []
    for op, row in read.table(data, "unsupported_ops").items():
        where = f"unsupported_ops[{op!r}]"
        mods = read.get(row, "modules", where)
        if not isinstance(mods, list):
            raise read.fail(f"{where}.modules", "expected a list")
        unsupported.append(UnsupportedOp(op, read.int(row, "count", where), tuple(str(m) for m in mods)))
    reasons = read.strings(data, "incomplete_reasons")
    gaps = reasons[len(unsupported):]
    return cls(  # tracer and inputs read first, as their errors were named before the totals'
        tracer=str(read.get(data, "tracer")), input_description=str(read.get(data, "inputs")),
        flops=read.int(data, "flops"), macs=read.int(data, "macs"), params=params, modules=tuple(modules), parameters=summary,
        _operators=operators, _modules=module_totals, _module_ops={}, _phases=phases, _unsupported=tuple(unsupported),
        warnings=read.strings(data, "warnings"), gaps=gaps,
        bytes_read=read.int(data, "bytes_read"), bytes_written=read.int(data, "bytes_written"),
        _sections={key: value for key, value in data.items() if key not in _COUNT_KEYS},
        _key_order=tuple(data),
    )


def load_report(path: Any) -> FlopResult:
    """The :class:`FlopResult` of a JSON report file (``count --format json --output PATH``,
    or ``result.to_json()``); :meth:`FlopResult.from_dict` says what is restored. A file
    that is missing, not JSON or not a flopcount report raises
    :class:`~flopcount.errors.UsageError` naming it."""
    from pathlib import Path

    target = Path(path)
    try:
        text = target.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError(f"report {target}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"report {target}: cannot read it: {getattr(exc, 'strerror', None) or exc}") from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"report {target}: not JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})") from None
    return FlopResult.from_dict(data, source=f"report {target}")


# 0.2's public row of operator_totals() and module_totals(): the one row type of every reading now
__getattr__ = module_getattr(__name__, {"OpTotals": ("flopcount.core.rows.CostRow", lambda: CostRow)})
