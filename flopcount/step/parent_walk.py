"""The parent's forward proven to treat every middle layer alike before a replay (issue #32).

:mod:`flopcount.step.replay`'s cut runs run the code *around* the layers for 3 and 4 units
only. So the parent's forward is walked on the whole model and on the model cut to 3 units,
each stack layer's call answered by a stand-in, and recorded as blocks (before the layers,
then each layer's call and the parent's ops after it): ops by metadata with their relative
producers, layer calls with their arguments and state, tensor hooks, autograd nodes and tensor
deaths. The proof: the whole model's walk is the cut model's with its middle block repeated.
What it sees and what it assumes: docs/memory.md, "The forward around the layers, proven on
the whole model".
"""

from __future__ import annotations

import functools
import gc
import types
import weakref
from collections import OrderedDict
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from flopcount.core import hooks
from flopcount.core.inputs import output_tensors  # plain recursion: no reference cycle while the collector is off
from flopcount.core.state import ClosureValues, forward_globals, object_state, plain_object
from flopcount.step.replay import Stack, truncated

__all__ = ["globals_state", "model_state", "parent_proven"]

_VALUES = (int, float, bool, str, type(None), complex, torch.dtype, torch.device, torch.layout, torch.memory_format)
_VALUE_TYPES = frozenset(_VALUES)


class _Broken(Exception):
    """The walk met something it cannot describe or a call out of order: no proof."""


class _Ref:
    """Which record made a tensor: block, index in the block, output position."""

    __slots__ = ("block", "index", "k")

    def __init__(self, block: int, index: int, k: int):
        self.block, self.index, self.k = block, index, k


