"""The TorchDispatchMode tracer: records every aten op as it executes, forward and
(optionally) backward, with shapes, schema-named arguments and the owning module.

Works on real, meta and fake tensors alike because nothing here reads tensor data:
a data-dependent read of a meta/fake tensor (``.item()``, ``bool(t)``, ``torch.equal``)
is answered with a placeholder value and reported in the trace's warnings.

Op names follow the one vocabulary of ``_vocabulary.py``: kernel spellings are renamed
to their canonical names, and the composites jit records as one op (``F.linear``,
``torch.matmul``, SDPA, the RNN ops, ``F.multi_head_attention_forward``...) are recorded
as one event by a pass-through TorchFunctionMode that mutes the aten ops underneath, so
CPU, meta and jit give the same operators and numbers. Backward ops are recorded as they run.

Backward ops are attributed to the module whose forward created the autograd node
that runs them: module entries and exits are stamped with autograd's sequence number
during forward, and each backward op looks up its node's sequence number.
"""

from __future__ import annotations

import contextlib
import itertools
from functools import cache
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple

import torch
from torch import nn
from torch._ops import HigherOrderOperator
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.weak import WeakIdKeyDictionary

from .._packed import cell_tensors, unpack
from ..errors import TraceError, UsageError
from ..inputs import as_call_args, describe_inputs, fake_tensor_type, flatten_tensors, is_dataless
from ..optimizers import OptimizerSpec
from ..state import preserved_rng
from ..types import OpCall, OpEvent, Phase, TensorMeta, Trace
from . import _meta_kernels
from ._backward import BackwardAttribution, run_backward
from ._fake import FakeRunError, fake_copies, quiet_fake_logs, reason_for
from ._modules import ModuleStack, forward_error, module_names
from ._optimizer import FakeOptimizerStep
from ._shape_cache import ShapeCache
from ._state import preserved_model_state
from ._vocabulary import CompositeInterceptor, canonical

__all__ = ["trace"]

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


_DTYPE_NAMES: Dict[torch.dtype, str] = {}


def _dtype_name(dtype: torch.dtype) -> str:
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype).replace("torch.", "")
    return name


def _meta(tensor: torch.Tensor) -> TensorMeta:
    # torch.Size is a tuple of ints already (shapes are static here)
    return TensorMeta(tuple(tensor.shape), _DTYPE_NAMES.get(tensor.dtype) or _dtype_name(tensor.dtype))


def _value(value: Any) -> Any:
    """An argument as handlers see it: TensorMeta, tuple for lists, plain scalars."""
    kind = type(value)
    if kind is int or kind is float or kind is bool or value is None:
        return value
    if isinstance(value, torch.Tensor):
        return _meta(value)
    if kind is list or kind is tuple or isinstance(value, (list, tuple)):
        return tuple([_value(v) for v in value])
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
        return tuple(TensorMeta(tuple(w.shape), _dtype_name(stored)) for w in weights) + tuple(_meta(b) for b in biases)
    unpacked = unpack(value)
    if unpacked is None:
        return value
    weight, bias = unpacked
    return (_meta(weight), None if bias is None else _meta(bias))


def _outputs(out: Any) -> Tuple[Any, ...]:
    """Outputs like the jit tracer gives them: one entry per returned value, a
    TensorMeta for a tensor and None for anything else (lists of tensors included)."""
    if isinstance(out, torch.Tensor):
        return (_meta(out),)
    if isinstance(out, tuple):
        return tuple([_meta(o) if isinstance(o, torch.Tensor) else None for o in out])
    return (None,)


