"""The dispatch tracer's recorder: a TorchDispatchMode that appends one OpEvent per aten op
(schema-named arguments as TensorMeta, the module stack, the phase), answers data reads of
meta/fake tensors with placeholders, and runs ``torch.cond``'s branches. Knows nothing
about costs; :mod:`flopcount.tracers.dispatch` drives it.
"""

from __future__ import annotations

from functools import cache
from types import MappingProxyType
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Set, Tuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.weak import WeakIdKeyDictionary

from flopcount.core.inputs import is_dataless
from flopcount.core.packed import cell_tensors, unpack
from flopcount.tracers._backward import BackwardAttribution
from flopcount.tracers._modules import ModuleStack
from flopcount.tracers._sparse import sparse_meta
from flopcount.tracers._vocabulary import canonical
from flopcount.tracers.fake import meta_kernels as _meta_kernels
from flopcount.tracers.fake.indices import INDEXED, IndexValues, check_indices
from flopcount.tracers.fake.shape_cache import ShapeCache
from flopcount.tracers.fake.values import INTEGRAL, KnownValues
from flopcount.types import OpCall, OpEvent, Phase, TensorMeta, dtype_name

_aten = torch.ops.aten
# Ops that read tensor data into Python; on meta/fake tensors they cannot run.
_LOCAL_SCALAR = _aten._local_scalar_dense.default
_EQUAL = _aten.equal.default
_IS_NONZERO = _aten.is_nonzero.default
# Metadata queries some tensor subclasses (FakeTensor) route through the dispatcher:
# not computations, so not recorded (like the jit tracer's graph plumbing).
_METADATA = frozenset({"prim::device", "prim::layout"})
# A boolean made by these reads as True when answered by a placeholder ("all valid").
_ALL_OPS = frozenset({"aten::all"})
_READS = frozenset({_LOCAL_SCALAR, _EQUAL, _IS_NONZERO})
_CHECKED = _meta_kernels.CHECKED


_STRIDED = torch.strided


def _meta(tensor: torch.Tensor) -> TensorMeta:
    # torch.Size is a tuple of ints already (shapes are static here)
    dtype = dtype_name(tensor.dtype)
    if tensor.layout is not _STRIDED:
        return sparse_meta(tensor, dtype)
    return TensorMeta(tuple(tensor.shape), dtype)


def value_of(value: Any) -> Any:
    """An argument as handlers see it: TensorMeta, tuple for lists, plain scalars."""
    kind = type(value)
    if kind is int or kind is float or kind is bool or value is None:
        return value
    if isinstance(value, torch.Tensor):
        return _meta(value)
    if kind is list or kind is tuple or isinstance(value, (list, tuple)):
        return tuple([value_of(v) for v in value])
    if isinstance(value, torch.ScriptObject):
        return _packed_meta(value)
    if isinstance(value, torch.SymInt):
        return int(value)
    if isinstance(value, torch.SymFloat):
        return float(value)
    if isinstance(value, torch.SymBool):
        return bool(value)
    return value


def _packed_meta(value: Any) -> Any:
    """Quantized packed params as handlers see them: (weight meta, bias meta or None) for a
    linear/conv, (w_ih, w_hh, biases...) metas for an RNN cell (weights at their stored dtype)."""
    cell = cell_tensors(value)
    if cell is not None:
        weights, biases, stored = cell
        return tuple(TensorMeta(tuple(w.shape), dtype_name(stored)) for w in weights) + tuple(_meta(b) for b in biases)
    unpacked = unpack(value)
    if unpacked is None:
        return value
    weight, bias = unpacked
    return (_meta(weight), None if bias is None else _meta(bias))


def outputs_of(out: Any) -> Tuple[Any, ...]:
    """Outputs like the jit tracer gives them: one entry per returned value, a
    TensorMeta for a tensor and None for anything else (lists of tensors included)."""
    if isinstance(out, torch.Tensor):
        return (_meta(out),)
    if isinstance(out, tuple):
        return tuple([_meta(o) if isinstance(o, torch.Tensor) else None for o in out])
    return (None,)


