"""The one booking engine: each (event, cost) is booked into totals by operator, by module
and by phase. A fused op's cost is booked under the operations it performs (``Cost.parts``,
one call each); a module is credited with every op run while it was on the call stack and
with its uncalled owners by name (a ModuleList), each module once under its canonical name.

The same code books a count (:func:`flopcount.core.results.aggregate`), re-prices a decode step
(:func:`flopcount.core.results.reprice`: the old cost out, the new one in) and anything after.
Readings that time their ops (``predict``'s roofline seconds, ``profile``'s measured seconds)
book those seconds as *columns* beside the cost, under the same keys and owners, and
per (op, module, phase) *rows*; :meth:`Ledger.cost_rows` reads any table as
:class:`~flopcount.core.rows.CostRow` s. A fused op's columns are shared among its parts by
their FLOPs (equally when it has none), so every column sums to what was booked.

No torch here; the ledger knows costs and names only.
"""

from __future__ import annotations

from operator import itemgetter
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

from flopcount.core.rows import CostRow
from flopcount.types import COST_METRICS, Cost, OpEvent, ReplayedCall

__all__ = ["MIXED", "TABLES", "Booked", "Ledger", "TOTAL_FIELDS", "cost_change", "cost_row", "expand_booked", "owners_of",
           "summed_phase"]

#: What the ledger books: an event and its cost (None: no handler), or a
#: :class:`~flopcount.types.ReplayedCall` and the costs of its ops, in order
#: (:func:`flopcount.core.analysis.cost_records`)
Booked = Union[Tuple[OpEvent, Optional[Cost]], Tuple[ReplayedCall, Tuple[Optional[Cost], ...]]]

#: What a booked total holds, in order: calls, then each cost metric.
TOTAL_FIELDS: Tuple[str, ...] = ("count", *COST_METRICS)
_WIDTH = len(TOTAL_FIELDS)
assert _WIDTH == 5, "_add below is unrolled for five fields: extend it with COST_METRICS"

Sums = List[int]
Key = Tuple[Tuple[str, ...], str, str]
#: the tables a ledger books: by operator, by phase, by module, and (when asked) by row
TABLES: Tuple[str, ...] = ("operators", "phases", "modules", "rows")
#: a label (dtype, time source) its booked calls disagree on
MIXED = "mixed"
Labels = Sequence[Optional[str]]


def _shares(cost: Cost) -> Tuple[float, ...]:
    """How a fused op's time columns are shared among its parts: by FLOPs (equally when it
    has none); one share for an op that is one operation."""
    if not cost.parts:
        return (1.0,)
    if cost.flops:
        return tuple([part.flops / cost.flops for _, part in cost.parts])
    return (1.0 / len(cost.parts),) * len(cost.parts)


def _add_columns(table: Dict[Any, List[float]], key: Any, values: Sequence[float], sign: int) -> None:
    into = table.get(key)
    if into is None:
        table[key] = [sign * v for v in values]
    else:
        for i, value in enumerate(values):
            into[i] += sign * value


def _merge_labels(table: Dict[Any, List[Optional[str]]], key: Any, labels: Labels) -> None:
    into = table.get(key)
    if into is None:
        table[key] = list(labels)
        return
    for i, label in enumerate(labels):
        if label is not None and into[i] != label:
            into[i] = label if into[i] is None else MIXED


def _vector(cost: Cost, calls: int) -> Sums:
    return [calls, cost.macs, cost.flops, cost.bytes_read, cost.bytes_written]


def owners_of(
    stack: Tuple[str, ...], aliases: Mapping[str, Sequence[str]], canonical: Mapping[str, str]
) -> Tuple[str, ...]:
    """The root, each module on the call stack, and the modules between two stack entries
    that own the inner one by name but were never called themselves (``"h"`` for
    ``("", "h.0")``, a ModuleList), each once. A name-prefix owner that is not on the call
    path is not credited: a module shared as ``a.m`` and ``b.m`` runs inside ``b`` when
    ``b`` calls it (its canonical name being ``a.m``), so it counts for ``b``, not ``a``.
    ``aliases`` maps a canonical name to every name of that module, so the path through
    ``b`` is found; ``canonical`` (alias -> canonical name) names the prefixes credited."""
    names: Dict[str, None] = {"": None}
    outer = ""
    for qualified in stack:
        outer = _add_owners(names, outer, qualified, aliases, canonical)
    return tuple(names)


