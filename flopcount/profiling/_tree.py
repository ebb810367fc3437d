"""The join of profiled op calls with counted op events (plain data; no torch).

The join step runs under the profiler with flopcount's dispatch recorder, which wraps each
recorded op in a profiler range ``flopcount#<event index>``: an op's marker lies inside its own
node, a composite's encloses the top-level op nodes it ran. The timed steps' top-level op
sequences are aligned to the join step's by (name, input shapes), and each timed node's time
goes to its twin's events (docs/profile.md, "The join step").
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

MARKER = "flopcount#"
STEP = "flopcount.step#"
_OP_NAME = re.compile(r"^\w+::\w+(\.\w+)?$")
_NOT_OPS = ("profiler::", "autograd::")

Shapes = Tuple[Tuple[int, ...], ...]
Key = Tuple[str, Shapes]


@dataclass
class Node:
    """One profiled range: an op call, a marker, a step; times in microseconds."""

    name: str
    start: float
    end: float
    self_cpu: float = 0.0
    self_device: float = 0.0
    shapes: Shapes = ()
    ident: int = -1
    children: List[Node] = field(default_factory=list)

    @property
    def marker(self) -> Optional[int]:
        """The event index of a ``flopcount#N`` range, else None."""
        return int(self.name[len(MARKER):]) if self.name.startswith(MARKER) else None

    @property
    def is_op(self) -> bool:
        return bool(_OP_NAME.match(self.name)) and not self.name.startswith(_NOT_OPS)

    @property
    def key(self) -> Key:
        return (self.name, self.shapes)


def from_profiler(events: Iterable[Any]) -> List[Node]:
    """Root nodes of the profiler's ``FunctionEvent`` forest (every thread)."""
    made: Dict[int, Node] = {}
    roots: List[Node] = []
    ordered = list(events)
    for event in ordered:
        made[id(event)] = Node(
            event.name,
            float(event.time_range.start),
            float(event.time_range.end),
            float(event.self_cpu_time_total),
            float(getattr(event, "self_device_time_total", 0.0) or 0.0),
            _shapes(getattr(event, "input_shapes", None)),
            int(event.id),
        )
    for event in ordered:
        node = made[id(event)]
        parent = event.cpu_parent
        if parent is None or id(parent) not in made:
            roots.append(node)
        else:
            made[id(parent)].children.append(node)
    for node in made.values():
        node.children.sort(key=lambda n: n.start)
    roots.sort(key=lambda n: n.start)
    return roots


def _shapes(shapes: Any) -> Shapes:
    if not shapes:
        return ()
    out = []
    for shape in shapes:
        try:
            out.append(tuple(int(d) for d in shape))
        except (TypeError, ValueError):
            out.append(())
    return tuple(out)


def cpu_total(node: Node) -> float:
    """Self CPU time of the node and everything under it (= its inclusive CPU time)."""
    return node.self_cpu + sum(cpu_total(c) for c in node.children)


def device_total(node: Node) -> float:
    """Device time of the kernels the node and everything under it launched."""
    return node.self_device + sum(device_total(c) for c in node.children)


def walk(roots: Sequence[Node]) -> Iterable[Node]:
    for root in roots:
        yield root
        yield from walk(root.children)


def steps(roots: Sequence[Node]) -> List[Node]:
    """The ``flopcount.step#N`` ranges, in order."""
    return sorted((n for n in walk(roots) if n.name.startswith(STEP)), key=lambda n: n.start)


@dataclass
class TopOp:
    """A top-level op node and, in the join step, the counted events it carries."""

    node: Node
    composite: Optional[int] = None  # the event of an enclosing composite marker
    owners: List[Tuple[int, Tuple[int, ...]]] = field(default_factory=list)  # (event, path of its node)

    @property
    def events(self) -> List[int]:
        found = [index for index, _ in self.owners]
        if self.composite is not None:
            found.insert(0, self.composite)
        return found


