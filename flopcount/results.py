"""The immutable result of a count, and how op costs aggregate into it (no torch here)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any, Dict, FrozenSet, Iterable, List, Literal, Mapping, Optional, Sequence, Tuple

from .errors import UsageError
from .ledger import Ledger
from .rendering import render
from .types import CONVENTION, Cost, Diagnostic, OpEvent, ParamSummary

Metric = Literal["flops", "macs", "count", "bytes", "bytes_read", "bytes_written"]
METRICS: Tuple[str, ...] = ("flops", "macs", "count", "bytes", "bytes_read", "bytes_written")


def _metric(metric: str, where: str) -> str:
    if metric not in METRICS:
        hint = " (parameters per module: FlopResult.modules[i].params)" if metric == "params" else ""
        raise UsageError(f"{where}: metric must be one of {', '.join(map(repr, METRICS))}, got {metric!r}{hint}")
    return metric

__all__ = ["CONVENTION", "FlopResult", "ModuleInfo", "OpTotals", "UnsupportedOp", "aggregate"]


@dataclass(frozen=True)
class OpTotals:
    """Calls, MACs, FLOPs and bytes moved of one operator (or of everything in one module)."""

    count: int = 0
    macs: int = 0
    flops: int = 0
    bytes_read: int = 0
    bytes_written: int = 0

    @property
    def bytes(self) -> int:
        """Bytes read plus bytes written (the roofline's memory traffic)."""
        return self.bytes_read + self.bytes_written

    @property
    def intensity(self) -> Optional[float]:
        """Arithmetic intensity, FLOPs per byte moved; None when nothing was moved."""
        moved = self.bytes
        return self.flops / moved if moved else None

    def get(self, metric: Metric) -> int:
        return int(getattr(self, metric))


@dataclass(frozen=True)
class UnsupportedOp:
    """An op that ran without a handler: how often, and in which modules."""

    op: str
    count: int
    modules: Tuple[str, ...]


@dataclass(frozen=True)
class ModuleInfo:
    """One module of the model as ``named_modules()`` lists it."""

    name: str
    type_name: str
    depth: int
    calls: int
    params: int


@dataclass(frozen=True)
class FlopResult:
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
    _operators: Mapping[str, OpTotals] = field(default_factory=dict, repr=False)
    _modules: Mapping[str, OpTotals] = field(default_factory=dict, repr=False)
    _module_ops: Mapping[str, Mapping[str, OpTotals]] = field(default_factory=dict, repr=False)
    _phases: Mapping[str, OpTotals] = field(default_factory=dict, repr=False)
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

    @property
    def bytes(self) -> int:
        """Bytes read plus bytes written by every counted op (the roofline's memory traffic)."""
        return self.bytes_read + self.bytes_written

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
        return {m.name: self._modules.get(m.name, OpTotals()).get(metric) for m in self.modules}

    def by_module_and_operator(self, metric: Metric = "flops") -> Dict[str, Dict[str, int]]:
        """``{module name: {op: FLOPs}}`` including children's ops."""
        _metric(metric, "by_module_and_operator")
        return {name: _sorted({op: t.get(metric) for op, t in ops.items()}) for name, ops in self._module_ops.items()}

    def by_phase(self, metric: Metric = "flops") -> Dict[str, int]:
        """``{"forward": ..., "backward": ...}`` (backward only when it was traced)."""
        _metric(metric, "by_phase")
        return {phase: t.get(metric) for phase, t in self._phases.items()}

    def operator_totals(self) -> Dict[str, OpTotals]:
        """Calls, MACs and FLOPs per operator, largest FLOPs first."""
        return dict(sorted(self._operators.items(), key=lambda kv: (-kv[1].flops, -kv[1].count, kv[0])))

    def module_totals(self, name: str) -> OpTotals:
        """Calls, MACs and FLOPs of module ``name`` (children included; zeros for a module
        that never ran). An unknown name raises ``KeyError``, as fvcore does."""
        totals = self._modules.get(name)
        if totals is not None:
            return totals
        if name not in self._module_names():
            raise KeyError(f"no module named {name!r} in this result (names are those of named_modules(); '' is the model)")
        return OpTotals()

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

    def to_json(self, indent: Optional[int] = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def to_csv(self, max_depth: Optional[int] = None) -> str:
        return render(self, "csv", max_depth=max_depth)

    def to_markdown(self, max_depth: Optional[int] = None) -> str:
        return render(self, "table", max_depth=max_depth, fmt="github")

    def __str__(self) -> str:
        return self.table()


def _sorted(values: Dict[str, int]) -> Dict[str, int]:
    return dict(sorted(values.items(), key=lambda kv: (-kv[1], kv[0])))


def _frozen(table: Mapping[str, Sequence[int]]) -> Dict[str, OpTotals]:
    return {key: OpTotals(*sums) for key, sums in table.items()}


def _thawed(table: Mapping[str, OpTotals]) -> Dict[str, List[int]]:
    return {key: [t.count, t.macs, t.flops, t.bytes_read, t.bytes_written] for key, t in table.items()}


def _from_ledger(ledger: Ledger, base: FlopResult) -> FlopResult:
    total = OpTotals(*ledger.total())
    return replace(
        base,
        flops=total.flops,
        macs=total.macs,
        bytes_read=total.bytes_read,
        bytes_written=total.bytes_written,
        _operators=_frozen(ledger.operators),
        _modules=_frozen(ledger.modules),
        _module_ops={name: _frozen(ops) for name, ops in ledger.module_ops.items()},
        _phases=_frozen(ledger.phases),
    )


def aggregate(
    costed: Iterable[Tuple[OpEvent, Optional[Cost]]],
    *,
    tracer: str,
    modules: Sequence[ModuleInfo],
    parameters: ParamSummary,
    input_description: str = "",
    warnings: Sequence[str] = (),
    gaps: Sequence[str] = (),
    aliases: Optional[Mapping[str, Sequence[str]]] = None,
) -> FlopResult:
    """Sum op costs by operator, by module (a module includes every op run while it was
    on the call stack, and every op of its submodules: containers that are never called,
    like ModuleList, still include their children) and by phase, with the one
    :class:`~flopcount.ledger.Ledger`. ``None`` marks an op without a handler: it is listed
    as unsupported, never counted as zero. A split cost (``Cost.parts``) is booked under
    the ops it names, one call each. ``aliases``: ``{canonical name: every name}`` of
    modules reachable under several names."""
    ledger = Ledger(aliases).book_all(costed)
    base = FlopResult(
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
    )
    return _from_ledger(ledger, base)


def _estimate_text(op: str, note: str, count: int) -> str:
    """The sentence for a cost that is an estimate: the count is complete (every op has a
    handler) but this op's figure depends on data the handlers cannot see."""
    return f"{op} ({count} call{'s' if count != 1 else ''}) is an estimate: {note}"


def reprice(result: FlopResult, changes: Iterable[Tuple[OpEvent, Cost, Cost]]) -> FlopResult:
    """``result`` with some of its events' costs replaced (event, old cost, new cost): the same
    events ran, only their shapes differ (the decode steps of
    :func:`flopcount.count_generation`). Booked by the same ledger as :func:`aggregate`, split
    costs included; call counts are unchanged."""
    ledger = Ledger.from_totals(
        _thawed(result._operators), _thawed(result._phases), _thawed(result._modules),
        {name: _thawed(ops) for name, ops in result._module_ops.items()}, result._aliases,
    )
    for event, old, new in changes:
        if old != new:
            ledger.rebook(event, old, new)
    return _from_ledger(ledger, result)
