"""flopcount's input convention: a tuple is positional arguments, anything else is one
argument; flattening the tensors inside inputs and outputs; describing inputs in text."""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections import OrderedDict
from typing import Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import torch
from torch.nn.parameter import UninitializedTensorMixin  # type: ignore[attr-defined]  # missing from the stubs

from flopcount.errors import TraceError, UsageError
from flopcount.types import dtype_name


def as_call_args(inputs: Any, kwargs: Optional[Mapping[str, Any]]) -> Tuple[Tuple[Any, ...], Dict[str, Any]]:
    """flopcount's input convention: a tuple is unpacked into positional arguments;
    anything else (a Tensor, list, dict, nested container) is ONE positional argument."""
    if kwargs is not None and not isinstance(kwargs, Mapping):
        raise UsageError(f"kwargs must be a mapping of keyword arguments, got {type(kwargs).__name__}")
    args = inputs if isinstance(inputs, tuple) else (inputs,)
    return args, dict(kwargs or {})


@dataclasses.dataclass(frozen=True)
class PreparedCall:
    """One call's example inputs, prepared once and handed down (tracing, costing, the
    result's description, benchmarking, memory): the positional and keyword arguments by
    flopcount's convention (:func:`as_call_args`), every tensor inside them in order,
    and their description. ``with_tensors`` gives the same call with other tensors in
    their places (fake twins, copies on another device). ``known``: by place in :attr:`tensors`,
    the value a tensor without data stands for where its maker knows it (a CPU tensor, or None):
    the decoding loop's position ids on meta, which a fake run's index checks read."""

    args: Tuple[Any, ...]
    kwargs: Dict[str, Any]
    tensors: Tuple[torch.Tensor, ...]
    rebuild: Callable[[Sequence[torch.Tensor]], Any] = dataclasses.field(repr=False, compare=False)
    description: str = ""
    known: Tuple[Optional[torch.Tensor], ...] = dataclasses.field(default=(), repr=False, compare=False)

    def with_tensors(self, tensors: Sequence[torch.Tensor]) -> PreparedCall:
        """The same call with ``tensors`` in the places of :attr:`tensors`."""
        args, kwargs = self.rebuild(tensors)
        return dataclasses.replace(self, args=tuple(args), kwargs=dict(kwargs), tensors=tuple(tensors))


def require_module(model: Any, who: str) -> torch.nn.Module:
    """``model`` when it is a ``torch.nn.Module``; else a :class:`UsageError` naming ``who``,
    the function the user called (``"count_flops"``), and what was given."""
    if not isinstance(model, torch.nn.Module):
        raise UsageError(f"{who} expects a torch.nn.Module, got {type(model).__name__}")
    return model


def prepare_call(inputs: Union[Any, PreparedCall] = (), kwargs: Optional[Mapping[str, Any]] = None) -> PreparedCall:
    """The :class:`PreparedCall` of ``inputs`` and ``kwargs`` (walked once); a call
    already prepared is returned as it is."""
    if isinstance(inputs, PreparedCall):
        if kwargs:
            raise UsageError("kwargs go into the PreparedCall, not beside it")
        return inputs
    if inputs is None:  # "no positional inputs", as with kwargs-only models
        inputs = ()
    args, kw = as_call_args(inputs, kwargs)
    tensors, rebuild = flatten_tensors((args, kw))
    return PreparedCall(args, kw, tuple(tensors), rebuild, describe_inputs(inputs, kwargs))