class _Walk(TorchDispatchMode):
    """Records the parent's ops (outside every stack layer), answers the stack's layer calls."""

    def __init__(
        self, layers: List[nn.Module], hidden: Dict[int, frozenset], outputs: Dict[Any, Any], period: int = 1, head: int = 0,
    ):
        super().__init__()
        self.layers = layers
        self.period = period  # the layers a unit holds: the first and the last unit's blocks are named by place
        self.head = head  # the layers before the run: named by place with the first unit's
        self.position = {id(layer): i for i, layer in enumerate(layers)}
        self.hidden = hidden  # per module id: the attribute names that differ between layers
        self.blocks: List[List[Any]] = [[]]
        self.created: List[List[Tuple[int, int, int]]] = [[]]
        self.deaths: Dict[Tuple[int, int, int], Tuple[int, int]] = {}
        self.tokens: Dict[int, Tuple[int, int, int]] = {}  # id(tensor) -> token, while it lives
        self.refs: Dict[int, Tuple[Any, Tuple[int, int, int], int]] = {}
        self.objects: Dict[int, Tuple[int, Any]] = {}  # id -> (order, the object, kept: its id stays its own)
        self.outputs = outputs  # a layer call's input metadata and state -> its output's (shared by both walks)
        self.depth = 0
        self.block = 0
        self.error: Optional[str] = None

    # ------------------------------------------------------------------ recording

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        self._parents(lambda: ("op", str(func), self._describe(args, True), self._describe(kwargs or {}, True), self._describe(out, False)), out)
        return out

    def _parents(self, record: Callable[[], Any], out: Any) -> None:
        """``record()`` added, with ``out``'s tensors, when the parent (outside every layer) made it."""
        if self.depth == 0 and self.error is None:
            try:
                self._add(record(), out)
            except _Broken as exc:
                self.error = str(exc)

    def _add(self, record: Any, out: Any) -> None:
        block = self.blocks[self.block]
        index = len(block)
        block.append(record)
        for k, t in enumerate(output_tensors(out)):
            self._track(t, (self.block, index, k))

    def _track(self, tensor: torch.Tensor, token: Tuple[int, int, int]) -> None:
        if id(tensor) in self.tokens:
            return  # an op returned a tensor it was given (an in-place op): made earlier
        self.tokens[id(tensor)] = token
        self.created[token[0]].append(token)
        key = id(tensor)

        def died(ref: Any, key: int = key, token: Tuple[int, int, int] = token) -> None:
            self.deaths[token] = (self.block, len(self.blocks[self.block]) if self.block < len(self.blocks) else 0)
            self.tokens.pop(key, None)
            self.refs.pop(id(ref), None)

        ref = weakref.ref(tensor, died)
        self.refs[id(ref)] = (ref, token, key)

    def _describe(self, value: Any, producers: bool) -> Any:
        if isinstance(value, torch.Tensor):
            meta = _meta(value)
            if not producers:
                return meta
            token = self.tokens.get(id(value))
            return (meta, _Ref(*token) if token is not None else None)
        if isinstance(value, _VALUES):
            return (type(value).__name__, value)
        if isinstance(value, (tuple, list)):
            return (type(value).__name__, tuple(self._describe(v, producers) for v in value))
        if isinstance(value, dict):
            return ("dict", tuple((k, self._describe(v, producers)) for k, v in value.items()))
        seen = self.objects.setdefault(id(value), (len(self.objects), value))
        return ("object", type(value).__name__, seen[0])

    # ------------------------------------------------------------------ the stack's layers

    def stand_in(self, layer: nn.Module, forward: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            if self.depth:
                raise _Broken("a stack layer called inside another")
            position = self.position[id(layer)]
            if position != self.block:  # block b holds layer b - 1's call: the next expected is layer self.block
                raise _Broken(f"layer {position} called where layer {self.block} was due")
            self.seal()
            self.block += 1
            self.blocks.append([])
            self.created.append([])
            settings = (torch.is_grad_enabled(), torch.is_autocast_enabled("cpu"), hooks.process_hooks_present())
            key = (self._describe(args, False), self._describe(kwargs, False), settings, self._state(layer))
            # the settings and the state as one number (equal ones, the same number in both walks)
            setting = self.outputs.setdefault(("state", key[2:]), len(self.outputs))
            record = ("call", self._describe(args, True), self._describe(kwargs, True), setting)
            self.depth += 1
            try:
                if key not in self.outputs:
                    self.outputs[key] = self._shape_of(forward(*args, **kwargs), args, kwargs)
                out = self._made(self.outputs[key], args, kwargs)
            finally:
                self.depth -= 1
            self._add(record, out)
            return out

        return call

    def seal(self) -> None:
        """The block's last record: the autograd node of each tensor it made that is alive (a
        custom Function's backward is its own code: one applied for one layer is seen)."""
        made: List[Any] = []
        for ref, token, _ in list(self.refs.values()):
            tensor = ref() if token[0] == self.block else None
            if tensor is not None:
                made.append((token[1], token[2], type(tensor.grad_fn).__name__))
        self.blocks[self.block].append(("seal", tuple(sorted(made))))

    def hooked(self, name: str, tensor: Any) -> None:
        """A tensor hook registered by the parent (it runs in the backward): a record."""
        self._parents(lambda: ("hook", name, self._describe(tensor, True)), None)

    def _state(self, layer: nn.Module) -> Tuple[Any, ...]:
        parts: List[Any] = []
        for module in layer.modules():
            hidden = self.hidden.get(id(module), frozenset())
            for name, value in vars(module).items():
                if name in hidden or name in ("_modules", "forward"):  # forward: the stand-in (find_stack refused any other)
                    continue
                parts.append((name, _attribute(value, owner=module)))
        # the globals its forwards name: a flag the parent sets per layer is a layer state
        parts.append(("globals", _globals(layer.modules())))
        return tuple(parts)

    def _shape_of(self, out: Any, args: Any, kwargs: Any) -> Any:
        given = {id(t): i for i, t in enumerate(output_tensors((args, kwargs)))}
        if isinstance(out, torch.Tensor):
            if id(out) in given:
                return ("given", given[id(out)])
            return ("tensor", _meta(out))
        if isinstance(out, (tuple, list)) and type(out) in (tuple, list):
            return (type(out).__name__, tuple(self._shape_of(v, args, kwargs) for v in out))
        if isinstance(out, _VALUES):
            return ("value", out)
        raise _Broken(f"a stack layer returned a {type(out).__name__}")

    def _made(self, shape: Any, args: Any, kwargs: Any) -> Any:
        kind, what = shape
        if kind == "given":
            return output_tensors((args, kwargs))[what]
        if kind == "value":
            return what
        if kind in ("tuple", "list"):
            items = [self._made(s, args, kwargs) for s in what]
            return tuple(items) if kind == "tuple" else items
        shape_, stride, offset, dtype, device, requires_grad = what
        made = torch.empty_strided(shape_, stride, dtype=dtype, device=device)
        if requires_grad:
            made = made.requires_grad_().clone()  # not a leaf: the parent may change it in place
        if _meta(made) != what or offset:
            raise _Broken("a stack layer's output cannot be stood in for")
        return made

    # ------------------------------------------------------------------ the walk, written relative

    def written(self) -> List[Tuple[Any, ...]]:
        """Each block (0: before the layers; ``b``: layer ``b - 1``'s call and the ops after it)
        with its records and its tensors' deaths, every position written relative."""
        layers = len(self.layers)
        out = []
        for b, records in enumerate(self.blocks):
            deaths: List[Tuple[Any, ...]] = []
            for token in self.created[b]:
                death = self.deaths.get(token)
                if death is None:
                    deaths.append((token[1], token[2], "alive"))
                elif death[0] > layers:
                    deaths.append((token[1], token[2], "end"))
                else:
                    deaths.append((token[1], token[2], _relative(b, death[0], layers, self.period, self.head), death[1]))
            out.append((tuple(_written(r, b, layers, self.period, self.head) for r in records), tuple(deaths)))
        return out


class _TensorHooks(TorchFunctionMode):
    """Tells the walk of each tensor hook registered while it runs (not an op: the dispatch
    level does not see it)."""

    NAMES = {"register_hook", "register_post_accumulate_grad_hook"}

    def __init__(self, walk: _Walk):
        super().__init__()
        self.walk = walk

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = getattr(func, "__name__", "")
        if name in self.NAMES and args:
            self.walk.hooked(name, args[0])
        return func(*args, **(kwargs or {}))


def _attribute(value: Any, deep: bool = True, owner: Optional[nn.Module] = None) -> Any:
    """A layer attribute as the state key holds it: tensors by metadata, Python values by value,
    containers by content (hook dictionaries by their hooks' identity), a ``functools.partial``
    by its function and arguments and a method of ``owner`` (the module holding the attribute)
    by its function (find_stack proved them one function in effect in every layer), other objects
    by identity (find_stack proved them the same object in every layer) and, where ``deep``, a
    plain object (a config, a counter's holder) also by its own attributes, one level deep: a
    layer that writes ``self.config.step`` changes the state (``deep=False`` there: no walk of a
    cycle)."""
    kind = type(value)
    if kind in _VALUE_TYPES:
        return (kind.__name__, value)
    if kind is ClosureValues:  # a function's closure variables (forward_globals): as a tuple
        return ("closure", tuple(_attribute(v, deep) for v in value))
    if kind is functools.partial:
        arguments = tuple(_attribute(v, deep=False) for v in value.args)
        keywords = tuple((k, _attribute(v, deep=False)) for k, v in value.keywords.items())
        return ("partial", _attribute(value.func, deep=False, owner=owner), arguments, keywords)
    if kind is types.MethodType and owner is not None and value.__self__ is owner:
        return ("own method", id(value.__func__))
    if (kind is dict or kind is set or kind is OrderedDict) and not value:
        return (kind.__name__,)
    if isinstance(value, torch.Tensor):
        return _meta(value)
    if isinstance(value, _VALUES):
        return (type(value).__name__, value)
    if type(value) in (tuple, list):
        return (type(value).__name__, tuple(_attribute(v, deep) for v in value))
    if isinstance(value, (set, frozenset)):
        return ("set", tuple(sorted(repr(_attribute(v, deep)) for v in value)))
    if isinstance(value, dict):
        return ("dict", tuple((repr(k), _attribute(v, deep)) for k, v in value.items()))
    if deep and plain_object(value):
        return ("object", id(value), tuple((name, _attribute(v, deep=False)) for name, v in object_state(value).items()))
    return ("object", id(value))


def _relative(frm: int, to: int, layers: int, period: int, head: int = 0) -> Any:
    """Block ``to`` seen from block ``frm``: layers apart where both are layers' blocks, else by
    place: before the layers, layer ``k`` of the ``head`` before the run or of its first unit of
    ``period`` layers, layer ``k`` from the end in the last unit, or middle layer ``j``."""
    if 1 <= frm <= layers and 1 <= to <= layers:
        return ("layer", to - frm)
    if to == 0:
        return ("before",)
    if to <= head + period:
        return ("first", to - 1)
    if to > layers - period:
        return ("last", layers - to)
    return ("middle", to - 1)


def _written(value: Any, at: int, layers: int, period: int, head: int) -> Any:
    if isinstance(value, _Ref):
        return (_relative(at, value.block, layers, period, head), value.index, value.k)
    if isinstance(value, tuple):
        return tuple(_written(v, at, layers, period, head) for v in value)
    return value


def _meta(t: torch.Tensor) -> Tuple[Any, ...]:
    return (tuple(t.shape), tuple(t.stride()), t.storage_offset(), t.dtype, t.device, t.requires_grad)


def _walk(
    model: nn.Module, layers: List[nn.Module], hidden: Dict[int, frozenset], run: Callable[[nn.Module], Any],
    outputs: Dict[Any, Any], period: int, head: int,
) -> List[Tuple[Any, ...]]:
    walk = _Walk(layers, hidden, outputs, period, head)
    for layer in layers:  # no layer has a forward of its own (find_stack refused any)
        layer.__dict__["forward"] = walk.stand_in(layer, layer.forward)
    enabled = gc.isenabled()
    gc.disable()  # deaths by reference counts only: the same every run
    try:
        with _TensorHooks(walk), walk:
            out = run(model)
            walk.seal()
            walk.block = len(layers) + 1  # the forward has returned: what dies now dies at its end
            walk.blocks.append([])
            walk.created.append([])
            del out
    finally:
        walk.depth = 1  # no more records (the stand-ins' tensors die as the walk is dropped)
        for layer in layers:
            layer.__dict__.pop("forward", None)
        if enabled:
            gc.enable()
    if walk.error is not None:
        raise _Broken(walk.error)
    if walk.block != len(layers) + 1 or len(walk.blocks) != len(layers) + 2:
        raise _Broken("not every layer was called")
    written = walk.written()
    walk.refs.clear()
    return written


def model_state(model: nn.Module) -> Tuple[Any, ...]:
    """Every module's plain state (attributes, parameters' and buffers' metadata, hooks) and the
    globals their forwards name (:func:`~flopcount.core.state.forward_globals`), to see that a walk
    of the forward (or a cut run) changed nothing."""
    modules = tuple((name, _attribute(vars(module))) for name, module in model.named_modules(remove_duplicate=False))
    return modules + (("globals", _globals(model.modules())),)


def _globals(modules: Any) -> Tuple[Any, ...]:
    return globals_state(forward_globals(modules))


def globals_state(bound: Sequence[Tuple[Dict[str, Any], str, Any]]) -> Tuple[Any, ...]:
    """What the globals of ``bound`` (:func:`~flopcount.core.state.forward_globals`) hold now, as
    the state key holds an attribute: a run that rebinds or changes one changes this."""
    return tuple((name, _attribute(namespace.get(name))) for namespace, name, _ in bound)


def parent_proven(
    stack: Stack, model: nn.Module, args: Any, kwargs: Any, grad: bool, amp: Optional[torch.dtype], device_type: str,
) -> bool:
    """Whether ``model``'s forward on ``args`` and ``kwargs`` (fake or meta tensors), run as
    :func:`flopcount.step.runner.run_step` runs it (grad mode ``grad``, the forward's autocast to
    ``amp``), treats every middle unit of ``stack`` alike (a unit: :attr:`~flopcount.step.replay.Stack.period`
    layers): its walk over all the layers is its walk over the first 3 units (the stack cut by
    :func:`flopcount.step.replay.truncated`) with the middle unit's blocks repeated. False when it
    differs or cannot be walked."""
    from flopcount.step.runner import forward_autocast
    from flopcount.tracers.fake.meta_kernels import KernelStandIns

    def run(model: nn.Module) -> Any:
        # the stand-in kernels the fake step takes (a float32 mixture of experts' _grouped_mm,
        # whose meta kernel takes bfloat16 only), innermost: a layer's forward, run to learn what
        # it returns, runs as in the step; their notes are the step's to give, not the walk's
        with torch.set_grad_enabled(grad), forward_autocast(amp, device_type), KernelStandIns(set(), lambda: ""):
            return model(*args, **kwargs)

    layers = [stack.layer(i) for i in range(len(stack))]
    hidden: Dict[int, frozenset] = {}
    for pairs in stack.differing:
        for module, name in pairs:
            hidden[id(module)] = hidden.get(id(module), frozenset()) | {name}
    period, head = stack.period, stack.head
    keep = stack.kept(3)
    try:
        outputs: Dict[Any, Any] = {}
        with truncated(stack, keep):
            short = _walk(model, layers[:keep], hidden, run, outputs, period, head)
        whole = _walk(model, layers, hidden, run, outputs, period, head)
    except Exception:  # the forward cannot be walked (the traced step says why, where it fails too)
        return False
    # block 0: before the layers; block b: layer b - 1's call and what follows; the last: the end
    middle = 1 + head + period  # the middle unit's first block
    before_middle = short[:middle]  # before the layers, the head's blocks, the first unit's
    middle_unit, last_unit, end = short[middle:middle + period], short[middle + period:1 + keep], short[1 + keep:]
    expected = before_middle + middle_unit * (stack.units - 2) + last_unit + end
    return whole == expected
