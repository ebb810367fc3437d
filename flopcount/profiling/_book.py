"""Booking a joined run: counted events with their costs and measured times -> the ledger
(rows, operators, modules, phases: :class:`flopcount.core.ledger.Ledger`, the measured and
attainable seconds booked as columns beside the cost), the unmatched list, the step overview
and the per-trace-event args."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Set, Tuple

from flopcount.core.ledger import Ledger
from flopcount.core.rows import CostRow, TimeSource, category_of
from flopcount.devices.roofline import Roofs, kernel_flops, op_time
from flopcount.profiling._bytes import call_dtype
from flopcount.profiling._tree import Alignment, TopOp, attribute, cpu_total, shared_without_measure
from flopcount.profiling.result import Overview, Unmatched
from flopcount.types import Cost, OpEvent
from flopcount.units import ROOT_LABEL


@dataclass
class EventFacts:
    """One counted event's cost under the roofs (per call)."""

    event: OpEvent
    cost: Optional[Cost]
    bytes: int = 0
    dtype: str = "float32"
    #: the FLOPs the compute roof prices: the count's, less the scores a causal attention skips
    needed_flops: float = 0.0

    @property
    def flops(self) -> int:
        return self.cost.flops if self.cost is not None else 0

    @property
    def macs(self) -> int:
        return self.cost.macs if self.cost is not None else 0


def event_facts(costed: Sequence[Tuple[OpEvent, Optional[Cost]]]) -> List[EventFacts]:
    return [EventFacts(event, None) if cost is None
            else EventFacts(event, cost, cost.bytes, call_dtype(event.call), kernel_flops(event.call, cost.flops))
            for event, cost in costed]


@dataclass
class Measured:
    """Per-event sums over the timed steps (microseconds) and profiled calls without cost."""

    time: Dict[int, float] = field(default_factory=dict)
    host: Dict[int, float] = field(default_factory=dict)
    seen: Dict[int, int] = field(default_factory=dict)
    loose: Dict[Tuple[str, str], List[float]] = field(default_factory=dict)  # (name, reason) -> [calls, time]
    swaps: Dict[str, int] = field(default_factory=dict)  # what the timed run ran instead -> times seen
    category: Dict[str, float] = field(default_factory=lambda: {"flops": 0.0, "data movement": 0.0, "other": 0.0})
    apportioned: Set[int] = field(default_factory=set)  # events whose time a model shared out of a fused op
    step_us: float = 0.0
    covered_us: float = 0.0

    def add_loose(self, name: str, reason: str, time_us: float) -> None:
        _tally(self.loose, (name, reason), time_us)


def _tally(table: Dict[Any, List[float]], key: Any, value: float) -> None:
    """One more call of ``key`` worth ``value``: ``table[key]`` is [calls, sum of values]."""
    entry = table.setdefault(key, [0.0, 0.0])
    entry[0] += 1
    entry[1] += value


def attainable_parts(fact: EventFacts, roofs: Roofs) -> Tuple[float, float, float]:
    """(compute s, memory s, attainable s) of one call: the one roofline function
    (:func:`flopcount.devices.op_time`, memory at the fastest level holding its bytes)."""
    timed = op_time(roofs, fact.needed_flops, fact.bytes, fact.dtype, fact.event.call.op)
    return timed.compute_s, timed.memory_s, timed.seconds


def _ops(fact: EventFacts) -> Tuple[str, ...]:
    cost = fact.cost
    return (fact.event.call.op,) if cost is None or not cost.parts else tuple(name for name, _ in cost.parts)


