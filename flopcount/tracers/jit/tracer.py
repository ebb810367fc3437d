"""The torch.jit tracer: records the model's aten ops with shapes and module scopes.

Isolated here because torch.jit.trace is deprecated upstream: dropping this file
leaves the dispatch tracer and everything downstream untouched.
"""

from __future__ import annotations

import os
import threading
import warnings
from contextlib import nullcontext
from functools import cache
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Set, Tuple

import torch
from torch import nn

from flopcount.core.diagnostics import module_place
from flopcount.core.inputs import output_tensors, prepare_call
from flopcount.core.model_facts import ModelFacts, model_facts
from flopcount.core.state import drawing_events
from flopcount.errors import TraceError
from flopcount.tracers._modules import ModuleStack, forward_error
from flopcount.tracers._real_run import model_kept
from flopcount.tracers._sparse import sparse_meta
from flopcount.tracers._vocabulary import canonical
from flopcount.tracers.fake.hf_tracing import jit_branches
from flopcount.tracers.jit.autocast import CASTS, MUTED, RENAMED, USER, AutocastCasts, autocast_cast, autocast_on
from flopcount.tracers.jit.functions import (
    function_failure,
    higher_order_failure,
    linearize_failure,
    tangent_refusal,
    transform_failure,
)
from flopcount.tracers.jit.graph import (
    FUNCTION_CALL,
    PLUMBING,
    function_body,
    inline_script_calls,
    keep_unread_results,
    tensor_meta,
)
from flopcount.tracers.jit.random import private_random_calls, recording_warnings
from flopcount.tracers.jit.scripted import scripted_graph, scripted_scopes
from flopcount.tracers.jit.sizes import meta_kernel_failure, static_unpool_sizes, unpool_failure
from flopcount.types import OpCall, OpEvent, TensorMeta, Trace, dtype_name

# Under tracing a size read (x.size(0)) is a 0-dim tensor (prim::NumToTensor), so the
# forward's Python arithmetic on sizes is recorded as tensor ops, which eager (and the
# dispatch tracer) runs as Python numbers: ``d ** -0.5``, ``n // 2``, and timm's TF "SAME"
# padding, which under tracing takes its tensor branch (``(x / s).ceil()``, ``torch.clamp``)
# where eager runs ``math.ceil``/``max`` on ints. The rule (see _shape_arithmetic): an aten
# op whose every input is a size read, a constant or such an op's result, with only 0-d
# results, is shape arithmetic, whatever the op. An explicit conversion (torch.tensor(n),
# .to, .float()) makes a real tensor whose ops eager runs too: it is never shape arithmetic,
# and neither is what is computed from it. The one exception is ``.float()``/``.to(dtype)``
# called on a size itself (aten::to's dtype overload on a size-derived value): eager's size is a
# Python int, which has no such method, so only torch's trace-only code runs it (F.interpolate's
# ``recompute_scale_factor``: ``floor(size.float() * torch.tensor(scale))``). What it makes is
# shape arithmetic, and so are its ops with constant tensors (``torch.tensor(1.5)``: a conversion
# of prim::Constant); a user's conversion (torch.tensor, as_tensor, new_tensor) records the
# device overload of aten::to, or a detach, first, and stays real.
_SIZE_SOURCES = frozenset({"aten::size", "prim::NumToTensor"})
_CONVERSIONS = frozenset(
    {
        "aten::tensor", "aten::as_tensor", "aten::scalar_tensor", "aten::to", "aten::_to_copy", "aten::type_as",
        "aten::clone", "aten::detach", "aten::full", "aten::full_like", "aten::zeros_like", "aten::ones_like",
        "aten::empty_like", "aten::rand_like", "aten::randn_like", "aten::lift_fresh", "aten::copy_",
    }
)  # fmt: skip

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep

# jit types a nested tensor without sizes. TransformerEncoder's fast path (eval with a
# padding mask) makes one from the padded input and passes it through its layers; read
# it as the padded shape, which is what the dispatch tracer runs (docs/conventions.md).
_NESTED_FROM_PADDED = frozenset({"aten::_nested_tensor_from_mask", "aten::_transformer_encoder_layer_fwd"})