def _add_owners(
    names: Dict[str, None], outer: str, qualified: str, aliases: Mapping[str, Sequence[str]], canonical: Mapping[str, str]
) -> str:
    """Add to ``names`` the owners one stack entry ``qualified`` adds after the entry before it
    (whose path by name is ``outer``: "" for none): the uncalled owners between the two, then
    itself (see :func:`owners_of`). Gives back the entry's path by name (an alias on the path)."""
    path = qualified
    found = aliases.get(qualified)
    if found:
        path = _nearest_name(found, outer) or qualified
    if not outer or path.startswith(outer + "."):
        # each "." after the outer entry's name ends the name of an owner between the two (none
        # for a direct child: found without splitting the name, the common case)
        end = path.find(".", len(outer) + 1 if outer else 0)
        while end != -1:
            prefix = path[:end]
            names[canonical.get(prefix, prefix)] = None
            end = path.find(".", end + 1)
    names[qualified] = None
    return path


def _nearest_name(names: Sequence[str], outer: str) -> Optional[str]:
    """Of a shared module's ``names``, the one below ``outer`` (a path by name, "" for the root)
    with the fewest owners between the two, the first of equals; None when none is below it.
    A module registered as ``blocks.0.shared`` and ``head`` and called by the root ran as
    ``head``: ``blocks`` and ``blocks.0`` were not on its call path, so they are not credited."""
    nearest: Optional[str] = None
    for name in names:
        if outer and not name.startswith(outer + "."):
            continue
        if nearest is None or name.count(".") < nearest.count("."):
            nearest = name
    return nearest


_NONE: Mapping[str, Any] = {}  # no aliases, no canonical names (read only)


def _owners_below(above: Tuple[str, ...], stack: Tuple[str, ...]) -> Tuple[str, ...]:
    """:func:`owners_of` ``stack`` in a model without aliases, from ``above``, the owners of the
    stack one shorter: those, then the names the innermost entry adds (without aliases an
    entry's path is its name). One step per stack instead of a walk of the whole stack, and
    nothing kept across counts (issue #32: a process-wide cache of every stack booked kept
    5.6 KiB per 70B layer after the count)."""
    added: Dict[str, None] = {}
    _add_owners(added, stack[-2] if len(stack) > 1 else "", stack[-1], _NONE, _NONE)
    return above + tuple([name for name in added if name not in above])


_FIRST = itemgetter(0)


def _first_ordered(table: Mapping[Any, List[int]]) -> Dict[Any, List[int]]:
    """``{key: the five figures}`` of a booking table (figures, then ``first``) in the order of
    each key's first event (a stable sort on ``first``), without a Python call per
    key (a tree booking orders ~120 tables per ResNet-50 count): a table already in that order
    (most: one node's ops as they ran) is not sorted, the others are sorted on a C key."""
    previous = -1
    for sums in table.values():
        at = sums[_WIDTH]
        if at < previous:
            break
        previous = at
    else:
        return {key: sums[:_WIDTH] for key, sums in table.items()}
    ordered = sorted([(sums[_WIDTH], key, sums) for key, sums in table.items()], key=_FIRST)  # stable, as before
    return {key: sums[:_WIDTH] for _, key, sums in ordered}


def cost_change(op: str, old: Cost, new: Cost) -> Dict[str, Sums]:
    """``{booked name: new - old}`` of one event that ran at ``new`` instead of ``old``: the
    change of each part (of ``op`` itself when the cost is not split), calls unchanged; names
    whose figures do not change are left out."""
    change: Dict[str, Sums] = {}
    for sign, cost in ((-1, old), (1, new)):
        for name, part in cost.parts or ((op, cost),):
            vector = _vector(part, 0)
            into = change.setdefault(name, [0] * _WIDTH)
            for i in range(_WIDTH):
                into[i] += sign * vector[i]
    return {name: d for name, d in change.items() if any(d)}


def _add_call(table: Dict[Any, List[int]], key: Any, part: Cost, first: Optional[int]) -> None:
    """Count one call of ``part`` into ``table[key]`` (calls, MACs, FLOPs, bytes read, bytes
    written; then ``first``, the index of the first event, for a new key when given)."""
    sums = table.get(key)
    if sums is None:
        table[key] = [1, part.macs, part.flops, part.bytes_read, part.bytes_written] + ([] if first is None else [first])
        return
    sums[0] += 1
    sums[1] += part.macs
    sums[2] += part.flops
    sums[3] += part.bytes_read
    sums[4] += part.bytes_written