def trace_args(events: Sequence[int], facts: Sequence[EventFacts], roofs: Roofs, measured_us: float) -> Dict[str, Any]:
    """The ``args`` a trace event gains: the cost of the counted calls it ran, read as one
    :class:`CostRow` (its intensity, efficiency and flag). A node with nothing on the roofs
    (a view) has efficiency and intensity null, not 0; a compute-bound node above the roof
    gets ``flag``."""
    chosen = [facts[i] for i in events if facts[i].cost is not None]
    parts = [attainable_parts(f, roofs) for f in chosen]
    row = CostRow("", "", "", len(chosen), sum(f.flops for f in chosen), sum(f.macs for f in chosen),
                  sum(f.bytes for f in chosen), compute_s=sum(p[0] for p in parts), memory_s=sum(p[1] for p in parts),
                  attainable_s=sum(p[2] for p in parts), time_s=measured_us * 1e-6)
    args: Dict[str, Any] = {
        # the ledger's vocabulary: a fused cost under the operations it performs
        "flopcount op": ", ".join(sorted({op for f in chosen for op in _ops(f)})),
        "flopcount module": ", ".join(sorted({f.event.module for f in chosen})) or ROOT_LABEL,
        **{key: getattr(row, key) for key in ("flops", "macs", "bytes", "intensity", "attainable_s", "efficiency")},
    }
    if row.flag is not None:
        args["flag"] = row.flag
    return args


#: the seconds booked beside each call's cost, per step
COLUMNS = ("time_s", "host_time_s", "compute_s", "memory_s", "attainable_s")


def book(
    facts: Sequence[EventFacts], measured: Measured, roofs: Roofs, steps: int, aliases: Mapping[str, Sequence[str]]
) -> Ledger:
    """The ledger of one step: each counted call's cost with its measured time (per step) and
    its roofline seconds; a fused cost's time shared among its parts by their FLOPs, a
    model like a fused kernel's split (its rows' time source says "apportioned")."""
    columns: List[Optional[Tuple[float, ...]]] = []
    labels: List[Optional[Tuple[Optional[str], ...]]] = []
    for index, fact in enumerate(facts):
        if fact.cost is None:
            columns.append(None)
            labels.append(None)
            continue
        time_us = measured.time.get(index, 0.0) / steps
        host_us = measured.host.get(index, 0.0) / steps
        c, m, a = attainable_parts(fact, roofs)
        columns.append((time_us * 1e-6, host_us * 1e-6, c, m, a))
        source: Optional[TimeSource] = None
        if time_us > 0:
            source = "apportioned" if index in measured.apportioned or len(fact.cost.parts) > 1 else "measured"
        labels.append((fact.dtype, source))
    return Ledger(aliases, columns=COLUMNS, labels=("dtype", "time_source")).book_all([(f.event, f.cost) for f in facts], columns, labels)


def rows(ledger: Ledger) -> Tuple[CostRow, ...]:
    """One row per (op, module, phase), per step, largest time first."""
    made = list(ledger.cost_rows("rows").values())
    made.sort(key=lambda r: (-r.measured_s, -r.flops, r.name, r.module))
    return tuple(made)


def unmatched(facts: Sequence[EventFacts], measured: Measured, steps: int) -> Tuple[Unmatched, ...]:
    found = [Unmatched("profiled", name, "", "", calls / steps, time_us * 1e-6 / steps, 0, reason)
             for (name, reason), (calls, time_us) in sorted(measured.loose.items(), key=lambda kv: -kv[1][1])]
    missing: Dict[Tuple[str, str, str], List[float]] = {}
    for index, fact in enumerate(facts):
        if fact.cost is None:  # per call: its time; a call that got no time: its FLOPs
            reason, value = "no handler: its cost is unknown (not zero)", measured.time.get(index, 0.0) / steps
        elif measured.seen.get(index, 0) < steps and (fact.flops or fact.bytes):  # a costless view changes no figure
            reason = "counted, but no profiled op carried it in every step (it ran inside another op, or only when counted)"
            value = fact.flops
        else:
            continue
        _tally(missing, (fact.event.call.op, fact.event.module, reason), value)
    for (op, module, reason), (calls, value) in missing.items():
        timed = reason.startswith("no handler")  # the value is its time (us), else its FLOPs
        found.append(Unmatched("counted", op, module, "", calls, value * 1e-6 if timed else 0.0, 0 if timed else value, reason))
    return tuple(found)