def misgiven_inputs(call: PreparedCall, forward: Callable[..., Any], who: str = "count_flops", failure: str = "") -> Optional[str]:
    """What a forward that failed may have been given in place of its inputs, as a sentence, or
    None: a shape (``(4, 16)``, a ``torch.Size``) or a CLI SPEC string (``"4x16"``) where example
    tensors go, a list of tensors where ``failure`` (the error's text) says an op got a list (a
    list is one input, a tuple is unpacked), a dict of ``forward``'s keyword arguments (a
    tokenizer's output) given as its one positional input, or positional inputs for keyword-only
    parameters; ``kwargs=`` takes the last two (the example calls ``who``, the function the user called)."""
    args = call.args
    if not args:
        return None
    listed = args[0] if not call.kwargs and len(args) == 1 and isinstance(args[0], list) else None
    if listed and all(isinstance(item, torch.Tensor) for item in listed) and "list" in failure:
        names = "x," if len(listed) == 1 else ", ".join(f"x{i}" for i in range(len(listed)))
        return (f"the list of {len(listed)} tensor{'s' if len(listed) > 1 else ''} went in as forward's one argument "
                f"(a list is one input; a tuple is unpacked into forward's arguments): give {who}(model, ({names}))")
    numbers = args[0] if len(args) == 1 and isinstance(args[0], (list, tuple)) else args
    if not call.kwargs and numbers and all(isinstance(arg, int) and not isinstance(arg, bool) for arg in numbers):
        shape = ", ".join(str(arg) for arg in numbers)
        return (f"the inputs are the numbers ({shape}), not tensors: give example tensors, "
                f"e.g. torch.randn({shape}), not a shape")
    if not call.kwargs and len(args) == 1 and isinstance(args[0], str):
        return (f"the input is the string {args[0]!r}: SPECs are the command line's; "
                "in Python give example tensors, e.g. torch.randn(4, 16)")
    try:
        parameters = inspect.signature(forward).parameters
    except (TypeError, ValueError):
        return None
    kinds = [p.kind for p in parameters.values()]
    keyword_only = [name for name, p in parameters.items() if p.kind is inspect.Parameter.KEYWORD_ONLY]
    positional = sum(kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD) for kind in kinds)
    if keyword_only and inspect.Parameter.VAR_POSITIONAL not in kinds and len(args) > positional:
        return (f"forward takes {positional} positional input(s) and {len(args)} were given; its keyword-only "
                f"{', '.join(keyword_only)} go in kwargs=, e.g. {who}(model, kwargs={{{keyword_only[0]!r}: x}})")
    if call.kwargs or len(args) != 1 or not isinstance(args[0], Mapping) or not args[0]:
        return None
    keys = list(args[0])
    if not all(isinstance(key, str) and key in parameters for key in keys):
        return None
    first = next(iter(parameters), "")
    return (f"the dict of {', '.join(keys)} went in as forward's first argument ({first!r}): "
            f"to pass its entries as keyword arguments give it as kwargs=, e.g. {who}(model, kwargs=batch)")


def dtype_mismatch(call: PreparedCall, model: Any) -> Optional[str]:
    """The floating inputs in one dtype and ``model``'s floating parameters in another (a float16
    input into a float32 model: torch says "mat1 and mat2 must have the same dtype"), as a sentence
    naming both and the two casts that make them agree, or None."""
    if not isinstance(model, torch.nn.Module):
        return None
    given = {t.dtype for t in call.tensors if t.is_floating_point()}
    held = {p.dtype for p in model.parameters() if p.is_floating_point()}
    if len(given) != 1 or len(held) != 1 or given == held:
        return None
    inputs, weights = (str(dtype).replace("torch.", "") for dtype in (given.pop(), held.pop()))
    return (f"the floating inputs are {inputs} but the model's parameters are {weights}: give the inputs as "
            f"x.to(torch.{weights}), or cast the model, model.to(torch.{inputs})")


def with_input_hint(error: TraceError, call: PreparedCall, forward: Callable[..., Any], who: str = "count_flops") -> TraceError:
    """``error`` (a forward that failed on ``call``) with :func:`misgiven_inputs`' sentence added
    after a ``;``, or ``error`` itself when there is none: the one wording of every reading that
    runs the forward (``count_flops``, ``benchmark``, ``profile``...)."""
    hint = misgiven_inputs(call, forward, who, str(error)) or dtype_mismatch(call, getattr(forward, "__self__", None))
    if hint is None:
        return error
    return type(error)(f"{error}; {hint}", module_path=error.module_path, input_shapes=error.input_shapes)


def flatten_tensors(obj: Any) -> Tuple[List[torch.Tensor], Callable[[Sequence[torch.Tensor]], Any]]:
    """Every tensor inside ``obj`` (tuples, namedtuples, lists, mappings, dataclass
    instances, nested) and a function that rebuilds ``obj`` with replacement tensors in the
    same order. An object met again inside itself (a cycle) is kept as it is.

    The one container walker, for call arguments and outputs (:func:`output_tensors`). Plain
    recursion over module-level functions: no closure refers to itself, so no reference cycle
    keeps the walked tensors alive after the call."""
    tensors: List[torch.Tensor] = []
    return tensors, _node(obj, tensors, set())  # the walk fills ``tensors`` as it builds the rebuild


Rebuild = Callable[[Sequence[torch.Tensor]], Any]


def _node(node: Any, tensors: List[torch.Tensor], open_nodes: set) -> Rebuild:
    if isinstance(node, torch.Tensor):
        index = len(tensors)
        tensors.append(node)
        return lambda values: values[index]
    if not isinstance(node, (tuple, list, Mapping)) and not _is_dataclass_instance(node):
        return lambda values: node
    if id(node) in open_nodes:  # a cycle: keep the object
        return lambda values: node
    open_nodes.add(id(node))
    try:
        return _container(node, tensors, open_nodes)
    finally:
        open_nodes.discard(id(node))