def _add_first(table: Dict[Any, List[int]], key: Any, sums: List[int], offset: int = 0) -> None:
    """Add ``sums`` (the five figures, then the index of the first event, counted from
    ``offset``) into ``table[key]``: the figures summed, the earliest first event kept."""
    found = table.get(key)
    at = sums[_WIDTH] + offset
    if found is None:
        table[key] = [sums[0], sums[1], sums[2], sums[3], sums[4], at]
        return
    for i in range(_WIDTH):
        found[i] += sums[i]
    if at < found[_WIDTH]:
        found[_WIDTH] = at


def _add(table: Dict[Any, Sums], key: Any, sums: Sums, sign: int = 1) -> None:
    into = table.get(key)
    if into is None:
        table[key] = list(sums) if sign == 1 else [-v for v in sums]
    elif sign == 1:  # unrolled: this runs once per (call stack, op, phase) and owner
        into[0] += sums[0]
        into[1] += sums[1]
        into[2] += sums[2]
        into[3] += sums[3]
        into[4] += sums[4]
    else:
        for i in range(_WIDTH):
            into[i] -= sums[i]


def expand_booked(costed: Iterable[Booked]) -> Iterator[Tuple[OpEvent, Optional[Cost]]]:
    """Every (event, cost) of ``costed``, each replay's ops as the events a traced call leaves."""
    for item in costed:
        record = item[0]
        if type(record) is ReplayedCall:
            stacks = record.stacks
            for (call, k, phase), cost in zip(record.ops, item[1]):  # type: ignore[arg-type]
                yield OpEvent(call, stacks[k], phase), cost
        else:
            yield item  # type: ignore[misc]


def _is_graft(item: Any) -> bool:
    """Whether an entry of :meth:`Ledger._book_tree`'s sequence is a grafted replay (else a stack)."""
    return len(item) == 3 and isinstance(item[0], ReplayedCall)


def _alone(costed: Sequence[Booked]) -> set[int]:
    """The ids of the replays whose call's subtree gets no other record's ops: no event's stack
    starts with the replay's root stack, no other replay's root is that stack, above or below it."""
    roots: Dict[Tuple[str, ...], int] = {}
    below: set[Tuple[str, ...]] = set()  # every stack of an event, and every prefix of one or of a root
    replays: List[ReplayedCall] = []
    for item in costed:
        record = item[0]
        if isinstance(record, ReplayedCall):
            roots[record.root] = roots.get(record.root, 0) + 1
            replays.append(record)
            continue
        stack = record.module_stack
        if stack not in below:
            for end in range(len(stack) + 1):
                below.add(stack[:end])
    if not replays:
        return set()
    for root in roots:
        for end in range(len(root)):
            below.add(root[:end])
    return {
        id(r) for r in replays
        if roots[r.root] == 1 and r.root and r.root not in below and not any(r.root[:end] in roots for end in range(len(r.root)))
    }