def overview(measured: Measured, steps: int) -> Overview:
    per = 1e-6 / steps
    return Overview(
        measured.step_us * per,
        measured.category["flops"] * per,
        measured.category["data movement"] * per,
        measured.category["other"] * per,
        max(0.0, measured.step_us - measured.covered_us) * per,
    )


def _swapped(swaps: Sequence[Tuple[List[int], List[int]]], join: Sequence[TopOp]) -> Dict[int, TopOp]:
    """Timed position -> a stand-in twin carrying every event of the join stretch it replaced."""
    found: Dict[int, TopOp] = {}
    for join_positions, timed_positions in swaps:
        events = [i for p in join_positions for i in join[p].events]
        if not events:
            continue
        stand_in = TopOp(join[join_positions[0]].node, composite=None)
        stand_in.owners = [(i, ()) for i in dict.fromkeys(events)]
        for position in timed_positions:
            found[position] = stand_in
    return found


def _by_roofline(carried: TopOp, facts: Sequence[EventFacts], roofs: Roofs, total: float) -> Dict[int, float]:
    """A fused op's time shared among the counted events it stands for, by their attainable time."""
    weights = {i: attainable_parts(facts[i], roofs)[2] if facts[i].cost is not None else 0.0 for i, _ in carried.owners}
    whole = sum(weights.values())  # all zero: shared equally
    return {i: total / len(weights) if whole <= 0 else total * w / whole for i, w in weights.items()}


def book_step(
    tops: Sequence[TopOp],
    join: Sequence[TopOp],
    alignment: Alignment,
    facts: Sequence[EventFacts],
    measured: Measured,
    measure: Any,
    roofs: Roofs,
    args_out: Dict[int, Dict[str, Any]],
) -> None:
    """Give each timed top-level op's time to the events its join-step twin carries; a
    timed op in a stretch where the runs differ goes to the counted events of that stretch."""
    pairs = alignment.pairs
    swapped = _swapped(alignment.swaps, join)
    step_seen: Dict[int, int] = {}
    for position, top in enumerate(tops):
        node = top.node
        time_us, host_us = measure(node), cpu_total(node)
        measured.covered_us += host_us
        stand_in = swapped.get(position)
        twin = pairs.get(position)
        carried = join[twin] if twin is not None else None
        if stand_in is not None:
            shares = _by_roofline(stand_in, facts, roofs, time_us)
            host_shares = _by_roofline(stand_in, facts, roofs, host_us)
            measured.apportioned.update(shares)
            counted = ", ".join(sorted({facts[i].event.call.op for i in shares if facts[i].flops or facts[i].bytes}))
            note = f"{node.name} ran where the counted run had {counted or 'ops without cost'}"
            measured.swaps[note] = measured.swaps.get(note, 0) + 1
        elif carried is None or not carried.events:
            reason = (
                "the counted run has no such call here (the model ran other code when timed: a fast path, "
                "or a data-dependent branch)"
                if carried is None
                else "flopcount's trace recorded no op for it (no work below autograd: a .to() that converts nothing, argument handling)"
            )
            measured.add_loose(node.name, reason, time_us)
            measured.category["other"] += time_us
            continue
        else:
            shares = attribute(node, carried, measure)
            host_shares = attribute(node, carried, cpu_total)
            if shared_without_measure(node, carried, measure):
                measured.apportioned.update(shares)
        _credit(shares, host_shares, facts, measured, step_seen)
        args_out[node.ident] = trace_args(list(shares), facts, roofs, time_us)
    for index in step_seen:
        measured.seen[index] = measured.seen.get(index, 0) + 1


def _credit(
    shares: Dict[int, float], host_shares: Dict[int, float], facts: Sequence[EventFacts], measured: Measured, seen: Dict[int, int]
) -> None:
    for index, value in shares.items():
        measured.time[index] = measured.time.get(index, 0.0) + value
        measured.host[index] = measured.host.get(index, 0.0) + host_shares.get(index, 0.0)
        seen[index] = 1
        measured.category[category_of(facts[index].flops, facts[index].bytes)] += value