def top_ops(roots: Sequence[Node]) -> List[TopOp]:
    """Every op node with no op node above it, by start time, with the composite marker
    around it (if any) and the op markers inside it (join step)."""
    found: List[TopOp] = []

    def visit(node: Node, composite: Optional[int]) -> None:
        if node.is_op:
            top = TopOp(node, composite)
            _collect_owners(node, (), top.owners)
            found.append(top)
            return
        inner = node.marker if node.marker is not None else composite
        for child in node.children:
            visit(child, inner)

    for root in roots:
        visit(root, None)
    found.sort(key=lambda t: t.node.start)
    return found


def clean_children(node: Node) -> List[Node]:
    """The node's children with marker ranges spliced out (as an unmarked run has them)."""
    out: List[Node] = []
    for child in node.children:
        if child.marker is not None:
            out.extend(clean_children(child))
        else:
            out.append(child)
    return out


def _markers_under(node: Node) -> List[int]:
    found: List[int] = []
    for child in node.children:
        if child.marker is not None:
            found.append(child.marker)
            found.extend(_markers_under(child))
    return found


def _collect_owners(node: Node, path: Tuple[int, ...], into: List[Tuple[int, Tuple[int, ...]]]) -> None:
    into.extend((index, path) for index in _markers_under(node))
    for position, child in enumerate(clean_children(node)):
        _collect_owners(child, path + (position,), into)


@dataclass
class Alignment:
    """``pairs``: timed position -> join position of the top-level ops both runs share;
    ``swaps``: (join positions, timed positions) of each stretch between two shared ops
    where the runs differ (the timed run took a fused fast path, say)."""

    pairs: Dict[int, int] = field(default_factory=dict)
    swaps: List[Tuple[List[int], List[int]]] = field(default_factory=list)


def _loose(key: Key) -> Key:
    """The key with an in-place spelling read as its out-of-place op (autograd accumulates a
    gradient in place or not depending on who holds references: ``add_`` or ``add``)."""
    name, shapes = key
    return (name.rstrip("_") if not name.endswith("__") else name, shapes)


def align(join: Sequence[Key], timed: Sequence[Key]) -> Alignment:
    """Line the timed step's top-level ops up with the join step's (difflib's longest
    matching blocks over (name, input shapes), in-place spellings read as out-of-place)."""
    matcher = difflib.SequenceMatcher(None, [_loose(k) for k in join], [_loose(k) for k in timed], autojunk=False)
    found = Alignment()
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            for k in range(i2 - i1):
                found.pairs[j1 + k] = i1 + k
        elif tag == "replace":
            found.swaps.append((list(range(i1, i2)), list(range(j1, j2))))
    return found


def _follow(node: Node, path: Tuple[int, ...]) -> Optional[Node]:
    for position in path:
        children = clean_children(node)
        if position >= len(children):
            return None
        node = children[position]
    return node


def attribute(node: Node, carried: TopOp, measure: Callable[[Node], float]) -> Dict[int, float]:
    """``{event: time}`` of a timed top-level node whose join-step twin is ``carried``:
    one event takes it all; several share it, each its own node's subtree first and the
    remainder (the wrapper's own time) in proportion (equally when all are zero)."""
    events = carried.events
    total = measure(node)
    if not events:
        return {}
    if len(events) == 1 or carried.composite is not None:
        share = total / len(events)
        return {index: share for index in events}
    own: Dict[int, float] = {}
    for index, path in carried.owners:
        found = _follow(node, path)
        own[index] = own.get(index, 0.0) + (measure(found) if found is not None else 0.0)
    # scaled to the total: the wrapper's own time shared in proportion, and nested owners (an
    # event's node under another's), which would be counted twice, capped
    claimed = sum(own.values())
    if claimed > 0:
        return {index: value * total / claimed for index, value in own.items()}
    return {index: total / len(own) for index in own}


def shared_without_measure(node: Node, carried: TopOp, measure: Callable[[Node], float]) -> bool:
    """True when :func:`attribute` divides ``node``'s time among several events without a
    measured node of their own (a composite's events, or owners whose nodes took no
    time): their times are then a model of the split, not a measurement."""
    return len(carried.events) > 1 and (carried.composite is not None or all(
        (found := _follow(node, path)) is None or measure(found) <= 0 for _, path in carried.owners))
