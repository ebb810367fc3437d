"""A training step's repeated layers replayed exactly instead of traced (issue #32).

The step's memory figures are functions of MemTracker's timeline (live bytes by device and
category after every op, the modules running, the phase). For a stack of identical layers (or
of one repeated unit of ``period`` layers, after a ``head`` of other kinds) the N-layer timeline
is the 3-unit step's with the middle unit's stretch repeated, shifted and renamed: the step runs
on a copy cut to 3 units (the template) and 4 (the check), and only where the check's whole
timeline is the template's stretched to 4 are the N-unit figures computed from the template.
Where it applies (:func:`find_stack`), and why not elsewhere: docs/memory.md, "Reused since:
the step's repeated layers". Anything else is traced in full; ``FLOPCOUNT_REUSE=0`` turns it off.
"""

from __future__ import annotations

import contextlib
import functools
import types
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, FrozenSet, Iterator, List, Mapping, Optional, Sequence, Tuple

import torch
from torch import nn

from flopcount.core import hooks

__all__ = ["MIN_LAYERS", "Figures", "Replay", "Stack", "Template", "categories", "find_stack", "normalized", "record_forward_calls", "truncated"]

#: fewer layers than this are traced in full. The replay traces 7 layers (the template's 3 and
#: the check's 4) and walks the parent over all of them, so on a shallow stack it costs more
#: than the full trace: measured (benchmarks/replay_crossover.py, CPU medians, tiny LLaMA /
#: GPT-2 / BERT, load ~1-4; docs/performance.md, "replaymin"), replay / full at 6 layers
#: 1.2-2.0, at 8 layers 0.9-1.8, at 10 layers 0.7-1.4 (estimate_memory still slower on most
#: stacks), at 12 layers 0.7-1.0 in every reading, at 16 layers 0.5-1.0 (one noisy 1.25).
#: The figures are the same either way; only the time differs.
MIN_LAYERS = 12

#: a period longer than one layer is taken only where the stack holds at least this many units
#: (the check runs 4: a stack of fewer cannot be checked), and :data:`MIN_LAYERS` of them: units of
#: 2 layers measured (benchmarks/replay_crossover.py --models gemma2 gpt_oss, CPU medians, load
#: 6-7; docs/performance.md, "periodreplay") replay / full at 4 units 1.8-2.3, at 6 units
#: 1.1-1.5, at 8 units 0.7-1.2, at 10 units 0.8-0.9, at 12 units 0.7-1.0: the same floor in units
_MIN_UNITS = 4

#: a record of the timeline: (kind: "op" | "pre" | "post", live bytes by (device, category),
#: module names (the running ones for an op, the hooked module's for "pre"/"post"), phase,
#: the layer an optimizer op touched or None)
Record = Tuple[str, Dict[Tuple[Any, Any], int], FrozenSet[str], str, Optional[int]]

_SCALARS = (int, float, bool, str, type(None), complex, torch.dtype, torch.device)


@dataclass
class Figures:
    """What a step's memory reading reads off its tracker, by MemTracker's module names
    (``fqn``): the peak's total, its bytes by device and category, the modules running and
    the phase then, each module's own peak, and the Activation bytes at each forward
    call's entry and exit (in call order)."""

    peak_total: int
    peak_snapshot: Dict[Any, Dict[Any, int]]
    peak_where: FrozenSet[str]
    peak_phase: str
    module_peaks: Dict[str, int]
    forward_calls: Dict[str, Tuple[List[int], List[int]]] = field(default_factory=dict)
    #: MemTracker's name of each module of the model (None: never named, never ran)
    names: Dict[nn.Module, Optional[str]] = field(default_factory=dict)


# --------------------------------------------------------------------------- the repeated layers


class _IndexRead(Exception):
    """The cut copy's step read an attribute that differs between layers."""


