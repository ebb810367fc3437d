"""The torch.jit tracer: records the model's aten ops with shapes and module scopes.

Isolated here because torch.jit.trace is deprecated upstream: dropping this file
leaves the dispatch tracer and everything downstream untouched.
"""

from __future__ import annotations

import os
import warnings
from functools import cache
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import torch
from torch import nn

from .._packed import packed_objects
from ..errors import TraceError
from ..inputs import as_call_args, describe_inputs, flatten_tensors, output_tensors
from ..types import OpCall, OpEvent, TensorMeta, Trace
from ._jit_sizes import static_unpool_sizes, unpool_failure
from ._modules import ModuleStack, forward_error, module_names
from ._state import preserved_model_state
from ._vocabulary import canonical

# Graph plumbing, not operations: the values they carry are read where they are used.
_PLUMBING = frozenset(
    {
        "prim::Constant",
        "prim::ListConstruct",
        "prim::ListUnpack",
        "prim::TupleConstruct",
        "prim::TupleUnpack",
        "prim::DictConstruct",
        "prim::GetAttr",
        "prim::Param",
        "prim::Return",
        # Python-int bookkeeping jit records when a forward reads sizes (x.size(0) -> int):
        # shape arithmetic, not tensor operations; the dispatch tracer never sees it.
        "aten::size",
        "prim::NumToTensor",
        "aten::Int",
        "aten::ScalarImplicit",
    }
)

_JIT_DTYPES = {
    "Float": "float32",
    "Double": "float64",
    "Half": "float16",
    "BFloat16": "bfloat16",
    "Long": "int64",
    "Int": "int32",
    "Short": "int16",
    "Char": "int8",
    "Byte": "uint8",
    "Bool": "bool",
    "ComplexFloat": "complex64",
    "ComplexDouble": "complex128",
}


_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep

# jit types a nested tensor without sizes. TransformerEncoder's fast path (eval with a
# padding mask) makes one from the padded input and passes it through its layers; read
# it as the padded shape, which is what the dispatch tracer runs (docs/conventions.md).
_NESTED_FROM_PADDED = frozenset({"aten::_nested_tensor_from_mask", "aten::_transformer_encoder_layer_fwd"})


def is_available() -> bool:
    """Both private hooks this tracer needs exist (else ``auto`` uses the dispatch tracer)."""
    trace_module = getattr(getattr(torch, "jit", None), "_trace", None)
    return hasattr(torch._C, "_create_graph_by_tracing") and hasattr(trace_module, "_trace_module_map")


@cache
def _argument_names(schema: str) -> Optional[Tuple[str, ...]]:
    if not schema or schema == "(no schema)":
        return None
    try:
        parsed = torch._C.parse_schema(schema)
    except RuntimeError:
        return None
    return tuple(arg.name for arg in parsed.arguments)


def _tensor_meta(jit_type: Any) -> Optional[TensorMeta]:
    try:
        sizes = jit_type.sizes()
    except RuntimeError:
        return None
    if sizes is None:
        return None
    dtype = jit_type.scalarType()
    return TensorMeta(tuple(int(s) for s in sizes), _JIT_DTYPES.get(dtype, dtype.lower() if dtype else None))