class _Group:
    """The tables of one replay's ops, booked once per distinct ops (a layer's 54 events, for
    80 layers): per stack index, ``{op: sums + [first]}``, ``first`` counted from the group's
    first part; per (op, phase) the same; the stack indices in the order their first costed
    event comes; what the events say besides figures, in event order (ops without a handler
    with their stack index, estimate notes); and how many parts the group books."""

    __slots__ = ("ops", "tables", "order", "phases", "tallies", "width", "leaves", "_tree")

    def __init__(self, ops: Tuple[Any, ...], costs: Tuple[Optional[Cost], ...]):
        self.ops = ops  # held: the cache is keyed by its id
        self.tables: Dict[int, Dict[str, List[int]]] = {}
        self.phases: Dict[Tuple[str, str], List[int]] = {}
        self.tallies: List[Tuple[str, int, str]] = []  # (op, stack index, note; "" for no handler)
        first = 0
        for (call, k, phase), cost in zip(ops, costs):
            op = call.op
            if cost is None:
                self.tallies.append((op, k, ""))
                continue
            if cost.note:
                self.tallies.append((op, k, cost.note))
            table = self.tables.get(k)
            if table is None:
                table = self.tables[k] = {}
            for name, part in cost.parts or ((op, cost),):
                _add_call(table, name, part, first)
                _add_call(self.phases, (name, phase), part, first)
                first += 1
        self.order = list(self.tables)
        self.width = first
        self.leaves: Dict[int, int] = {}  # stack index -> its node in ``subtree``
        self._tree: Optional[Tuple[List[Dict[str, List[int]]], List[int], List[Tuple[int, int]]]] = None

    def subtree(self, replay: ReplayedCall) -> Tuple[List[Dict[str, List[int]]], List[int], List[Tuple[int, int]]]:
        """The nodes of the group's call tree below (and at) the replayed call, node 0 the call:
        each node's subtree table (first parts counted from the group's start), its parent node
        (-1 for the call) and a (stack index, depth below the call) whose stack prefix, that many
        entries past the replay's root, is the node in any replay of the group (the names of a
        replay's subtree are distinct modules' names: the same tree in every replay, whatever its
        root's depth: a module called inside a layer and again from the model's forward). Made
        once, from the first replay asked for."""
        if self._tree is None:
            depth = len(replay.root)
            index: Dict[Tuple[str, ...], int] = {}
            tables: List[Dict[str, List[int]]] = []
            parents: List[int] = []
            nodes: List[Tuple[int, int]] = []
            for k in self.order:
                path = replay.stacks[k]
                parent = -1
                for length in range(depth, len(path) + 1):
                    node = path[:length]
                    j = index.get(node)
                    if j is None:
                        j = index[node] = len(nodes)
                        nodes.append((k, length - depth))
                        parents.append(parent)
                        tables.append({})
                    parent = j
                self.leaves[k] = parent
            for k in self.order:
                leaf = tables[self.leaves[k]]
                for name, sums in self.tables[k].items():
                    _add_first(leaf, name, sums)
            for j in sorted(range(len(nodes)), key=lambda j: nodes[j][1], reverse=True):
                if parents[j] >= 0:
                    for name, sums in tables[j].items():
                        _add_first(tables[parents[j]], name, sums)
            self._tree = (tables, parents, nodes)
        return self._tree