def is_available() -> bool:
    """The private hooks this tracer needs exist (else ``auto`` uses the dispatch tracer)."""
    return (hasattr(torch.jit, "_trace") and hasattr(torch.jit._trace, "_trace_module_map")
            and hasattr(torch._C, "_create_graph_by_tracing") and hasattr(torch._C, "_get_tracing_state"))


@cache
def _argument_names(schema: str) -> Optional[Tuple[str, ...]]:
    if not schema or schema == "(no schema)":
        return None
    try:
        parsed = torch.parse_schema(schema)
    except RuntimeError:
        return None
    return tuple(arg.name for arg in parsed.arguments)


def _from_ivalue(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        dtype = dtype_name(value.dtype)
        return sparse_meta(value, dtype) if value.layout != torch.strided else TensorMeta(tuple(value.shape), dtype)
    return tuple(_from_ivalue(v) for v in value) if isinstance(value, list) else value


class _ValueReader:
    """Turns graph values into handler arguments (TensorMeta, tuples, scalars), memoised."""

    def __init__(self, graph: Any, sparse_inputs: Optional[Mapping[Any, torch.Tensor]] = None) -> None:
        self._graph = graph  # graph values are only valid while their graph lives
        self._cache: Dict[Any, Any] = {}
        # graph inputs that are sparse tensors: jit types them without sizes or values
        self._sparse = sparse_inputs or {}

    def read_as(self, value: Any, source: Any) -> None:
        """Read ``value`` as ``source`` (an autocast cast inside a composite: the composite reads
        its operand as passed, tracers/jit/autocast.py)."""
        self._cache[value] = self.read(source)

    def read(self, value: Any) -> Any:
        if value in self._cache:
            return self._cache[value]
        jit_type = value.type()
        producer = value.node()
        kind = producer.kind()
        if isinstance(jit_type, torch.TensorType):
            result: Any = tensor_meta(jit_type)
            if result is None and value in self._sparse:
                result = _from_ivalue(self._sparse[value])
            elif result is None and kind == "prim::Constant":
                result = _from_ivalue(value.toIValue())
            elif result is None and kind in _NESTED_FROM_PADDED:
                result = self.read(next(iter(producer.inputs())))
        elif kind == "prim::Constant":
            result = _from_ivalue(value.toIValue())
        elif kind == "prim::ListConstruct":
            result = tuple(self.read(v) for v in producer.inputs())
        else:
            result = None  # an int or float computed while tracing: only its shape-free use is known
        self._cache[value] = result
        return result


class _LazyArgs(Mapping[str, Any]):
    """An op's arguments by schema name, each read from the graph only when a handler
    asks for it: most handlers need two or three of a dozen arguments, and reading a
    graph value costs several calls into torch."""

    __slots__ = ("_names", "_values", "_reader", "_read")

    def __init__(self, names: Tuple[str, ...], values: List[Any], reader: _ValueReader):
        self._names = names
        self._values = dict(zip(names, values))
        self._reader = reader
        self._read: Dict[str, Any] = {}

    def __getitem__(self, name: str) -> Any:
        if name not in self._read:
            self._read[name] = self._reader.read(self._values[name])  # KeyError if no such argument
        return self._read[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return repr(dict(self.items()))


class _LazyOutputs(Sequence[Any]):
    """An op's outputs (TensorMeta or None), read from the graph on first access."""

    __slots__ = ("_values", "_reader")

    def __init__(self, values: List[Any], reader: _ValueReader):
        self._values = values
        self._reader = reader

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return tuple(self._reader.read(v) for v in self._values[index])
        return self._reader.read(self._values[index])

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return repr(tuple(self))




def _size_cast(kind: str, node: Any, inputs: Sequence[Any], sizes: Set[Any]) -> bool:
    """``.float()``/``.to(dtype)`` called on a size-derived value: aten::to's dtype overload
    (no device argument), which eager cannot run on a size (a Python int)."""
    return kind == "aten::to" and bool(inputs) and inputs[0] in sizes and node.schema().startswith("aten::to.dtype(")


def _constant_tensor(value: Any) -> bool:
    """A prim::Constant, or conversions (``torch.tensor(1.5)``: aten::to, detach) of constants only."""
    node = value.node()
    if node.kind() == "prim::Constant":
        return True
    return node.kind() in _CONVERSIONS and all(_constant_tensor(v) for v in node.inputs())


def _shape_arithmetic(kind: str, node: Any, inputs: Sequence[Any], sizes: Set[Any], trace_only: Set[Any]) -> bool:
    """Whether ``node`` is Python-number arithmetic on sizes (``x.size(-1) ** 0.5``,
    ``min(h, 7)``, ``n // 2``, ``(h / s).ceil()``) that jit records as 0-dim tensor ops: an
    aten op other than an explicit conversion (_CONVERSIONS) whose inputs are size-derived
    values or constants, at least one size-derived, giving 0-dim results (or numbers).
    Those are added to ``sizes``, so the arithmetic built on them is skipped too.

    ``trace_only`` holds the values of torch's trace-only size code (_size_cast and what is
    computed from it): an op on one of those may also take constant tensors."""
    if not kind.startswith("aten::") or not any(value in sizes for value in inputs):
        return False
    casting = _size_cast(kind, node, inputs, sizes)
    if kind in _CONVERSIONS and not casting:
        return False
    traced = casting or any(value in trace_only for value in inputs)
    if not all(
        value in sizes or value.node().kind() == "prim::Constant" or (traced and _constant_tensor(value))
        for value in inputs
    ):
        return False
    outputs = list(node.outputs())
    for out in outputs:
        jit_type = out.type()
        if isinstance(jit_type, torch.TensorType):
            meta = tensor_meta(jit_type)
            if meta is None or meta.shape != ():
                return False
        elif not isinstance(jit_type, (torch.IntType, torch.FloatType, torch.BoolType, torch.NumberType)):
            return False
    sizes.update(outputs)
    if traced:
        trace_only.update(outputs)
    return True


def _changes_dtype(node: Any, inputs: Sequence[Any], reader: _ValueReader) -> bool:
    before, after = reader.read(inputs[0]), reader.read(node.outputsAt(0))
    return isinstance(before, TensorMeta) and isinstance(after, TensorMeta) and before.dtype != after.dtype


def _graph_events(
    graph: Any,
    scope_of: Optional[Mapping[int, str]] = None,
    scope_all: Optional[str] = None,
    inputs: Sequence[torch.Tensor] = (),
    autocast: bool = False,
) -> List[OpEvent]:
    """The graph's ops as events. ``autocast``: the trace ran under autocast, and its casts carry
    the marks of tracers/jit/autocast.py (muted inside a composite, else named ``_to_copy``)."""
    graph_inputs = list(graph.inputs())
    sparse = {
        value: tensor
        for value, tensor in zip(graph_inputs, inputs)
        if len(graph_inputs) == len(inputs) and tensor.layout != torch.strided
    }
    reader = _ValueReader(graph, sparse)
    scopes: Dict[str, Tuple[str, ...]] = {}
    events: List[OpEvent] = []
    sizes: Set[Any] = set()  # values computed from size reads only (see _shape_arithmetic)
    trace_only: Set[Any] = set()  # the values of torch's trace-only size code (see _size_cast)
    for index, node in enumerate(graph.nodes()):
        kind = node.kind()
        if kind in PLUMBING:
            if kind in _SIZE_SOURCES:
                sizes.update(node.outputs())
            continue
        if scope_all is not None:
            scope = scope_all
        else:
            scope = scope_of[index] if scope_of and index in scope_of else node.scopeName()
        if kind == FUNCTION_CALL:
            body = function_body(node)
            if body is not None:  # counted as the ops inside it, in the Function's module
                events.extend(_graph_events(body, scope_all=scope, autocast=autocast))
                continue
        inputs = list(node.inputs())
        cast = autocast_cast(node) if autocast and kind in CASTS else None
        if cast == MUTED:
            reader.read_as(node.outputsAt(0), inputs[0])
            continue
        if sizes and _shape_arithmetic(kind, node, inputs, sizes, trace_only):
            continue
        if autocast and kind in CASTS and cast != USER and _changes_dtype(node, inputs, reader):
            kind = RENAMED  # a cast added below Python (autocast's), as the dispatch tracers name it
        # aten, quantized and custom-library ops carry a schema; prim nodes do not
        names = _argument_names(node.schema()) if not kind.startswith("prim::") else None
        if names is None or len(names) < len(inputs):
            names = tuple(f"arg{i}" for i in range(len(inputs)))
        args: Mapping[str, Any] = _LazyArgs(names, inputs, reader)
        kind, extra = canonical(kind)  # the one operator vocabulary (tracers/_vocabulary.py)
        if extra:
            args = {**args, **extra}
        outputs = _LazyOutputs(list(node.outputs()), reader)
        stack = scopes.get(scope)
        if stack is None:
            stack = scopes[scope] = tuple(part for part in scope.split("/") if part)
        events.append(OpEvent(OpCall(kind, args, outputs), stack))
    return events


#: the sentences for failures torch.jit has with some models, the first that applies (else forward_error's)
_REFUSALS = (unpool_failure, meta_kernel_failure, function_failure, linearize_failure, higher_order_failure, transform_failure)

#: torch.jit's tracing state and the module map swapped in below are process-wide: two
#: threads tracing with jit at once take turns (the dispatch tracer needs no lock).
_JIT_LOCK = threading.Lock()


def trace(
    model: nn.Module,
    inputs: Any = (),
    kwargs: Optional[Mapping[str, Any]] = None,
    *,
    facts: Optional[ModelFacts] = None,
) -> Trace:
    """Trace one forward of ``model`` with torch.jit and return its op events.

    Every op the forward ran is counted, also those whose result is not returned (see
    :func:`keep_unread_results`). A value read into Python (``if t.any():``) is answered
    with the real value, so the trace holds the branch this input took."""
    if not is_available():
        raise TraceError("torch.jit tracing is not available in this torch build")
    call = prepare_call(inputs, kwargs)
    facts = model_facts(model) if facts is None else facts
    if facts.packed is not None:
        raise TraceError(
            f"the jit tracer cannot trace quantized packed parameters (in {module_place(facts.packed)}); "
            "use tracer='dispatch' or 'auto'",
            module_path=facts.packed,
            input_shapes=call.description,
        )
    scripted = next((name for name, module in facts.modules if isinstance(module, torch.jit.ScriptModule)), None)
    if scripted is not None:
        # torch.jit finds a ScriptModule's C++ object in no scope of the trace ("not part of the active trace")
        raise TraceError(
            f"the jit tracer cannot trace a TorchScript module again ({module_place(scripted)} is "
            "torch.jit.script-ed or loaded); use tracer='dispatch' or 'auto'",
            module_path=scripted,
            input_shapes=call.description,
        )
    flat = list(call.tensors)
    n_inputs = len(flat)
    state: List[torch.Tensor] = list({id(t): t for t in facts.parameters + facts.buffers}.values())

    def run(*traced: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        call_args, call_kwargs = call.rebuild(traced[:n_inputs])
        outputs = tuple(output_tensors(model(*call_args, **call_kwargs)))
        keep_unread_results(torch._C._get_tracing_state().graph())
        return outputs

    under_autocast = autocast_on()  # its casts marked as the trace runs (tracers/jit/autocast.py)
    names = facts.names
    scope_map = {module: name for module, name in names.items() if name}
    caught: List[warnings.WarningMessage] = []
    modules = ModuleStack(names)
    # the model's state given back as found (_real_run.py); draws redirected around the calls that draw
    with _JIT_LOCK, model_kept(model, modules, private_random=False) as watch:
        state = [watch.twin(t) for t in state]  # the buffers the run uses are copies
        previous_map = torch.jit._trace._trace_module_map
        torch.jit._trace._trace_module_map = scope_map
        try:
            # transformers' is_tracing() answered as in a real forward (tracers/fake/hf_tracing.py)
            with warnings.catch_warnings(), torch.no_grad(), static_unpool_sizes(model), jit_branches(facts.modules):
                warnings.simplefilter("always")
                warnings.showwarning = recording_warnings(caught)
                with private_random_calls() as random, AutocastCasts() if under_autocast else nullcontext():
                    graph, _ = torch._C._create_graph_by_tracing(run, flat + state, lambda value: "", False, False)
        except Exception as exc:
            refusal = next(filter(None, (refuse(exc, modules.current) for refuse in _REFUSALS)), None)
            if refusal is not None:
                raise TraceError(refusal, module_path=modules.current, input_shapes=call.description) from exc
            raise forward_error(exc, modules.current, call.description, "jit tracer") from exc
        finally:
            torch.jit._trace._trace_module_map = previous_map
        graph, inlined_scopes = inline_script_calls(graph, flat + state)
        refusal = tangent_refusal(graph)
        if refusal is not None:
            raise TraceError(refusal, module_path="", input_shapes=call.description)
        events = _graph_events(graph, inlined_scopes, inputs=flat + state, autocast=under_autocast)
        # the run's draws went to private generators (tracers/jit/random.py); the process's RNG is
        # set back only if one went elsewhere: a draw jit recorded outside the calls redirected
        # (a TorchScript function's randn), or an op the private generators cannot serve
        drawn = drawing_events(events)
        watch.drew_random = drawn > 0 if random is None else random.fell_back or drawn > random.redirected_calls
    # torch's own shape checks (BatchNorm's batch-size check...) warn too; they steer no cost
    notes = tuple(
        dict.fromkeys(
            f"{w.category.__name__}: {str(w.message).splitlines()[0]}"
            for w in caught
            if issubclass(w.category, torch.jit.TracerWarning) and not str(w.filename).startswith(_TORCH_DIR)
        )
    )
    gaps = _silent_modules(facts.modules, events, modules.calls)
    return Trace(tuple(events), "jit", dict(modules.calls), notes + gaps, gaps=gaps)


def trace_scripted(model: nn.Module, inputs: Any = (), kwargs: Optional[Mapping[str, Any]] = None, *,
                   facts: Optional[ModelFacts] = None) -> Optional[Trace]:
    """The op events of a TorchScript ``model`` read from its inlined graph (tracers/jit/scripted.py),
    each booked under the submodule that runs it; None when the graph is not one fixed sequence
    of ops with known shapes for these inputs (then the model is run, its work booked on it).
    Nothing runs: the graph is a copy, typed with the inputs' and the module's tensors' shapes."""
    if not isinstance(model, torch.jit.ScriptModule) or not is_available() or autocast_on():
        # under autocast TorchScript casts as it runs (``_autocast_to_reduced_precision`` nodes the
        # graph read cannot size): the program's dtypes are not the graph's, so it is run as before
        return None
    call = prepare_call(inputs, kwargs)
    if call.kwargs or len(call.args) != len(call.tensors) or not all(
        isinstance(arg, torch.Tensor) for arg in call.args
    ):
        return None
    facts = model_facts(model) if facts is None else facts
    tensors = list(call.tensors)
    with _JIT_LOCK:
        graph = scripted_graph(model, tensors)
        if graph is None:
            return None
        scope_of, calls, unread = scripted_scopes(graph, facts.names)
        events = _graph_events(graph, scope_of)
    gaps: Tuple[str, ...] = ()
    notes: Tuple[str, ...] = ()
    if unread:
        listing = ", ".join(repr(h) for h in unread[:5]) + (", ..." if len(unread) > 5 else "")
        notes = (f"jit: the module path of some TorchScript ops could not be read (module hierarchy {listing}): "
                 "they are booked on the nearest module that is known",)
    return Trace(tuple(events), "jit", calls, notes, gaps=gaps)


def _silent_modules(
    modules: Sequence[Tuple[str, nn.Module]], events: Sequence[OpEvent], calls: Mapping[str, int]
) -> Tuple[str, ...]:
    """A module with parameters that ran but recorded no op: its work was invisible to jit
    (done outside torch's traced ops), so the count may miss it."""
    seen = {name for event in events for name in event.module_stack}
    silent = [
        name
        for name, module in modules
        if name
        and calls.get(name, 0)
        and name not in seen
        and any(p is not None for p in module._parameters.values())
    ]
    if not silent:
        return ()
    listing = ", ".join(repr(name) for name in silent[:5]) + (", ..." if len(silent) > 5 else "")
    return (
        f"jit: module(s) {listing} ran but recorded no op, so jit did not count their work "
        "(use tracer='auto' or 'dispatch' to count it)",
    )