def _container(node: Any, tensors: List[torch.Tensor], open_nodes: set) -> Rebuild:
    if isinstance(node, (tuple, list)):
        parts = [_node(v, tensors, open_nodes) for v in node]
        seq_kind = type(node)
        if isinstance(node, tuple) and hasattr(node, "_fields"):  # namedtuple
            return lambda values: seq_kind(*(p(values) for p in parts))
        return lambda values: seq_kind(p(values) for p in parts) if seq_kind in (tuple, list) else seq_kind([p(values) for p in parts])
    if isinstance(node, Mapping):
        return _mapping(node, [(k, _node(v, tensors, open_nodes)) for k, v in node.items()])
    fields = [
        (f.name, f.init, _node(getattr(node, f.name), tensors, open_nodes))
        for f in dataclasses.fields(node)
        if hasattr(node, f.name)
    ]

    def rebuild_dataclass(values: Sequence[torch.Tensor]) -> Any:
        made = dataclasses.replace(node, **{name: p(values) for name, init, p in fields if init})
        for name, init, p in fields:
            if not init:  # not an __init__ argument: set on the copy
                object.__setattr__(made, name, p(values))
        return made

    return rebuild_dataclass


def _mapping(node: Mapping, items: List[Tuple[Any, Rebuild]]) -> Rebuild:
    kind: Any = type(node)
    ordered = isinstance(node, OrderedDict)

    def rebuild_mapping(values: Sequence[torch.Tensor]) -> Any:
        rebuilt = {k: p(values) for k, p in items}
        if kind is dict:
            return rebuilt
        try:
            return kind(rebuilt)
        except Exception:
            return OrderedDict(rebuilt) if ordered else rebuilt

    return rebuild_mapping


def _is_dataclass_instance(node: Any) -> bool:
    return dataclasses.is_dataclass(node) and not isinstance(node, type)


def flat_values(values: Iterable[Any]) -> Iterator[Any]:
    """Each value, with a list's or tuple's items in its place (one level: an op's arguments)."""
    for value in values:
        yield from value if isinstance(value, (list, tuple)) else (value,)


def output_tensors(obj: Any) -> List[torch.Tensor]:
    """Tensors inside a model's output (tensors, containers, dataclasses, HF ModelOutput), by the
    walker of :func:`flatten_tensors` (not that function: a call's inputs are flattened once)."""
    tensors: List[torch.Tensor] = []
    _node(obj, tensors, set())
    return tensors


def describe_inputs(inputs: Any, kwargs: Optional[Mapping[str, Any]] = None) -> str:
    """A short human description of example inputs, e.g. ``(Tensor[1, 3, 224, 224] float32)``."""

    def one(node: Any) -> str:
        if isinstance(node, torch.Tensor):
            dtype = dtype_name(node.dtype)
            where = "" if node.device.type == "cpu" else f" {node.device.type}"
            if node.layout != torch.strided:  # sparse_coo, sparse_csr...
                where += " " + str(node.layout).replace("torch.", "")
            return f"Tensor[{', '.join(str(s) for s in node.shape)}] {dtype}{where}"
        if isinstance(node, Mapping):
            return "{" + ", ".join(f"{k!r}: {one(v)}" for k, v in node.items()) + "}"
        if isinstance(node, tuple):
            return "(" + ", ".join(one(v) for v in node) + ("," if len(node) == 1 else "") + ")"
        if isinstance(node, list):
            return "[" + ", ".join(one(v) for v in node) + "]"
        if _is_dataclass_instance(node):
            shown = [f"{f.name}={one(getattr(node, f.name))}" for f in dataclasses.fields(node) if f.repr and hasattr(node, f.name)]
            return f"{type(node).__name__}({', '.join(shown)})"
        text = repr(node)
        return text if len(text) <= 40 else text[:37] + "..."

    text = one(inputs)
    if kwargs:
        text += " with kwargs {" + ", ".join(f"{k}={one(v)}" for k, v in kwargs.items()) + "}"
    return text


@functools.cache
def fake_tensor_type() -> type:
    from torch._subclasses.fake_tensor import FakeTensor  # imported on first use: it is slow to load

    return FakeTensor


def is_dataless(tensor: torch.Tensor) -> bool:
    """True for tensors without data (meta device, FakeTensors): shapes only."""
    return tensor.device.type == "meta" or isinstance(tensor, fake_tensor_type())


def is_uninitialized(tensor: torch.Tensor) -> bool:
    """True for the parameters and buffers of a lazy module not materialised yet
    (``nn.LazyLinear`` before its first forward): their shape is not known."""
    return isinstance(tensor, UninitializedTensorMixin)