class _Hidden:
    """Stands for a layer attribute whose value differs between layers while the cut copy
    runs: any use of it raises, so a step that reads it is traced in full instead."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def _refuse(self, *args: Any, **kwargs: Any) -> Any:
        raise _IndexRead(f"the step read the per-layer attribute {self.name!r}")

    __bool__ = __int__ = __index__ = __float__ = __hash__ = __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = _refuse
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __mod__ = __floordiv__ = __truediv__ = _refuse
    __str__ = __repr__ = __format__ = __iter__ = __len__ = __getitem__ = __call__ = __getattr__ = _refuse


@dataclass(frozen=True)
class Stack:
    """The model's repeated layers: ``layers`` (a ModuleList or Sequential) and, per layer,
    the (module, attribute) pairs whose values differ between layers of one kind. ``period``:
    layer ``j`` is built as layer ``j % period`` (1: every layer alike; 2: Gemma-2's sliding and
    full attention in turn); the replay's unit is ``period`` consecutive layers."""

    layers: nn.Module
    differing: Tuple[Tuple[Tuple[nn.Module, str], ...], ...]
    period: int = 1
    #: the layers before the repeated run (0: every layer is in it): layers of other kinds
    #: (DeepSeek-V3's dense layers before its mixture-of-experts ones), run as they are in every
    #: cut run; the run's layer ``i`` is the list's layer ``head + i``
    head: int = 0

    def __len__(self) -> int:
        return len(self.layers._modules)

    @property
    def units(self) -> int:
        """How many units of ``period`` layers the repeated run (the layers after the head) holds."""
        return (len(self) - self.head) // self.period

    def kept(self, units: int) -> int:
        """The layers a cut run keeps to hold the head and ``units`` units of the run."""
        return self.head + units * self.period

    def layer(self, index: int) -> nn.Module:
        found = list(self.layers._modules.values())[index]
        assert found is not None
        return found


def find_stack(model: nn.Module) -> Optional[Stack]:
    """The longest run of layers of ``model`` that can be replayed, or None: a whole list of
    identical layers, or else (:func:`_stack`) of a repeated unit of ``period`` layers, the shortest
    period that holds; else (:func:`_headed`) the longest run after a head of layers of other kinds."""
    if hooks.process_hooks_present() or any(hooks.has_call_hooks(m) for m in model.modules()):
        return None
    module_seen = Counter(id(module) for _, module in model.named_modules(remove_duplicate=False))
    param_seen = Counter(id(param) for _, param in model.named_parameters(remove_duplicate=False))
    candidates = [
        m for m in model.modules()
        if type(m) in (nn.ModuleList, nn.Sequential) and len(m._modules) >= MIN_LAYERS
        and all(c is not None for c in m._modules.values())
    ]
    lists = []
    for layers in sorted(candidates, key=lambda m: -len(m._modules)):
        found = _layers(layers, module_seen, param_seen)
        if found is None:
            continue
        stack = _stack(found)
        if stack is not None:
            return stack
        lists.append(found)
    headed = [stack for stack in map(_headed, lists) if stack is not None]
    return max(headed, key=lambda stack: len(stack) - stack.head, default=None)  # the first of the longest runs


@dataclass
class _Layers:
    """A candidate list of layers: its layers, their signatures (the count's reuse keys') and each
    one's modules in order."""

    layers: nn.Module
    signatures: List[Any]
    walks: List[List[nn.Module]]


def _layers(layers: nn.Module, module_seen: Mapping[int, int], param_seen: Mapping[int, int]) -> Optional[_Layers]:
    """``layers`` (numbered 0, 1, ...) with its layers' signatures and modules, or None where a
    module or parameter of a layer is reachable twice in the model."""
    from flopcount.tracers._reuse import _signature  # the count's reuse keys: the same signature first

    children = [m for m in layers._modules.values() if m is not None]
    if list(layers._modules) != [str(i) for i in range(len(children))]:
        return None
    memo: Dict[int, Any] = {}
    signatures = [_signature(layer, memo) for layer in children]
    walks = [list(layer.modules()) for layer in children]
    for walk in walks:
        for module in walk:
            if module_seen.get(id(module), 0) != 1:
                return None
            if any(param_seen.get(id(p), 0) != 1 for p in module._parameters.values() if p is not None):
                return None
    return _Layers(layers, signatures, walks)