class Ledger:
    """Totals by operator, module, module x operator and phase, plus what could not be
    costed (ops without a handler) and the notes of estimated costs. ``aliases``:
    ``{canonical module name: every name}`` of modules reachable under several names.

    ``columns``: names of time columns (:class:`CostRow` fields: "compute_s", "memory_s",
    "attainable_s", "time_s", "host_time_s") booked beside the cost; ``labels``: names of
    per-call labels ("dtype", "time_source") kept per key, :data:`MIXED` where calls differ;
    ``rows``: also book per (op, innermost module, phase) (always with columns)."""

    def __init__(
        self,
        aliases: Optional[Mapping[str, Sequence[str]]] = None,
        *,
        columns: Sequence[str] = (),
        labels: Sequence[str] = (),
        rows: bool = False,
    ):
        self.aliases: Dict[str, Tuple[str, ...]] = {name: tuple(names) for name, names in (aliases or {}).items()}
        self._canonical = {alias: name for name, names in self.aliases.items() for alias in names}
        self._owners: Dict[Tuple[str, ...], Tuple[str, ...]] = {}
        self.operators: Dict[str, Sums] = {}
        self.phases: Dict[str, Sums] = {}
        self.modules: Dict[str, Sums] = {}
        self.module_ops: Dict[str, Dict[str, Sums]] = {}
        #: op -> [calls, {module: None}] of ops that ran without a handler
        self.unsupported: Dict[str, List[Any]] = {}
        #: (op, note) -> calls of costs that are estimates
        self.notes: Dict[Tuple[str, str], int] = {}
        self.columns: Tuple[str, ...] = tuple(columns)
        self.labels: Tuple[str, ...] = tuple(labels)
        self.keeps_rows = rows or bool(self.columns) or bool(self.labels)
        #: (op, module, phase) -> sums, ``module`` the innermost on the call stack
        self.rows: Dict[Tuple[str, str, str], Sums] = {}
        #: table name (:data:`TABLES`) -> key -> the time columns booked beside its sums
        self.times: Dict[str, Dict[Any, List[float]]] = {name: {} for name in TABLES}
        #: table name -> key -> the labels of the calls booked there
        self.marks: Dict[str, Dict[Any, List[Optional[str]]]] = {name: {} for name in TABLES}
        #: a tree booking left owners of equal subtrees sharing their lists (:meth:`_unshare`)
        self._shared = False

    def owners(self, stack: Tuple[str, ...]) -> Tuple[str, ...]:
        """:func:`owners_of` ``stack``, kept for this ledger (its stacks' prefixes too, without aliases)."""
        names = self._owners.get(stack)
        if names is None:
            shorter = self.owners(stack[:-1]) if stack and not self.aliases else ()  # not read with aliases
            names = self._owners[stack] = self._owners_of(stack, shorter)
        return names

    def _owners_of(self, stack: Tuple[str, ...], shorter: Tuple[str, ...]) -> Tuple[str, ...]:
        """:func:`owners_of` ``stack``; ``shorter``: the owners of the stack one shorter (not read
        with aliases: an entry's path there depends on the whole stack)."""
        if not stack or self.aliases:
            return owners_of(stack, self.aliases, self._canonical)
        return _owners_below(shorter, stack)

    def book_all(
        self,
        costed: Iterable[Booked],
        columns: Optional[Sequence[Optional[Sequence[float]]]] = None,
        labels: Optional[Sequence[Optional[Labels]]] = None,
    ) -> Ledger:
        """Book every event (``None``: no handler, listed as unsupported, never zero). Events
        that share (call stack, op, phase) are summed first: far fewer than events.
        ``columns`` / ``labels``: per event (in ``costed``'s order) its values of the ledger's
        columns and labels (None: none for that event). A :class:`~flopcount.types.ReplayedCall` is
        booked as the events it stands for (``columns``/``labels``: per event it expands to)."""
        if columns is None and labels is None and not self.keeps_rows and not (self.operators or self.modules):
            return self._book_tree(costed)
        groups: Dict[Key, Sums] = {}
        times: Dict[Key, List[float]] = {}
        marks: Dict[Key, List[Optional[str]]] = {}
        for index, (event, cost) in enumerate(expand_booked(costed)):
            op = event.call.op
            cost = self._tally(op, event.module, cost)
            if cost is None:
                continue
            values = columns[index] if columns is not None else None
            tags = labels[index] if labels is not None else None
            shares = _shares(cost) if values else ()
            for position, (name, part) in enumerate(cost.parts or ((op, cost),)):
                key = (event.module_stack, name, event.phase)
                _add_call(groups, key, part, None)
                if values:
                    share = shares[position]
                    _add_columns(times, key, [v * share for v in values], 1)
                if tags:
                    _merge_labels(marks, key, tags)
        for (stack, name, phase), sums in groups.items():
            group = (stack, name, phase)
            self._book(stack, name, phase, sums, 1, times.get(group), marks.get(group))
        return self

    def _tally(self, op: str, module: str, cost: Optional[Cost]) -> Optional[Cost]:
        """Book what an event says besides its figures: an op without a handler (listed as
        unsupported, never zero) or the note of an estimated cost. Gives back ``cost`` (None:
        no figures to book)."""
        if cost is None:
            entry = self.unsupported.setdefault(op, [0, {}])
            entry[0] += 1
            entry[1][module] = None
            return None
        if cost.note:
            self.notes[(op, cost.note)] = self.notes.get((op, cost.note), 0) + 1
        return cost

    def _book_tree(self, costed: Iterable[Booked]) -> Ledger:
        """:meth:`book_all` of a fresh ledger without columns, labels or rows, with the module
        tables rolled up the call-stack tree instead of credited per (stack, op, phase) and
        owner (issue #32: 80 layers of ~30 stacks each, six owners per stack).

        Exact, and in the same key order as the per-group booking: the owners of a stack are
        those of the stack one shorter plus the names its innermost entry adds (``owners_of``
        walks the stack in order), so an owner first added at stack ``s`` is credited once
        with the sums of every event whose stack starts with ``s``. Each table keeps the order
        in which the per-group booking would have inserted its keys (by first event: ``first``).

        A replay (:class:`~flopcount.types.ReplayedCall`) is booked from its ops' tables, made once per
        distinct ops (:class:`_Group`); its ops without a handler and its notes are tallied in
        event order. A replay whose call's subtree holds no other record's ops (a layer called
        once) is *grafted*: each node of its subtree is credited with the group's subtree table of
        that node, one table for every such replay of the group, its keys ordered from the part the
        replay starts at; the tables of equal subtrees are then one object in the ledger too. Any
        other replay's stack tables are added under its stacks. The same sums, in the same order,
        as its events one by one."""
        costed = costed if isinstance(costed, list) else list(costed)
        alone = _alone(costed)
        # stack -> op -> [calls, macs, flops, bytes_read, bytes_written, first]; (op, phase) -> the same
        stacks: Dict[Tuple[str, ...], Dict[str, List[int]]] = {}
        by_phase: Dict[Tuple[str, str], List[int]] = {}
        made: Dict[int, _Group] = {}
        # the stacks and grafted replays in the order of their first costed part
        sequence: List[Any] = []
        first = 0
        for item in costed:
            event = item[0]
            if isinstance(event, ReplayedCall):
                group = made.get(id(event.ops))
                if group is None:
                    group = made[id(event.ops)] = _Group(event.ops, item[1])  # type: ignore[arg-type]
                if id(event) in alone:
                    self._tallies(event, group)
                    for key, sums in group.phases.items():
                        _add_first(by_phase, key, sums, first)
                    sequence.append((event, group, first))
                    first += group.width
                else:
                    first = self._graft(event, group, stacks, by_phase, first, sequence)
                continue
            cost: Optional[Cost] = item[1]  # type: ignore[assignment]  # an event's item: its cost
            op = event.call.op
            if cost is None or cost.note:
                cost = self._tally(op, event.module, cost)
                if cost is None:
                    continue
            stack = event.module_stack
            table = stacks.get(stack)
            if table is None:
                table = stacks[stack] = {}
                sequence.append(stack)
            phase = event.phase
            for name, part in cost.parts or ((op, cost),):
                _add_call(table, name, part, first)
                _add_call(by_phase, (name, phase), part, first)
                first += 1
        # operators and phases, in first-event order
        operators: Dict[str, List[int]] = {}
        phases: Dict[str, List[int]] = {}
        for (name, phase_name), sums in by_phase.items():
            _add_first(operators, name, sums)
            _add_first(phases, phase_name, sums)
        self.operators = _first_ordered(operators)
        self.phases = _first_ordered(phases)
        # every prefix of a booked stack (and of a grafted replay's call) is a node of the tree;
        # each node's table becomes the sums of its whole subtree, deepest nodes first
        grafted = {item[0].root: item for item in sequence if _is_graft(item) and item[1].order}  # order: has costed ops
        subtree = stacks  # each stack's own table becomes its subtree's (the tables are this call's own)
        for stack in [*stacks, *grafted]:
            for end in range(len(stack) - 1, -1, -1):
                prefix = stack[:end]
                if prefix in subtree:
                    break
                subtree[prefix] = {}
        for stack in sorted([*subtree, *grafted], key=len, reverse=True):
            if not stack:
                continue
            parent = subtree[stack[:-1]]
            graft = grafted.get(stack)
            if graft is None:
                for name, sums in subtree[stack].items():
                    _add_first(parent, name, sums)
            else:
                replay, group, offset = graft
                for name, sums in group.subtree(replay)[0][0].items():
                    _add_first(parent, name, sums, offset)
        # each owner's table: the subtree table of the one node that adds it (shared, not copied),
        # or a sum of its own when several nodes add it (a module called from two places); a
        # grafted table's first parts are counted from its replay's start (``offsets``)
        module_ops: Dict[str, Dict[str, List[int]]] = {}
        offsets: Dict[str, int] = {}
        summed: set[str] = set()

        def credit(owner: str, table: Dict[str, List[int]], offset: int) -> None:
            held = module_ops.get(owner)
            if held is None:
                module_ops[owner] = table
                if offset:
                    offsets[owner] = offset
                return
            if owner not in summed:
                summed.add(owner)
                moved = offsets.pop(owner, 0)
                held = module_ops[owner] = {name: [*sums[:_WIDTH], sums[_WIDTH] + moved] for name, sums in held.items()}
            for name, sums in table.items():
                _add_first(held, name, sums, offset)

        for stack, table in subtree.items():
            shorter = self.owners(stack[:-1]) if stack else ()
            for owner in self.owners(stack)[len(shorter):]:  # a stack's owners begin with the shorter one's
                credit(owner, table, 0)
        # the modules in the order the per-group booking meets them: each stack's owners, by
        # the stack's first event (a grafted replay's stacks: its owners, credited here too)
        seen: Dict[str, Any] = {}  # owner -> None; then (ops, total); then ops (module_ops)
        for item in sequence:
            if not _is_graft(item):
                for owner in self.owners(item):
                    seen[owner] = None
                continue
            replay, group, offset = item
            if not group.order:
                continue  # no costed op: no node (as its events, each without a handler)
            tables, parents, representatives = group.subtree(replay)
            owners: List[Tuple[str, ...]] = []
            root_depth = len(replay.root)
            for j, (k, below) in enumerate(representatives):
                path = replay.stacks[k]
                length = root_depth + below
                node = path if length == len(path) else path[:length]
                shorter = self.owners(node[:-1]) if j == 0 else owners[parents[j]]  # the owners of the node one shorter
                named = self._owners_of(node, shorter)
                owners.append(named)
                for owner in named[len(shorter):]:  # a stack's owners begin with those of the stack one shorter
                    credit(owner, tables[j], offset)
            for k in group.order:
                for owner in owners[group.leaves[k]]:
                    seen[owner] = None
        # each owner's table once; owners of one table share what is made of it. The working
        # tables are let go first and ``seen`` (the owners, in order) is filled in place, then
        # becomes ``module_ops``: at most two tables by owner alive at once (issue #32, the
        # count's working set at the booking's peak)
        for working in (offsets, summed, alone, stacks, by_phase, made, grafted):
            working.clear()
        sequence.clear()
        finished: Dict[int, Tuple[Dict[str, List[int]], List[int]]] = {}
        nothing: Dict[str, List[int]] = {}
        for owner in seen:
            table = module_ops.get(owner, nothing)
            done = finished.get(id(table))
            if done is None:
                ops = _first_ordered(table)
                # each column summed in the ops' order, as a loop adding from 0 would (one C sum each)
                total = [sum(column) for column in zip(*ops.values())] if ops else [0] * _WIDTH
                done = finished[id(table)] = (ops, total)
            seen[owner] = done
        self._shared = len(finished) < len(seen)
        module_ops.clear()
        finished.clear()
        self.modules = {owner: done[1] for owner, done in seen.items()}
        for owner, done in seen.items():
            seen[owner] = done[0]
        self.module_ops = seen
        return self

    def _tallies(self, replay: ReplayedCall, group: _Group) -> None:
        """What a replay's events say besides figures, in event order: ops without a handler
        (with the innermost module of each) and estimate notes."""
        paths = replay.stacks
        for op, k, note in group.tallies:
            if note:
                self.notes[(op, note)] = self.notes.get((op, note), 0) + 1
            else:
                stack = paths[k]
                self._tally(op, stack[-1] if stack else "", None)

    def _graft(
        self, replay: ReplayedCall, group: _Group, stacks: Dict[Tuple[str, ...], Dict[str, List[int]]],
        by_phase: Dict[Tuple[str, str], List[int]], first: int, sequence: List[Any],
    ) -> int:
        """Book ``replay`` (its ops' tables ``group``) into :meth:`_book_tree`'s stack tables,
        its parts numbered from ``first``; gives back the number after its last part."""
        self._tallies(replay, group)
        paths = replay.stacks
        for k in group.order:
            path = paths[k]
            table = stacks.get(path)
            if table is None:
                table = stacks[path] = {}
                sequence.append(path)
            for name, sums in group.tables[k].items():
                _add_first(table, name, sums, first)
        for key, sums in group.phases.items():
            _add_first(by_phase, key, sums, first)
        return first + group.width

    def _unshare(self) -> None:
        """Give each owner lists of its own before booking into a tree-booked ledger (whose
        owners of equal subtrees share them)."""
        if self._shared:
            self.module_ops = {name: {op: list(sums) for op, sums in ops.items()} for name, ops in self.module_ops.items()}
            self.modules = {name: list(sums) for name, sums in self.modules.items()}
            self._shared = False

    def rebook(self, event: OpEvent, old: Cost, new: Cost) -> None:
        """The same event ran at another cost (a decode step's longer keys): ``old`` out,
        ``new`` in, part by part; call counts are unchanged."""
        op = event.call.op
        for sign, cost in ((-1, old), (1, new)):
            for name, part in cost.parts or ((op, cost),):
                self._book(event.module_stack, name, event.phase, _vector(part, 0), sign)

    def rebook_group(self, events: Sequence[OpEvent], old: Cost, new: Cost) -> None:
        """Every event of ``events`` ran at ``new`` instead of ``old`` (the same attention call in
        each of 80 layers, one decode step later): the same as :meth:`rebook` per event, booked
        once per key with the change times the number of events booked under it. Exact: the
        figures are integers (else each event is rebooked as before)."""
        changed = cost_change(events[0].call.op if events else "", old, new)
        if not changed:
            return
        self._unshare()
        if self.keeps_rows or not all(type(v) is int for d in changed.values() for v in d):
            for event in events:
                self.rebook(event, old, new)
            return
        phases: Dict[str, int] = {}
        owners: Dict[str, int] = {}
        for event in events:
            phases[event.phase] = phases.get(event.phase, 0) + 1
            for owner in self.owners(event.module_stack):
                owners[owner] = owners.get(owner, 0) + 1
        for name, d in changed.items():
            _add(self.operators, name, [len(events) * v for v in d])
            for phase, times in phases.items():
                _add(self.phases, phase, [times * v for v in d])
            for owner, times in owners.items():
                scaled = [times * v for v in d]
                _add(self.modules, owner, scaled)
                _add(self.module_ops.setdefault(owner, {}), name, scaled)

    def _book(
        self, stack: Tuple[str, ...], op: str, phase: str, sums: Sums, sign: int,
        times: Optional[Sequence[float]] = None, labels: Optional[Labels] = None,
    ) -> None:
        self._unshare()
        owners = self.owners(stack)
        _add(self.operators, op, sums, sign)
        _add(self.phases, phase, sums, sign)
        for name in owners:
            _add(self.modules, name, sums, sign)
            _add(self.module_ops.setdefault(name, {}), op, sums, sign)
        if not self.keeps_rows:
            return
        row = (op, stack[-1] if stack else "", phase)
        _add(self.rows, row, sums, sign)
        keyed: Tuple[Tuple[str, Tuple[Any, ...]], ...] = (
            ("operators", (op,)), ("phases", (phase,)), ("modules", owners), ("rows", (row,)),
        )
        for table, keys in keyed:
            for key in keys:
                if times is not None:
                    _add_columns(self.times[table], key, times, sign)
                if labels is not None:
                    _merge_labels(self.marks[table], key, labels)

    def cost_rows(self, table: str) -> Dict[Any, CostRow]:
        """``{key: CostRow}`` of one table (:data:`TABLES`), its booked columns and labels
        filled in; the tables that sum over phases give their rows :func:`summed_phase`."""
        if table not in TABLES:
            raise ValueError(f"table must be one of {', '.join(TABLES)}, got {table!r}")
        source: Mapping[Any, Sums] = getattr(self, table)
        phase = summed_phase(self.phases)
        times, marks = self.times[table], self.marks[table]
        made: Dict[Any, CostRow] = {}
        for key, sums in source.items():
            extra: Dict[str, Any] = dict(zip(self.columns, times.get(key, [0.0] * len(self.columns))))
            extra.update((label, value) for label, value in zip(self.labels, marks.get(key, ())) if value is not None)
            made[key] = cost_row(table, key, sums, phase, **extra)
        return made

    def total(self) -> Sums:
        return list(self.modules.get("", [0] * _WIDTH))


def summed_phase(phases: Iterable[str]) -> str:
    """The phase of a row that sums over phases (by operator, by module): the one phase
    booked, else "all"."""
    booked = list(phases)
    return booked[0] if len(booked) == 1 else "all"


def cost_row(table: str, key: Any, sums: Sequence[float], phase: str, **columns: Any) -> CostRow:
    """The :class:`CostRow` of ``key`` in one table (:data:`TABLES`), ``sums`` its booked
    totals in :data:`TOTAL_FIELDS` order; the one convention of every reading's rows: a
    "rows" key is (op, module, phase); an operator's row has module "" and a module's row
    its own name as module, both with ``phase`` (:func:`summed_phase`); a phase's row is
    named by its phase. ``columns``: the time columns and labels booked beside (CostRow fields)."""
    if table == "rows":
        name, module, row_phase = key
    else:
        name = key
        module = key if table == "modules" else ""
        row_phase = key if table == "phases" else phase
    calls, macs, flops, bytes_read, bytes_written = sums
    return CostRow(name, module, row_phase, calls=calls, flops=flops, macs=macs, bytes_read=bytes_read,
                   bytes_written=bytes_written, **columns)