def computed_outputs(outputs: Tuple[Any, ...], mask: Any) -> Tuple[Any, ...]:
    """A backward op's outputs as the real kernel returns them: None (an undefined tensor) where
    ``output_mask`` does not ask for that gradient. Some meta kernels allocate every output
    whatever the mask (``native_batch_norm_backward``: a BatchNorm whose input needs no gradient
    got grad_input's 10N FLOPs and bytes on fake tensors, none on real ones)."""
    if not mask:
        return outputs
    return tuple(None if i < len(mask) and not mask[i] else o for i, o in enumerate(outputs))


class _Signature:
    """Schema facts of one op overload, computed once: name, argument names, defaults."""

    __slots__ = ("name", "names", "defaults", "skip", "is_all", "mutable", "indexed", "masked")

    def __init__(self, schema: Any):
        # the canonical name, and the constant arguments a renamed kernel implies
        self.name, extra = canonical(schema.name)
        self.skip = schema.name in _METADATA
        self.mutable = schema.is_mutable
        self.is_all = self.name in _ALL_OPS
        self.names: Tuple[str, ...] = tuple(a.name for a in schema.arguments) + tuple(extra)
        self.defaults: Dict[str, Any] = {
            a.name: value_of(a.default_value) for a in schema.arguments if a.has_default_value()
        }
        self.defaults.update(extra)
        self.indexed = False  # an op whose index the real kernel checks (fake/indices.py): set by _signature
        self.masked = "output_mask" in self.names  # a backward op told which gradients to compute

    def bind(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Dict[str, Any]:
        """Every argument by schema name, in schema order, defaults filled in (as jit has them)."""
        names = self.names
        given = len(args)
        bound: Dict[str, Any] = {names[i]: value_of(args[i]) for i in range(min(given, len(names)))}
        if given < len(names):
            defaults = self.defaults
            for name in names[given:]:
                if name in kwargs:
                    bound[name] = value_of(kwargs[name])
                elif name in defaults:
                    bound[name] = defaults[name]
        return bound


@cache
def _signature(func: Any) -> _Signature:
    """The schema facts of an op overload, once per overload (the per-op hot path)."""
    sig = _Signature(func._schema)
    sig.indexed = id(func) in INDEXED
    return sig



class DataReads(TorchDispatchMode):
    """Answers data-dependent reads of meta/fake tensors (``.item()``, ``bool(t)``,
    ``torch.equal``) with a placeholder instead of failing; everything else passes through.

    Placeholders take the typical case: a boolean made by ``all()`` is True (every
    position valid), any other boolean (``any()``, comparisons) is False, numbers are
    0, ``equal`` is True. Each use is counted so the trace can report it.
    """

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # torch wraps a mode's __torch_dispatch__ in a dynamo-disabling shim unless told
        # otherwise: a per-op cost for a method that compiles nothing.
        return False

    def __init__(self, modules: ModuleStack):
        super().__init__()
        self.placeholders: Dict[Tuple[str, str], int] = {}
        self._modules = modules
        self._made_by_all = WeakIdKeyDictionary()
        #: values the shapes decide (position ids on meta and on fakes...): their reads need no placeholder
        self.known = KnownValues(fakes=True)

    def module_stack(self) -> Tuple[str, ...]:
        return self._modules.path

    def __torch_dispatch__(self, func: Any, types: Any, args: Tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        if func in _READS:
            answer = self._placeholder(func, args)
            if answer is not _NO_PLACEHOLDER:
                return answer
        return func(*args, **(kwargs or {}))

    def _note_reduction(self, out: Any) -> None:
        if isinstance(out, torch.Tensor) and is_dataless(out):
            self._made_by_all[out] = True

    def _placeholder(self, func: Any, args: Tuple[Any, ...]) -> Any:
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        if not tensors or not any(is_dataless(t) for t in tensors):
            return _NO_PLACEHOLDER
        values = [self.known.value(t) for t in tensors]
        if all(v is not None for v in values):  # a value the shapes decide: the true answer
            return func(*values)
        first = tensors[0]
        if func is _EQUAL:
            answer: Any = True
        elif first.dtype == torch.bool:
            answer = first in self._made_by_all
        elif first.is_floating_point() or first.is_complex():
            answer = 0.0
        else:
            answer = 0
        if func is _IS_NONZERO:
            answer = bool(answer)
        where = self.module_stack()
        key = (func._schema.name, where[-1] if where else "")
        self.placeholders[key] = self.placeholders.get(key, 0) + 1
        return answer


class Recorder(DataReads):
    """Appends one OpEvent per aten op (and, unless ``answer_reads`` is False, answers
    data reads of meta/fake tensors); knows nothing about costs.

    The per-op path is kept short: the schema facts of each overload are looked up in
    a dict, the module stack is a tuple the module hooks keep ready, and arguments are
    converted to TensorMeta without keeping any reference to a tensor.
    """

    #: torch hands higher-order ops (``torch.cond``) to the mode: see :meth:`_higher_order`.
    supports_higher_order_operators = True


    def __init__(self, modules: ModuleStack, answer_reads: bool = True):
        super().__init__(modules)
        #: module -> calls of ``torch.cond`` whose predicate was a placeholder (both branches counted)
        self.both_branches: Dict[str, int] = {}
        self.conds = 0
        self.events: List[OpEvent] = []
        self.phase: Phase = "forward"
        self.muted = 0  # > 0 inside an intercepted composite (SDPA) or flopcount's own ops
        #: while a composite runs muted in the backward phase (a checkpoint's recompute): the ops
        #: that reached this mode at ``muted == held_level`` (``reached``) and the events they
        #: would have recorded (``held``), booked in place of the composite when a dispatch mode
        #: above this one served some of its ops from a cache (selective activation checkpointing)
        self.held: Optional[List[OpEvent]] = None
        self.held_level = 0
        self.reached: List[Any] = []
        self.attribution: Optional[BackwardAttribution] = None
        self.assumptions: Set[str] = set()  # what a stand-in kernel assumed (exact totals: warnings only)
        self.answer_reads = answer_reads
        #: on fake CPU copies: apply the real kernels' dtype checks their meta kernels skip
        self.real_checks = False
        self._signatures: Dict[Any, _Signature] = {}
        self.run_op: Optional[Callable[[Any, Tuple[Any, ...], Optional[Dict[str, Any]]], Any]] = None
        #: on fake copies: the shape cache that runs each op (its ``key`` names a call it knew)
        self.shape_cache: Optional[ShapeCache] = None
        #: ``marker(index)``: a context manager around the run of the op recorded as event
        #: ``index`` (flopcount.profiling names each op's profiler range with it); None: none
        self.marker: Optional[Callable[[int], Any]] = None
        #: the values the real kernels' index checks read (fake/indices.py), and how many index
        #: values were known and checked so far (structural reuse keys a call that checked one by
        #: its arguments' values)
        self.indices = IndexValues(self.known)
        self.indices_checked = 0
        #: ops whose event or effect is not a function of the shape-cache key alone (not known to
        #: the cache, writing an argument, a placeholder, a fallback, a noted value), so far:
        #: a torch function's events are kept for its next call only if none ran inside it
        self.unkeyed = 0

    def module_stack(self) -> Tuple[str, ...]:
        path = self._modules.path
        if self.phase == "backward" and not path and self.attribution is not None:
            return self.attribution.current()
        return path

    def record(self, op: str, args: Dict[str, Any], outputs: Tuple[Any, ...]) -> None:
        self.unkeyed += 1
        self.events.append(OpEvent(OpCall(op, args, outputs), self.module_stack(), self.phase))

    def __torch_dispatch__(self, func: Any, types: Any, args: Tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        if not isinstance(func, _OP_OVERLOAD):  # a higher-order op (torch.cond): every aten op is an overload
            self.unkeyed += 1
            return self._higher_order(func, args, kwargs or {})
        if self.muted and self.held is not None and self.muted == self.held_level:
            self.reached.append(func)
        if self.answer_reads and func in _READS:
            answer = self._placeholder(func, args)
            if answer is not _NO_PLACEHOLDER:
                self.unkeyed += 1
                return answer
        sig = self._signatures.get(func)
        if sig is None:
            sig = self._signatures[func] = _signature(func)
        if self.real_checks and func in _CHECKED:
            _meta_kernels.check_like_cpu(func, args, kwargs)
        if sig.indexed and check_indices(func, args, kwargs, self.indices):
            self.indices_checked += 1
        cache = self.shape_cache
        try:
            if self.marker is not None and not self.muted and not _signature(func).skip:
                with self.marker(len(self.events)):
                    out = func(*args, **kwargs) if kwargs else func(*args)
            elif cache is not None:
                out = cache.run(func, args, kwargs)
            elif self.run_op is not None:
                out = self.run_op(func, args, kwargs)
            else:
                out = func(*args, **kwargs) if kwargs else func(*args)
        except Exception as exc:  # a meta kernel that refuses shapes-only operands (MoE grouped mm)
            out = _meta_kernels.fallback(func, args, kwargs or {}, exc, self.assumptions, self._modules.current)
            cache = None
        key = cache.key if cache is not None else None
        kind = type(out)
        if kind is torch.Tensor or kind is self.known.fake:
            # a float output cannot have written into the (integral) tensors whose values are known
            if out.dtype in INTEGRAL and (kind is not torch.Tensor or out.is_meta) and self.known.note(func, args, kwargs, out):
                self.unkeyed += 1  # a value followed (or every one forgotten): not a function of the key
        elif sig.mutable and self.known:
            self.unkeyed += 1
            self.known.note(func, args, kwargs, out)
        if sig.mutable and self.indices.unversioned:  # the caller's ids as inference tensors (no version)
            self.indices.written(func, args, kwargs)
        if sig.skip:
            return out
        if key is None or sig.mutable:
            self.unkeyed += 1
        events = self.events
        if self.muted:
            if self.held is None or self.muted != self.held_level:
                return out
            events = self.held
        if key is not None:
            # the shape cache knew this call: its key (the op, every argument's metadata and
            # value) decides the call (bound arguments, outputs), made once per key and shared by
            # every event of that key (read-only arguments; pricing then runs once per call)
            call = _BOUND.get(key)
            if call is None:
                call = self._bound(sig, args, kwargs, out, key)
            if call is _UNBINDABLE:
                return out
        else:
            call = self._call(sig, args, kwargs, out)
        if call is None:
            return out
        events.append(OpEvent(call, self.module_stack(), self.phase))
        if sig.is_all:
            self._note_reduction(out)
        return out

    def run_function(self, func: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
        """``func(*args, **kwargs)`` for a torch function whose ops depend only on its arguments'
        metadata (batch norm, layer norm, convolution), on fake copies without autograd: the
        events its ops record and its result's metadata are kept per shape-cache key, and a next
        call of that key appends the same events (each with its own arguments) and makes the
        result, none of its ops run. Kept only when every op inside was known to the cache, wrote
        no argument and recorded under the caller's module (``unkeyed`` unchanged)."""
        cache = self.shape_cache
        key = cache.function_key(func, args, kwargs) if cache is not None else None
        if key is None or self.muted:
            return func(*args, **kwargs)
        stack, phase = self.module_stack(), self.phase
        found = _FUNCTIONS.get(key)
        if found is not None:
            ops, described = found
            out = cache.made(func, described)  # type: ignore[union-attr]  # key: a cache
            if out is not None:
                events = self.events
                for call in ops:
                    events.append(OpEvent(call, stack, phase))
                return out
        start, unkeyed = len(self.events), self.unkeyed
        out = func(*args, **kwargs)
        if self.unkeyed != unkeyed or found is not None:
            return out
        window = self.events[start:]
        if all(type(e) is OpEvent and e.module_stack == stack and e.phase == phase for e in window):
            described = cache.fresh_result(out, args)  # type: ignore[union-attr]
            if described is not None:
                if len(_FUNCTIONS) >= _MAX_BOUND:
                    _FUNCTIONS.clear()
                _FUNCTIONS[key] = (tuple(_shared(e.call) for e in window), described)
        return out

    @staticmethod
    def _call(sig: _Signature, args: Tuple[Any, ...], kwargs: Any, out: Any) -> Optional[OpCall]:
        try:
            bound = sig.bind(args, kwargs or _NO_KWARGS)
            outputs = outputs_of(out)
            if sig.masked:
                outputs = computed_outputs(outputs, bound.get("output_mask"))
            return OpCall(sig.name, bound, outputs)
        except (ValueError, RuntimeError):
            # an nn.UninitializedParameter refuses to show its shape: the bookkeeping ops of a
            # lazy module materialising itself (``param.data``), which compute nothing
            return None

    @staticmethod
    def _bound(sig: _Signature, args: Tuple[Any, ...], kwargs: Any, out: Any, key: Any) -> Any:
        """The call (bound arguments and outputs) the shape cache knows by ``key``, kept for
        every next call of that key (:func:`_shared`)."""
        call = Recorder._call(sig, args, kwargs, out)
        known = _UNBINDABLE if call is None else _shared(call)
        if len(_BOUND) >= _MAX_BOUND:
            _BOUND.clear()
        _BOUND[key] = known
        return known


    def _higher_order(self, func: Any, args: Tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
        """``torch.cond``: on real data, the branch the predicate takes; when the predicate
        has no value (meta/fake tensors), both branches, their costs added (an upper bound,
        reported as a gap) and the true branch's result returned (both have its shapes).
        The branches' ops are recorded like any others, in their modules."""
        if func.name() != "cond":
            raise NotImplementedError(
                f"flopcount cannot count the higher-order op torch.ops.higher_order.{func.name()} yet (only torch.cond)"
            )
        bound = dict(zip(("pred", "true_fn", "false_fn", "operands"), args))
        bound.update(kwargs)
        pred, operands = bound["pred"], tuple(bound["operands"])
        self.conds += 1
        with self:
            if isinstance(pred, torch.Tensor) and is_dataless(pred):
                where = self._modules.current
                self.both_branches[where] = self.both_branches.get(where, 0) + 1
                out = bound["true_fn"](*operands)
                bound["false_fn"](*operands)
                return out
            return bound["true_fn"](*operands) if bool(pred) else bound["false_fn"](*operands)


_NO_KWARGS: Mapping[str, Any] = {}


def _shared(call: OpCall) -> OpCall:
    """``call`` as kept for every event of its shape-cache key (in this count and the next):
    its arguments read-only (a handler writing them would change every event sharing them),
    its outputs a tuple."""
    if type(call.args) is MappingProxyType and type(call.outputs) is tuple:
        return call  # kept already (a torch function's ops the shape cache knew)
    return OpCall(call.op, MappingProxyType(dict(call.args)), tuple(call.outputs))

#: shape-cache key -> the call (bound arguments, outputs) of that key (a pure function of it,
#: like the shape cache's own results: shared by every recorder and every event of the key,
#: nothing kept of a tensor)
_BOUND: Dict[Any, Any] = {}
_MAX_BOUND = 50_000
_UNBINDABLE = object()
#: a torch function's shape-cache key -> (its ops' calls (:func:`_shared`), its result's
#: metadata): :meth:`Recorder.run_function`, shared by every recorder like ``_BOUND``
_FUNCTIONS: Dict[Any, Any] = {}
#: the class of an aten op overload, read off a public op (not imported from torch._ops)
_OP_OVERLOAD = type(torch.ops.aten.add.Tensor)
_NO_PLACEHOLDER = object()


class HopRecorder(Recorder):
    """The recorder for a forward that calls ``torch.cond``: torch runs an eager higher-order
    op under ``torch.compile``, which would trace the mode's own code, so torch is asked to
    keep it out of dynamo (it wraps ``__torch_dispatch__`` in ``_disable_dynamo``: ~10 us per
    op, which is why the plain :class:`Recorder` does not)."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return True

    def __torch_dispatch__(self, func: Any, types: Any, args: Tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        return Recorder.__torch_dispatch__(self, func, types, args, kwargs)