def _stack(found: _Layers) -> Optional[Stack]:
    """The whole list ``found`` as a :class:`Stack` of the shortest period that holds (1 first, as
    before periods were tried; then 2, 3, ... where it holds at least :data:`MIN_LAYERS` units of
    it, and at least the check's 4, and the period divides its length: no tail of another kind),
    or None."""
    signatures = found.signatures
    for period in range(1, len(signatures) // max(MIN_LAYERS, 1) + 1):
        if period > 1 and (len(signatures) % period or len(signatures) // period < _MIN_UNITS):
            continue
        if any(signature != signatures[j % period] for j, signature in enumerate(signatures)):
            continue
        stack = _run(found, 0, period)
        if stack is not None:
            return stack
    return None


def _headed(found: _Layers) -> Optional[Stack]:
    """``found``'s longest replayable run after a head of at least one layer (the whole list was
    tried first), or None. For each period, the shortest head after which every layer's signature is
    the one ``period`` layers on (then longer by what makes the period divide the run) and the run
    still holds :data:`MIN_LAYERS` units (and the check's 4); the shortest head first, then the
    shortest period, taken as :func:`_stack` takes a whole list (:func:`_run`: every test, within the run)."""
    signatures = found.signatures
    count = len(signatures)
    tried = []
    for period in range(1, count // max(MIN_LAYERS, 1) + 1):
        head = count - period  # the last ``period`` layers: a run of one unit
        while head > 0 and signatures[head - 1] == signatures[head - 1 + period]:
            head -= 1
        head += (count - head) % period
        units = (count - head) // period
        if head == 0 or units < max(MIN_LAYERS, 1) or (period > 1 and units < _MIN_UNITS):
            continue
        tried.append((head, period))
    for head, period in sorted(tried):
        stack = _run(found, head, period)
        if stack is not None:
            return stack
    return None


def _run(found: _Layers, head: int, period: int) -> Optional[Stack]:
    """The layers of ``found`` after the first ``head``, whose signatures repeat every ``period``
    layers, as a :class:`Stack` where their modules differ in plain scalars only (:func:`_periodic`),
    else None."""
    differing = _periodic(found.walks[head:], period)
    if differing is None:
        return None
    return Stack(found.layers, ((),) * head + differing, period, head)


def _periodic(walks: List[List[nn.Module]], period: int) -> Optional[Tuple[Tuple[Tuple[nn.Module, str], ...], ...]]:
    """Per layer, the (module, attribute) pairs whose plain scalar values differ between the
    layers of its kind (layers ``j`` and ``j + period``: compared with the middle unit's layer of
    that kind), or None when two layers of one kind differ in anything else."""
    differing: List[List[set]] = [[set() for _ in walks[period + kind]] for kind in range(period)]
    for j, walk in enumerate(walks):
        template = walks[period + j % period]
        if len(walk) != len(template):
            return None
        for position, (a, b) in enumerate(zip(template, walk)):
            names = _unequal(a, b)
            if names is None:
                return None
            differing[j % period][position] |= names
    return tuple(
        tuple((module, name) for position, module in enumerate(walk) for name in sorted(differing[j % period][position]))
        for j, walk in enumerate(walks)
    )


def _unequal(a: nn.Module, b: nn.Module) -> Optional[set]:
    """The plain scalar attributes of ``a`` and ``b`` that differ, or None when the two
    modules differ in anything else (class, tensors' metadata, other attributes)."""
    if type(a) is not type(b):
        return None
    va, vb = vars(a), vars(b)
    if va.keys() != vb.keys() or "forward" in va:
        return None
    out = set()
    for name, x in va.items():
        y = vb[name]
        if name == "_modules":
            if list(x) != list(y):
                return None
        elif name in ("_parameters", "_buffers"):
            if list(x) != list(y) or any(not _same_tensor(x[k], y[k]) for k in x):
                return None
        elif isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
            if not _same_tensor(x, y):
                return None
        elif hooks.is_hook_name(name) and isinstance(x, dict):
            if x or y:
                return None
        elif x is y:
            continue
        elif type(x) is type(y) and isinstance(x, _SCALARS):
            if x != x and y != y:  # both nan
                continue
            if x != y:
                out.add(name)
        elif type(x) is type(y) and isinstance(x, (tuple, list, set, frozenset)) and all(isinstance(v, _SCALARS) for v in (*x, *y)):
            if x != y:
                return None
        elif not _same_callable(x, y, a, b):
            return None
    return out


def _same_callable(x: Any, y: Any, a: nn.Module, b: nn.Module) -> bool:
    """Whether ``x`` (an attribute of ``a``) and ``y`` (the same attribute of ``b``) are one
    function in effect: two ``functools.partial`` objects of one function with equal scalar
    arguments (or the same objects), as transformers' ``GELUTanh`` makes one per layer
    (``partial(gelu, approximate="tanh")``), or each module's own method of one function
    (``self._gelu_tanh_python``). Anything else is not proven the same."""
    if type(x) is functools.partial and type(y) is functools.partial:
        return (
            _same_callable(x.func, y.func, a, b)
            and _same_values(x.args, y.args)
            and x.keywords.keys() == y.keywords.keys()
            and _same_values(tuple(x.keywords.values()), tuple(y.keywords[k] for k in x.keywords))
        )
    if type(x) is types.MethodType and type(y) is types.MethodType:
        return x.__func__ is y.__func__ and x.__self__ is a and y.__self__ is b
    return x is y


def _same_values(xs: Tuple[Any, ...], ys: Tuple[Any, ...]) -> bool:
    """Equal item by item: one object, or scalars of one type that compare equal."""
    if len(xs) != len(ys):
        return False
    for x, y in zip(xs, ys):
        if x is y:
            continue
        if not (type(x) is type(y) and isinstance(x, _SCALARS) and x == y):
            return False
    return True


def _same_tensor(x: Any, y: Any) -> bool:
    if x is None or y is None:
        return x is y
    if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor):
        return False
    return (
        type(x) is type(y) and x.shape == y.shape and x.stride() == y.stride() and x.dtype == y.dtype
        and x.device == y.device and x.requires_grad == y.requires_grad and x.layout == y.layout
    )


@contextlib.contextmanager
def truncated(stack: Stack, keep: int) -> Iterator[None]:
    """``stack``'s layers cut to the first ``keep`` while the block runs, their per-layer
    attributes replaced by stand-ins that refuse to be read; everything put back after."""
    modules = stack.layers._modules
    saved = dict(modules)
    swapped: List[Tuple[nn.Module, str, Any]] = []
    try:
        for index in range(keep, len(saved)):
            del modules[str(index)]
        for pairs in stack.differing[:keep]:
            for module, name in pairs:
                swapped.append((module, name, module.__dict__[name]))
                module.__dict__[name] = _Hidden(name)
        yield
    finally:
        for module, name, value in swapped:
            module.__dict__[name] = value
        modules.clear()
        modules.update(saved)


def local_shard(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (``to_local()`` under no_grad: no autograd op), else ``tensor``."""
    to_local = getattr(tensor, "to_local", None)  # DTensor's public method; plain tensors have none
    if to_local is None:
        return tensor
    with torch.no_grad():
        local: torch.Tensor = to_local()
    return local


def layer_tensors(stack: Stack, keep: int, optimizer: Any) -> Dict[int, Tuple[int, torch.Tensor]]:
    """``id(tensor) -> unit`` (:attr:`Stack.period` layers; a layer where every layer is alike)
    for the first ``keep`` layers' parameters, their gradients and their optimizer state: which
    unit an optimizer op works on."""
    table: Dict[int, Tuple[int, torch.Tensor]] = {}  # the tensor kept too: its id is not reused
    state = getattr(optimizer, "state", {}) if optimizer is not None else {}

    def note(tensor: Any, unit: int) -> None:
        if isinstance(tensor, torch.Tensor):
            for each in (tensor, local_shard(tensor)):  # a DTensor (plan): its ops run on its local shard
                table[id(each)] = (unit, each)

    for index in range(stack.head, keep):  # a head's layers belong to no unit: run as the code around the run
        unit = (index - stack.head) // stack.period
        for param in stack.layer(index).parameters():
            note(param, unit)
            note(param.grad, unit)
            for value in state.get(param, {}).values():
                note(value, unit)
    return table


@dataclass
class Replay:
    """What a cut run of plan's step (``stack`` cut to ``keep`` layers) keeps for the replay:
    the tracker's timeline, the optimizer once made (after the model is sharded: which layer
    an optimizer op touches, :meth:`layer_tensors`), and (after the run) the recorder and tracker."""

    timeline: List[Record]
    stack: Stack
    keep: int
    optimizer: Any = None
    recorder: Any = None
    tracker: Any = None

    def layer_tensors(self) -> Dict[int, Tuple[int, torch.Tensor]]:
        return layer_tensors(self.stack, self.keep, self.optimizer)


@contextlib.contextmanager
def record_forward_calls(model: nn.Module, tracker: Any, timeline: List[Record]) -> Iterator[None]:
    """Each forward call of ``model``'s modules recorded on ``timeline`` at entry and exit
    (the live bytes then), as MemTracker snapshots them (its process-wide hooks run just
    before these; calls made again in the backward, recomputation, are not recorded, as
    MemTracker does not record them)."""
    handles = []

    def note(kind: str, module: nn.Module) -> None:
        modtracker = tracker._mod_tracker
        if modtracker.is_bw:
            return
        fqn = modtracker.get_known_fqn(module)
        timeline.append((kind, snapshot(tracker), frozenset((fqn,)), "forward", None))

    try:
        for module in model.modules():
            handles.append(module.register_forward_pre_hook(lambda m, args: note("pre", m)))
            handles.append(module.register_forward_hook(lambda m, args, out: note("post", m)))
        yield
    finally:
        for handle in handles:
            handle.remove()


def snapshot(tracker: Any) -> Dict[Tuple[Any, Any], int]:
    """The tracker's live bytes now, flat: ``{(device, category): bytes}``, zeros left out."""
    return {(dev, key): value for dev, values in tracker._curr_mem_snap.items() for key, value in values.items() if value}


def normalized(snap: Mapping[Tuple[Any, Any], int]) -> Dict[Tuple[Any, Any], int]:
    """``snap`` as MemTracker would hold it: zeros left out, and a device whose total is 0
    not there at all (MemTracker drops a device when its total reaches 0)."""
    empty = {dev for (dev, key), value in snap.items() if key == "Total" and value == 0}
    present = {dev for (dev, key) in snap if key == "Total"}
    return {(dev, key): v for (dev, key), v in snap.items() if v and dev in present and dev not in empty}


def _shifted(snap: Mapping[Tuple[Any, Any], int], offset: Mapping[Tuple[Any, Any], int]) -> Dict[Tuple[Any, Any], int]:
    return normalized(_plus(snap, offset)) if offset else dict(snap)


def _plus(a: Mapping[Any, int], b: Mapping[Any, int], times: int = 1) -> Dict[Any, int]:
    out = dict(a)
    for key, value in b.items():
        out[key] = out.get(key, 0) + times * value
    return {k: v for k, v in out.items() if v}


def _total(snap: Mapping[Tuple[Any, Any], int]) -> int:
    return sum(v for (dev, key), v in snap.items() if key == "Total")


def _category(key: Any) -> str:
    return str(getattr(key, "value", key))  # a _RefType enum member, or "Total"


def categories(snapshot: Mapping[Any, Mapping[Any, int]]) -> Dict[str, int]:
    """A MemTracker snapshot's bytes (``{device: {category: bytes}}``) by category name
    (``"Total"`` included), summed over the devices."""
    out: Dict[str, int] = {}
    for values in snapshot.values():
        for key, value in values.items():
            out[_category(key)] = out.get(_category(key), 0) + int(value)
    return out


def _activation(snap: Mapping[Tuple[Any, Any], int]) -> int:
    return sum(v for (dev, key), v in snap.items() if _category(key) == "Activation")


# --------------------------------------------------------------------------- the template


_ORDER = ("forward", "backward", "optimizer")


@dataclass
class _Piece:
    """A stretch ``[start, stop)`` of the template's timeline, and how it is placed in the
    N-layer timeline: ``middle`` (the middle layer's stretch of ``phase``, repeated) or fixed."""

    start: int
    stop: int
    middle: bool
    phase: str
    delta: Dict[Tuple[Any, Any], int] = field(default_factory=dict)
    #: a middle piece's: layer 1's names still running when the next layer's stretch begins
    residue: FrozenSet[str] = frozenset()
    #: a fixed piece's: the middle piece before it (its layer-1 names are that phase's last middle layer's)
    after: Optional[_Piece] = None
    #: a fixed piece's: bytes each middle layer's forward left that die as the piece begins (the
    #: casts of the layer's parameters autocast's cache kept until the forward's autocast ended)
    released: Dict[Tuple[Any, Any], int] = field(default_factory=dict)


class Template:
    """The 3-unit step's timeline cut into pieces: before unit 1's forward stretch, that
    stretch, until unit 1's backward stretch, that stretch, until its optimizer stretch,
    that stretch, the rest (the phases the step has). A unit is ``period`` consecutive layers
    (:attr:`Stack.period`; one layer where every layer is alike): every count below is of units.
    ``head``: the layers before the run (:attr:`Stack.head`), in no unit: their records are the code's
    around the run, fixed, their names their own in every step."""

    UNITS = 3

    def __init__(
        self, records: Sequence[Record], prefix: str, pieces: List[_Piece], labels: List[Optional[int]], period: int = 1,
        head: int = 0,
    ):
        self.records = records
        self.prefix = prefix
        self.pieces = pieces
        self.labels = labels
        self.period = period
        self.head = head
        #: bytes by (device, category) each unit holds from the step's start and the cut run's
        #: tracker did not see (:meth:`checked`)
        self.static: Dict[Tuple[Any, Any], int] = {}

    def checked(self, check: Sequence[Record]) -> bool:
        """Whether ``check``, the timeline of the same step cut to 4 units, is this template
        stretched to 4 units, record for record (learning first what one more unit holds
        from the start: the two first records' difference)."""
        if not check or not self.records:
            return False
        self.static = _plus(check[0][1], self.records[0][1], -1)
        made = self.materialize(self.UNITS + 1)  # optimizer labels aside
        return len(made) == len(check) and all(
            x[0] == y[0] and x[3] == y[3] and x[2] == y[2] and normalized(x[1]) == normalized(y[1]) for x, y in zip(made, check)
        )

    def spread(self, units: int, stamps: Sequence[int], items: Sequence[Any]) -> List[Any]:
        """``items`` recorded beside the template's timeline (an op event, a collective; each
        stamped with the timeline's length when it was recorded), placed as their pieces are in
        the ``units``-unit step: a middle piece's once per middle unit."""
        by_piece: Dict[int, List[Any]] = {id(piece): [] for piece in self.pieces}
        starts = [piece.start for piece in self.pieces]
        for stamp, item in zip(stamps, items):
            at = max(stamp - 1, 0)
            index = max(i for i, start in enumerate(starts) if start <= at or i == 0)
            by_piece[id(self.pieces[index])].append(item)
        return [item for piece, _, _ in self._placed(units) for item in by_piece[id(piece)]]

    @classmethod
    def of(
        cls, records: Sequence[Record], prefix: str, released: Sequence[Tuple[int, Mapping[Tuple[Any, Any], int]]] = (),
        autocast_left: Optional[int] = None, period: int = 1, head: int = 0,
    ) -> Optional[Template]:
        """``records`` of a 3-unit step (``prefix``: MemTracker's name of the layer list
        plus "."; ``period``: the layers a unit holds; ``head``: the list's layers before the
        run, in no unit), cut into pieces; None when its units are
        not met in a step's order. ``released``: (record index at its birth, bytes) of each cast
        freed when the forward's autocast ended, at record index ``autocast_left`` (the
        tracker's ``released_casts``, ``autocast_left``): the middle unit's are freed there for
        every middle unit. An optimizer op's label (``touched``) is already a unit
        (:func:`layer_tensors`)."""

        def unit(name: str) -> Optional[int]:
            return _unit(name, prefix, period, head)

        labels: List[Optional[int]] = []
        for kind, _, names, phase, touched in records:
            if kind == "op" and phase == "optimizer":
                labels.append(touched)
                continue
            # the unit running: in a backward, modules whose inputs need no gradient stay among
            # MemTracker's running modules after their backward (the newest is the lowest layer)
            found = {index for index in map(unit, names) if index is not None}
            labels.append((min(found) if phase == "backward" else max(found)) if found else None)
        first: Dict[Tuple[str, int], int] = {}
        runs: Dict[str, List[int]] = {}
        for i, (record, label) in enumerate(zip(records, labels)):
            if label is None:
                continue
            first.setdefault((record[3], label), i)
            run = runs.setdefault(record[3], [])
            if not run or run[-1] != label:
                run.append(label)
        expected = {"forward": [0, 1, 2], "backward": [2, 1, 0], "optimizer": [0, 1, 2]}
        pieces: List[_Piece] = []
        cursor = 0
        for phase in _ORDER:
            if phase not in runs:
                continue
            if runs[phase] != expected[phase]:
                return None
            start = first[(phase, 1)]
            stop = first[(phase, 0 if phase == "backward" else 2)]
            if start < cursor:
                return None
            pieces.append(_Piece(cursor, start, False, phase))
            delta = _plus(records[stop][1], records[start][1], -1)
            pieces.append(_Piece(start, stop, True, phase, delta))
            cursor = stop
        if not pieces:
            return None
        pieces.append(_Piece(cursor, len(records), False, "end"))
        if autocast_left is not None and not _release(pieces, released, autocast_left):
            return None
        last_middle: Optional[_Piece] = None
        for piece in pieces:
            if piece.middle:
                last_middle = piece
                # what unit 1 leaves running after it (in a backward, modules whose inputs need
                # no gradient): its names in every record of the next unit's stretch
                following = 0 if piece.phase == "backward" else 2
                later: List[FrozenSet[str]] = []
                for record in records[piece.stop:]:
                    if not any(unit(n) == following for n in record[2]):
                        break
                    later.append(record[2])
                left = [frozenset(n for n in names if unit(n) == 1) for names in later]
                piece.residue = frozenset.intersection(*left) if left else frozenset()
            else:
                piece.after = last_middle
        return cls(records, prefix, pieces, labels, period, head)

    def _placed(self, units: int) -> Iterator[Tuple[_Piece, Dict[Tuple[Any, Any], int], int]]:
        """Each piece's places in the ``units``-unit timeline: (piece, byte shift, the unit
        a middle piece stands for there; -1 for a fixed piece). Every byte count is also shifted
        by ``static`` per unit more: what each unit holds from the start (its parameters and
        optimizer state, where the cut run's tracker did not see the other units')."""
        extra = units - self.UNITS
        offset: Dict[Tuple[Any, Any], int] = _plus({}, self.static, extra)
        for piece in self.pieces:
            if not piece.middle:
                offset = _plus(offset, piece.released, -extra)
                yield piece, offset, -1
                continue
            for i in range(units - 2):
                target = units - 2 - i if piece.phase == "backward" else 1 + i
                yield piece, _plus(offset, piece.delta, i), target
            offset = _plus(offset, piece.delta, extra)

    def renamed(self, name: str, piece: _Piece, target: int, units: int) -> List[str]:
        """``name`` of the template in the ``units``-unit timeline (a unit's layers keep their
        place in it: :meth:`_moved`). In a middle piece standing for unit ``target``: unit 1 is
        ``target``, the unit before it in the phase's order (2 in a backward, 0 otherwise) is the
        one before ``target``, the one after likewise. In a fixed piece: unit 0 stays, unit 2 is
        the last, and unit 1 is the last middle unit the phase met, whose leftovers (the piece's
        residue) every other middle unit left too."""
        index = self._unit(name)
        if index is None:
            return [name]
        if piece.middle:
            back = piece.phase == "backward"
            if index == 1:
                return [self._moved(name, target)]
            before = (index == 2) if back else (index == 0)
            step = 1 if before == back else -1
            return [self._moved(name, target + step)]
        if index == 0:
            return [name]
        if index == 2:
            return [self._moved(name, units - 1)]
        middle = piece.after
        if middle is None:
            return [name]
        last = 1 if middle.phase == "backward" else units - 2
        out = [self._moved(name, last)]
        if name in middle.residue:
            out += [self._moved(name, k) for k in range(1, units - 1) if k != last]
        return out

    def left_running(self, piece: _Piece, target: int, units: int) -> List[str]:
        """The names the units met before the one before ``target`` in the piece's phase left running."""
        earlier = range(target + 2, units) if piece.phase == "backward" else range(0, target - 1)
        return [self._moved(name, k) for k in earlier for name in piece.residue]

    def _names(self, names: FrozenSet[str], piece: _Piece, target: int, units: int) -> FrozenSet[str]:
        out = [n for name in names for n in self.renamed(name, piece, target, units)]
        if piece.middle:
            out += self.left_running(piece, target, units)
        return frozenset(out)

    def materialize(self, units: int) -> List[Record]:
        """The whole timeline of the ``units``-unit step, record by record (the check)."""
        return [
            (kind, _shifted(snap, offset), self._names(names, piece, target, units), phase, None)
            for piece, offset, target in self._placed(units) for kind, snap, names, phase, _ in self.records[piece.start:piece.stop]
        ]

    def figures(self, units: int) -> Figures:
        """The ``units``-unit step's figures, computed a stretch at a time."""
        summaries = {id(piece): self._summary(piece) for piece in self.pieces}
        peak_total = -1
        peak: Optional[Tuple[Record, Dict[Tuple[Any, Any], int], _Piece, int]] = None
        module_peaks: Dict[str, int] = {}
        calls: Dict[str, Tuple[List[int], List[int]]] = {}

        def raise_peak(name: str, value: int) -> None:
            if module_peaks.get(name, -1) < value:
                module_peaks[name] = value

        for piece, offset, target in self._placed(units):
            best, best_at, maxima, hooked = summaries[id(piece)]
            shift = _total(offset)
            if best_at is not None and best + shift > peak_total:
                peak_total = best + shift
                peak = (self.records[best_at], offset, piece, target)
            for name, value in maxima.items():
                for renamed in self.renamed(name, piece, target, units):
                    raise_peak(renamed, value + shift)
            if piece.middle and best_at is not None:
                for name in self.left_running(piece, target, units):
                    raise_peak(name, best + shift)
            if hooked:
                act = _activation(offset)
                for kind, name, value in hooked:
                    for renamed in self.renamed(name, piece, target, units):
                        pre, post = calls.setdefault(renamed, ([], []))
                        (pre if kind == "pre" else post).append(value + act)
        if peak is None:
            return Figures(-1, {}, frozenset(), "forward", module_peaks, calls)
        record, offset, piece, target = peak
        nested: Dict[Any, Dict[Any, int]] = {}
        for (dev, key), value in _shifted(record[1], offset).items():
            nested.setdefault(dev, {})[key] = value
        return Figures(peak_total, nested, self._names(record[2], piece, target, units), record[3], module_peaks, calls)

    def _unit(self, name: str) -> Optional[int]:
        return _unit(name, self.prefix, self.period, self.head)

    def _moved(self, name: str, unit: int) -> str:
        """``name`` (a module of a layer of the run) moved to the layer in the same place of unit ``unit``."""
        index = _index(name, self.prefix)
        assert index is not None
        place = (index - self.head) % self.period
        return _moved(self.prefix, name, self.head + unit * self.period + place)

    def _summary(self, piece: _Piece) -> Tuple[int, Optional[int], Dict[str, int], List[Tuple[str, str, int]]]:
        best, best_at = -1, None
        maxima: Dict[str, int] = {}
        hooked: List[Tuple[str, str, int]] = []
        for i in range(piece.start, piece.stop):
            kind, snap, names, _, _ = self.records[i]
            if kind != "op":
                (name,) = names
                hooked.append((kind, name, _activation(snap)))
                continue
            total = _total(snap)
            if total > best:
                best, best_at = total, i
            for name in names:
                if maxima.get(name, -1) < total:
                    maxima[name] = total
        return best, best_at, maxima, hooked


def _release(pieces: List[_Piece], released: Sequence[Tuple[int, Mapping[Tuple[Any, Any], int]]], at: int) -> bool:
    """The bytes of ``released`` born in the forward's middle stretch, freed at record ``at``
    (where the forward's autocast ended), set as the ``released`` of a fixed piece beginning
    there (the one holding ``at`` split in two); False when ``at`` lies in a middle stretch."""
    forward = next((piece for piece in pieces if piece.middle and piece.phase == "forward"), None)
    if forward is None:
        return True
    freed: Dict[Tuple[Any, Any], int] = {}
    for born, grown in released:
        if forward.start <= born < forward.stop:
            freed = _plus(freed, grown)
    if not freed:
        return True
    for position, piece in enumerate(pieces):
        if not piece.start <= at < piece.stop:
            continue
        if piece.middle or piece.start < forward.stop:
            return False
        if piece.start == at:
            piece.released = freed
        else:
            pieces.insert(position + 1, _Piece(at, piece.stop, False, piece.phase, released=freed))
            piece.stop = at
        return True
    return True  # no record after the forward's autocast: nothing shown without those bytes


def _index(name: str, prefix: str) -> Optional[int]:
    if not name.startswith(prefix):
        return None
    head = name[len(prefix):].partition(".")[0]
    return int(head) if head.isdigit() else None


def _unit(name: str, prefix: str, period: int, head: int = 0) -> Optional[int]:
    """The unit of ``period`` layers holding the layer ``name`` is in (None: no layer's, or a
    layer of the ``head`` layers before the run)."""
    index = _index(name, prefix)
    return None if index is None or index < head else (index - head) // period


def layer_names(stack: Stack, known: Callable[[nn.Module], Optional[str]], prefix: str) -> Dict[nn.Module, str]:
    """MemTracker's names of every module of the run's layers (those the cut copies never ran
    too), made from the middle unit's layer of their kind's (the layers of a kind are the same
    tree); a head's layers ran in the cut copies under their own names."""
    out: Dict[nn.Module, str] = {}
    middle = stack.head + stack.period
    templates = [list(stack.layer(middle + kind).modules()) for kind in range(stack.period)]
    for index in range(stack.head, len(stack)):
        template = templates[(index - stack.head) % stack.period]
        for mine, model in zip(stack.layer(index).modules(), template):
            name = known(model)
            if name is not None:
                out[mine] = _moved(prefix, name, index)
    return out


def _moved(prefix: str, name: str, index: int) -> str:
    """``name`` (``prefix`` + a layer's index + the rest) moved to layer ``index``."""
    _, dot, tail = name[len(prefix):].partition(".")
    return f"{prefix}{index}{dot}{tail}"