class _Signature:
    """Schema facts of one op overload, computed once: name, argument names, defaults."""

    __slots__ = ("name", "names", "defaults", "skip", "is_all")

    def __init__(self, schema: Any):
        # the canonical name, and the constant arguments a renamed kernel implies
        self.name, extra = canonical(schema.name)
        self.skip = schema.name in _METADATA
        self.is_all = self.name in _ALL_OPS
        self.names: Tuple[str, ...] = tuple(a.name for a in schema.arguments) + tuple(extra)
        self.defaults: Dict[str, Any] = {
            a.name: _value(a.default_value) for a in schema.arguments if a.has_default_value()
        }
        self.defaults.update(extra)

    def bind(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Dict[str, Any]:
        """Every argument by schema name, in schema order, defaults filled in (as jit has them)."""
        names = self.names
        given = len(args)
        bound: Dict[str, Any] = {names[i]: _value(args[i]) for i in range(min(given, len(names)))}
        if given < len(names):
            defaults = self.defaults
            for name in names[given:]:
                if name in kwargs:
                    bound[name] = _value(kwargs[name])
                elif name in defaults:
                    bound[name] = defaults[name]
        return bound


@cache
def _signature(func: Any) -> _Signature:
    """The schema facts of an op overload, once per overload (the per-op hot path)."""
    return _Signature(func._schema)



class _DataReads(TorchDispatchMode):
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


class _Recorder(_DataReads):
    """Appends one OpEvent per aten op (and, unless ``answer_reads`` is False, answers
    data reads of meta/fake tensors); knows nothing about costs.

    The per-op path is kept short: the schema facts of each overload are looked up in
    a dict, the module stack is a tuple the module hooks keep ready, and arguments are
    converted to TensorMeta without keeping any reference to a tensor.
    """

    #: torch hands higher-order ops (``torch.cond``) to the mode: see :meth:`_higher_order`.
    supports_higher_order_operators = True

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # torch runs an eager higher-order op under torch.compile, which would trace this
        # mode's own code: keep it eager (torch wraps __torch_dispatch__ in _disable_dynamo)
        return True

    def __init__(self, modules: ModuleStack, answer_reads: bool = True):
        super().__init__(modules)
        #: module -> calls of ``torch.cond`` whose predicate was a placeholder (both branches counted)
        self.both_branches: Dict[str, int] = {}
        self.conds = 0
        self.events: List[OpEvent] = []
        self.phase: Phase = "forward"
        self.muted = 0  # > 0 inside an intercepted composite (SDPA) or flopcount's own ops
        self.attribution: Optional[BackwardAttribution] = None
        self.assumptions: Set[str] = set()  # what a stand-in kernel assumed (exact totals: warnings only)
        self.answer_reads = answer_reads
        self._signatures: Dict[Any, _Signature] = {}
        self.run_op: Optional[Callable[[Any, Tuple[Any, ...], Optional[Dict[str, Any]]], Any]] = None

    def module_stack(self) -> Tuple[str, ...]:
        path = self._modules.path
        if self.phase == "backward" and not path and self.attribution is not None:
            return self.attribution.current()
        return path

    def record(self, op: str, args: Dict[str, Any], outputs: Tuple[Any, ...]) -> None:
        self.events.append(OpEvent(OpCall(op, args, outputs), self.module_stack(), self.phase))

    def __torch_dispatch__(self, func: Any, types: Any, args: Tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        if isinstance(func, HigherOrderOperator):
            return self._higher_order(func, args, kwargs or {})
        if self.answer_reads and func in _READS:
            answer = self._placeholder(func, args)
            if answer is not _NO_PLACEHOLDER:
                return answer
        try:
            if self.run_op is not None:
                out = self.run_op(func, args, kwargs)
            else:
                out = func(*args, **kwargs) if kwargs else func(*args)
        except Exception as exc:  # a meta kernel that refuses shapes-only operands (MoE grouped mm)
            out = _meta_kernels.fallback(func, args, kwargs or {}, exc, self.assumptions, self._modules.current)
        if self.muted:
            return out
        sig = self._signatures.get(func)
        if sig is None:
            sig = self._signatures[func] = _signature(func)
        if sig.skip:
            return out
        try:
            call = OpCall(sig.name, sig.bind(args, kwargs or _NO_KWARGS), _outputs(out))
        except (ValueError, RuntimeError):
            # an nn.UninitializedParameter refuses to show its shape: the bookkeeping ops of a
            # lazy module materialising itself (``param.data``), which compute nothing
            return out
        self.events.append(OpEvent(call, self.module_stack(), self.phase))
        if sig.is_all:
            self._note_reduction(out)
        return out


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
_NO_PLACEHOLDER = object()


def trace(
    model: nn.Module,
    inputs: Any = (),
    kwargs: Optional[Mapping[str, Any]] = None,
    *,
    backward: bool = False,
    loss_fn: Optional[Callable[[Any], Any]] = None,
    fake_copy: bool = False,
    optimizer: Optional[OptimizerSpec] = None,
) -> Trace:
    """Run ``model`` once under a TorchDispatchMode and return its aten op events.

    ``backward=True`` also runs the backward pass of ``loss_fn(outputs)`` (default:
    every floating output with a gradient of ones) and records its ops with phase
    "backward", attributed to the module whose forward created them. ``loss_fn``'s
    own forward ops are recorded at the root. The model is left as found.

    ``fake_copy=True`` runs a copy of the model with fake parameters, buffers and inputs
    (see ``_fake.py``): nothing is computed and the caller's objects are never touched.
    A forward that needs a real value raises :class:`FakeRunError` instead of guessing.

    ``optimizer`` (with ``backward``) then runs one step of that optimizer on fake twins
    of the parameters that got a gradient, its ops recorded with phase "optimizer" at
    the root (see ``_optimizer.py``); the user's parameters and optimizer are not stepped.
    """
    if loss_fn is not None and not backward:
        raise UsageError("loss_fn is only used with backward=True")
    if optimizer is not None and not backward:
        raise UsageError("optimizer= needs backward=True: the step updates parameters from their gradients")
    args, kw = as_call_args(inputs, kwargs)
    flat_inputs, rebuild = flatten_tensors((args, kw))
    inputs_text = describe_inputs(inputs, kwargs)
    preserve: Any
    if fake_copy:
        copied = fake_copies(model, flat_inputs, rebuild)
        run_model, fake_mode, flat_inputs = copied.model, copied.mode, copied.tensors
        args, kw = copied.call
        preserve = contextlib.ExitStack()  # the copy needs no restoring; the process's RNG does
        preserve.enter_context(preserved_rng())
        preserve.enter_context(quiet_fake_logs())
    else:
        run_model = model
        fake_mode = _fake_mode(itertools.chain(flat_inputs, model.parameters(), model.buffers()))
        preserve = preserved_model_state(model)
    names = module_names(run_model)
    modules = ModuleStack(names)
    recorder = _Recorder(modules, answer_reads=not fake_copy)
    shape_cache = ShapeCache(fake_mode, fake_tensor_type()) if fake_copy else None
    if shape_cache is not None:
        recorder.run_op = shape_cache.run
    attribution = BackwardAttribution(modules) if backward else None
    recorder.attribution = attribution
    with contextlib.ExitStack() as outer:
        if fake_mode is not None:
            # Fake tensors only work inside their mode (tensors made in forward must be
            # fake too); the extra reader answers data reads while the state is restored.
            outer.enter_context(fake_mode)
            if not fake_copy:
                outer.enter_context(_DataReads(modules))
        with preserve, modules, torch.set_grad_enabled(backward):
            interceptor = CompositeInterceptor(
                recorder, _value, _outputs, shape_cache.run_composite if shape_cache is not None else None
            )
            with attribution or contextlib.nullcontext(), interceptor, recorder:
                try:
                    outputs = run_model(*args, **kw)
                except Exception as exc:
                    if fake_copy:
                        raise FakeRunError(reason_for(exc, modules.current), modules.current) from exc
                    raise forward_error(exc, modules.current, inputs_text, "dispatch") from exc
                if attribution is not None and recorder.conds:
                    raise UsageError(
                        "backward=True through torch.cond is not counted yet (torch runs the branch below "
                        "autograd under a dispatch mode); count the forward with backward=False"
                    )
                trained: Set[int] = set()
                if attribution is not None:
                    attribution.start_backward(names, interceptor)
                    try:
                        trained = run_backward(run_model, outputs, flat_inputs, loss_fn, recorder)
                    except UsageError:
                        raise
                    except Exception as exc:
                        if fake_copy:
                            where = recorder.module_stack()
                            raise FakeRunError(reason_for(exc, where[-1] if where else "")) from exc
                        raise _backward_error(exc, recorder, inputs_text) from exc
                del outputs
    if optimizer is not None:
        _record_optimizer_step(optimizer, model, [id(p) in trained for p in run_model.parameters()], recorder)
    notes = _notes(recorder.placeholders) + _cond_notes(recorder.both_branches)
    return Trace(
        tuple(recorder.events), "dispatch", dict(modules.calls), notes + tuple(sorted(recorder.assumptions)), gaps=notes,
        shape_cache=shape_cache.stats() if shape_cache is not None else {},
    )


def _record_optimizer_step(spec: OptimizerSpec, model: nn.Module, trained: List[bool], recorder: _Recorder) -> None:
    """Record one step of ``spec`` on fake twins of ``model``'s parameters (phase "optimizer")."""
    step = FakeOptimizerStep(spec, list(model.parameters()), trained, "count_flops")
    recorder.phase = "optimizer"
    recorder.answer_reads = False  # the step reads its step counters: the fake mode knows them
    recorder.run_op = None
    with step.running(), CompositeInterceptor(recorder, _value, _outputs, None), recorder:
        step.step()


def _fake_mode(tensors: Iterable[torch.Tensor]) -> Any:
    """The FakeTensorMode of the first fake tensor among ``tensors`` (None if none is fake)."""
    fake = fake_tensor_type()
    for tensor in tensors:
        if isinstance(tensor, fake):
            return tensor.fake_mode  # type: ignore[attr-defined]  # isinstance(tensor, FakeTensor) above
    return None


def _backward_error(exc: BaseException, recorder: _Recorder, inputs_text: str) -> TraceError:
    """A TraceError for a failure in ``loss_fn`` or in backward, naming the module."""
    in_backward = recorder.phase == "backward"
    stack = recorder.module_stack() if in_backward else ()
    where = stack[-1] if stack else ""
    text = str(exc).strip()
    detail = f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__
    place = f" in module '{where}'" if where else ""
    return TraceError(
        f"{'backward' if in_backward else 'loss_fn'} failed{place} (dispatch tracer) with inputs {inputs_text}: {detail}",
        module_path=where,
        input_shapes=inputs_text,
    )


def _cond_notes(both: Mapping[str, int]) -> Tuple[str, ...]:
    return tuple(
        f"torch.cond in {f'module {where!r}' if where else 'the root module'} ({n}x): its predicate has no value on "
        "meta/fake tensors, so both branches are counted (an upper bound); count real tensors "
        "(tracer='dispatch') for the branch taken"
        for where, n in sorted(both.items())
    )


def _notes(placeholders: Mapping[Tuple[str, str], int]) -> Tuple[str, ...]:
    if not placeholders:
        return ()
    listing = ", ".join(
        f"{op} x{n} in {repr(module) if module else 'the root module'}"
        for (op, module), n in sorted(placeholders.items(), key=lambda kv: kv[0])
    )
    return (
        "dispatch: data-dependent reads of meta/fake tensors were answered with placeholders "
        f"(all() -> True, any() and other booleans -> False, numbers -> 0, equal() -> True): {listing}",
    )