def _from_ivalue(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return TensorMeta(tuple(value.shape), str(value.dtype).replace("torch.", ""))
    if isinstance(value, list):
        return tuple(_from_ivalue(v) for v in value)
    return value


class _ValueReader:
    """Turns graph values into handler arguments (TensorMeta, tuples, scalars), memoised."""

    def __init__(self, graph: Any) -> None:
        self._graph = graph  # graph values are only valid while their graph lives
        self._cache: Dict[Any, Any] = {}

    def read(self, value: Any) -> Any:
        try:
            return self._cache[value]
        except KeyError:
            pass
        jit_type = value.type()
        producer = value.node()
        kind = producer.kind()
        if isinstance(jit_type, torch._C.TensorType):
            result: Any = _tensor_meta(jit_type)
            if result is None and kind == "prim::Constant":
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
        if name in self._read:
            return self._read[name]
        value = self._read[name] = self._reader.read(self._values[name])  # KeyError if no such argument
        return value

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


_CALL_FUNCTION = "prim::CallFunction"


def _inline_script_calls(graph: Any, inputs: Sequence[torch.Tensor]) -> Tuple[Any, Dict[int, str]]:
    """Replace each call of a ``torch.jit.script``-ed function by the callee's ops.

    jit records such a call as one opaque ``prim::CallFunction`` node. Inlining puts the
    callee's aten ops in its place, without shapes: torch's symbolic shape analysis fills
    them in from the graph inputs' shapes. Inlined nodes lose their module scope, so the
    returned map gives each (by its position in ``graph.nodes()``) its call's scope. A
    callee with control flow (``prim::If``/``prim::Loop``: how often a branch runs is data)
    or whose shapes cannot be derived is left as the opaque call, which
    ``tracer="auto"`` treats as a reason to use the dispatch tracer."""
    if not any(node.kind() == _CALL_FUNCTION for node in graph.nodes()):
        return graph, {}
    inlined = graph.copy()
    # Nodes that survive inlining are told apart from inlined ones by identity: their
    # Python wrappers are kept alive (pybind hands back the same objects), the call nodes'
    # are not (inlining frees those nodes, and a new node may reuse the address).
    originals: List[Any] = []
    follow: Dict[int, str] = {}  # original node -> scope of the inlined ops right after it
    lead: Optional[str] = None  # the scope of calls before any original node
    pending: Optional[str] = None
    for node in inlined.nodes():
        if node.kind() == _CALL_FUNCTION:
            pending = node.scopeName() if pending is None else pending
            continue
        if pending is not None:
            if originals:
                follow[id(originals[-1])] = pending
            else:
                lead = pending
        pending = None
        originals.append(node)
    if pending is not None and originals:
        follow[id(originals[-1])] = pending
    del node
    known = {id(node) for node in originals}
    torch._C._jit_pass_inline(inlined)
    nodes = list(inlined.nodes())
    if any(next(iter(node.blocks()), None) is not None for node in nodes):
        return graph, {}
    for value, tensor in zip(inlined.inputs(), inputs):
        value.setType(torch._C.TensorType.create_from_tensor(tensor))
    try:
        torch._C._jit_pass_propagate_shapes_on_graph(inlined)
    except RuntimeError:
        return graph, {}
    scopes: Dict[int, str] = {}
    scope = lead or ""
    for index, node in enumerate(nodes):
        if id(node) in known:
            scope = follow.get(id(node), "")
            continue
        for out in node.outputs():
            if isinstance(out.type(), torch._C.TensorType) and _tensor_meta(out.type()) is None:
                return graph, {}
        scopes[index] = scope
    return inlined, scopes


_PYTHON_OP = "prim::PythonOp"


def _function_body(node: Any) -> Optional[Any]:
    """The ops a custom ``autograd.Function``'s forward ran, as jit keeps them in the
    ``prim::PythonOp`` node's ``Subgraph`` attribute (with shapes); None when this torch
    keeps no subgraph or it holds no op (the Function then stays one opaque node)."""
    if not node.hasAttribute("Subgraph"):
        return None
    body = node.g("Subgraph")
    if not any(inner.kind() not in _PLUMBING for inner in body.nodes()):
        return None
    return body


def _graph_events(
    graph: Any, scope_of: Optional[Mapping[int, str]] = None, scope_all: Optional[str] = None
) -> List[OpEvent]:
    reader = _ValueReader(graph)
    scopes: Dict[str, Tuple[str, ...]] = {}
    events: List[OpEvent] = []
    for index, node in enumerate(graph.nodes()):
        kind = node.kind()
        if kind in _PLUMBING:
            continue
        if scope_all is not None:
            scope = scope_all
        else:
            scope = scope_of[index] if scope_of and index in scope_of else node.scopeName()
        if kind == _PYTHON_OP:
            body = _function_body(node)
            if body is not None:  # counted as the ops inside it, in the Function's module
                events.extend(_graph_events(body, scope_all=scope))
                continue
        inputs = list(node.inputs())
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


#: jit's warning when Python reads a tensor's value (``if t.any():``, ``.item()``, ``.tolist()``)
VALUE_READ = "Converting a tensor to a"


class ValueReadError(TraceError):
    """jit stopped at the forward's first read of a tensor value into Python (outside torch)."""


def _value_read(exc: BaseException) -> Optional[BaseException]:
    """The value-read warning raised as an error, if ``exc`` is one. It may arrive wrapped
    (torch reports a SystemError whose cause is the TracerWarning): follow the chain."""
    node: Optional[BaseException] = exc
    for _ in range(8):
        if node is None:
            break
        if isinstance(node, torch.jit.TracerWarning) and VALUE_READ in str(node):
            return node
        node = node.__cause__ or node.__context__
    return None


def trace(
    model: nn.Module,
    inputs: Any = (),
    kwargs: Optional[Mapping[str, Any]] = None,
    *,
    stop_on_value_read: bool = False,
) -> Trace:
    """Trace one forward of ``model`` with torch.jit and return its op events.

    jit drops ops whose results only steer Python; with ``stop_on_value_read`` the trace
    stops at the first such read outside torch's own code and raises :class:`ValueReadError`
    (the caller then uses the dispatch tracer without paying for the rest of this trace)."""
    if not is_available():
        raise TraceError("torch.jit tracing is not available in this torch build")
    packed = next(packed_objects(model), None)
    if packed is not None:
        where = f"module '{packed[0]}'" if packed[0] else "the root module"
        raise TraceError(
            f"the jit tracer cannot trace quantized packed parameters (in {where}); use tracer='dispatch' or 'auto'",
            module_path=packed[0],
            input_shapes=describe_inputs(inputs, kwargs),
        )
    args, kw = as_call_args(inputs, kwargs)
    flat, rebuild = flatten_tensors((args, kw))
    n_inputs = len(flat)
    state: List[torch.Tensor] = []
    seen = set()
    for tensor in list(model.parameters()) + list(model.buffers()):
        if id(tensor) not in seen:
            seen.add(id(tensor))
            state.append(tensor)

    returned: List[int] = []

    def run(*traced: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        call_args, call_kwargs = rebuild(traced[:n_inputs])
        outputs = tuple(output_tensors(model(*call_args, **call_kwargs)))
        returned.append(len(outputs))
        return outputs

    names = module_names(model)
    scope_map = {module: name for module, name in names.items() if name}
    caught: List[warnings.WarningMessage] = []
    previous_map = torch.jit._trace._trace_module_map
    with preserved_model_state(model) as watch, ModuleStack(names) as modules:
        torch.jit._trace._trace_module_map = scope_map
        try:
            with warnings.catch_warnings(record=True) as caught, torch.no_grad(), static_unpool_sizes(model):
                warnings.simplefilter("always")
                if stop_on_value_read:
                    warnings.filterwarnings(
                        "error", message=VALUE_READ, category=torch.jit.TracerWarning, module=r"(?!torch(\.|$))"
                    )
                graph, _ = torch._C._create_graph_by_tracing(run, flat + state, lambda value: "", False, False)
        except Exception as exc:
            read = _value_read(exc) if stop_on_value_read else None
            if read is not None:
                where = f"module '{modules.current}'" if modules.current else "the root module"
                raise ValueReadError(
                    f"the forward reads tensor values into Python in {where} ({str(read).split('.')[0]})",
                    module_path=modules.current,
                    input_shapes=describe_inputs(inputs, kwargs),
                ) from exc
            unpool = unpool_failure(exc, modules.current)
            if unpool is not None:
                raise TraceError(unpool, module_path=modules.current, input_shapes=describe_inputs(inputs, kwargs)) from exc
            raise forward_error(exc, modules.current, describe_inputs(inputs, kwargs), "jit") from exc
        finally:
            torch.jit._trace._trace_module_map = previous_map
        stored = watch.assigned(names)
    # torch's own shape checks (BatchNorm's batch-size check...) warn too; they steer no cost
    notes = tuple(
        dict.fromkeys(
            f"{w.category.__name__}: {str(w.message).splitlines()[0]}"
            for w in caught
            if issubclass(w.category, torch.jit.TracerWarning) and not str(w.filename).startswith(_TORCH_DIR)
        )
    )
    graph, inlined_scopes = _inline_script_calls(graph, flat + state)
    events = _graph_events(graph, inlined_scopes)
    gaps = _dropped_work(model, events, modules.calls, stored, returned)
    return Trace(tuple(events), "jit", dict(modules.calls), notes + gaps, gaps=gaps)


def _dropped_work(
    model: nn.Module, events: Sequence[OpEvent], calls: Mapping[str, int], stored: Sequence[str], returned: Sequence[int]
) -> Tuple[str, ...]:
    """Work jit ran but left out of its graph. jit keeps only ops that reach the forward's
    returned tensors (it removes the rest as dead code), so work whose result is stored on
    a module, appended to a list or discarded is not in the graph. Three signs of it: the
    forward returned no tensor, it (re)assigned a tensor attribute or buffer of a module,
    or a module with parameters ran but no op of its forward is in the graph."""
    hint = "use tracer='auto' or 'dispatch' to count it"
    if returned and returned[0] == 0:
        return (f"jit: the forward returned no tensor, so jit kept none of its work ({hint})",)
    gaps = []
    if stored:
        listing = ", ".join(repr(name) for name in stored[:5]) + (", ..." if len(stored) > 5 else "")
        gaps.append(
            f"jit: the forward stored tensors on the model ({listing}); jit drops the work that computed "
            f"them when it does not reach the returned tensors ({hint})"
        )
    seen = {name for event in events for name in event.module_stack}
    silent = [
        name
        for name, module in model.named_modules()
        if name
        and calls.get(name, 0)
        and name not in seen
        and any(p is not None for p in module._parameters.values())
    ]
    if silent:
        listing = ", ".join(repr(name) for name in silent[:5]) + (", ..." if len(silent) > 5 else "")
        gaps.append(
            f"jit: module(s) {listing} ran but none of their ops reached the returned tensors, "
            f"so jit did not count them ({hint})"
        )
    return tuple(gaps)
