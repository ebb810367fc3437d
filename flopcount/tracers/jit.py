"""The torch.jit tracer: records the model's aten ops with shapes and module scopes.

Isolated here because torch.jit.trace is deprecated upstream: dropping this file
leaves the dispatch tracer and everything downstream untouched.
"""

from __future__ import annotations

import os
import warnings
from functools import lru_cache
from typing import Any, Dict, List, Mapping, Optional, Tuple

import torch
from torch import nn

from ..errors import TraceError
from ..types import OpCall, OpEvent, TensorMeta, Trace
from .modules import (
    ModuleStack,
    as_call_args,
    describe_inputs,
    flatten_tensors,
    forward_error,
    module_names,
    output_tensors,
    preserved_model_state,
)

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


def is_available() -> bool:
    return hasattr(torch, "jit") and hasattr(torch._C, "_create_graph_by_tracing")


@lru_cache(maxsize=None)
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

    def __init__(self) -> None:
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
        elif kind == "prim::Constant":
            result = _from_ivalue(value.toIValue())
        elif kind == "prim::ListConstruct":
            result = tuple(self.read(v) for v in producer.inputs())
        else:
            result = None  # an int or float computed while tracing: only its shape-free use is known
        self._cache[value] = result
        return result


def _graph_events(graph: Any) -> List[OpEvent]:
    reader = _ValueReader()
    scopes: Dict[str, Tuple[str, ...]] = {}
    events: List[OpEvent] = []
    for node in graph.nodes():
        kind = node.kind()
        if kind in _PLUMBING:
            continue
        inputs = list(node.inputs())
        names = _argument_names(node.schema()) if kind.startswith("aten::") else None
        if names is None or len(names) < len(inputs):
            names = tuple(f"arg{i}" for i in range(len(inputs)))
        args = {name: reader.read(v) for name, v in zip(names, inputs)}
        outputs = tuple(
            _tensor_meta(o.type()) if isinstance(o.type(), torch._C.TensorType) else None for o in node.outputs()
        )
        scope = node.scopeName()
        stack = scopes.get(scope)
        if stack is None:
            stack = scopes[scope] = tuple(part for part in scope.split("/") if part)
        events.append(OpEvent(OpCall(kind, args, outputs), stack))
    return events


def trace(model: nn.Module, inputs: Any = (), kwargs: Optional[Mapping[str, Any]] = None) -> Trace:
    """Trace one forward of ``model`` with torch.jit and return its op events."""
    if not is_available():
        raise TraceError("torch.jit tracing is not available in this torch build")
    args, kw = as_call_args(inputs, kwargs)
    flat, rebuild = flatten_tensors((args, kw))
    n_inputs = len(flat)
    state: List[torch.Tensor] = []
    seen = set()
    for tensor in list(model.parameters()) + list(model.buffers()):
        if id(tensor) not in seen:
            seen.add(id(tensor))
            state.append(tensor)

    def run(*traced: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        call_args, call_kwargs = rebuild(traced[:n_inputs])
        return tuple(output_tensors(model(*call_args, **call_kwargs)))

    names = module_names(model)
    scope_map = {module: name for module, name in names.items() if name}
    caught: List[warnings.WarningMessage] = []
    previous_map = torch.jit._trace._trace_module_map
    with preserved_model_state(model), ModuleStack(names) as modules:
        torch.jit._trace._trace_module_map = scope_map
        try:
            with warnings.catch_warnings(record=True) as caught, torch.no_grad():
                warnings.simplefilter("always")
                graph, _ = torch._C._create_graph_by_tracing(run, flat + state, lambda value: "", False, False)
        except Exception as exc:
            raise forward_error(exc, modules.current, describe_inputs(inputs, kwargs), "jit") from exc
        finally:
            torch.jit._trace._trace_module_map = previous_map
    # torch's own shape checks (BatchNorm's batch-size check...) warn too; they steer no cost
    notes = tuple(
        dict.fromkeys(
            f"{w.category.__name__}: {str(w.message).splitlines()[0]}"
            for w in caught
            if issubclass(w.category, torch.jit.TracerWarning) and not str(w.filename).startswith(_TORCH_DIR)
        )
    )
    return Trace(tuple(_graph_events(graph)), "jit", dict(modules.calls), notes)
