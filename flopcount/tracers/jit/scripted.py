"""A TorchScript module (scripted, traced, or loaded from a ``.pt``) read from its own graph.

TorchScript runs a ScriptModule's submodules without Python's module hooks, so a run books all
their work on the scripted module. Its inlined graph (``ScriptModule.inlined_graph``, a fresh
copy on each read) keeps on every node the module hierarchy that called it
(``Node.getModuleHierarchy()``: ``mlp(MLP).fc1(Linear)``, and for an inlined function call
``act(ReLU).UNKNOWN_INSTANCE(UNKNOWN_TYPE)``), for scripted and traced modules alike and after
``torch.jit.load``. A graph without control flow, whose every tensor gets a shape from the call's
inputs and the module's tensors, is the program this call runs: its ops are read as the jit
tracer reads a trace, each booked under the module that runs it. Used only by
:mod:`flopcount.tracers.jit.tracer`."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import torch
from torch import nn

from flopcount.tracers.jit.graph import PLUMBING, tensor_meta

__all__ = ["module_path", "scripted_graph", "scripted_scopes"]

#: the segment ``getModuleHierarchy`` writes for an inlined function call: not a module
_UNKNOWN = "UNKNOWN_INSTANCE(UNKNOWN_TYPE)"


def module_path(hierarchy: str) -> Optional[str]:
    """The module path of a ``getModuleHierarchy()`` string (``mlp(MLP).fc1(Linear)`` ->
    ``mlp.fc1``; a trailing function call's segment dropped: the op is that module's own);
    None when the string cannot be read that way."""
    names: List[str] = []
    rest = hierarchy
    while rest:
        if rest.startswith(_UNKNOWN):
            break
        name, paren, tail = rest.partition("(")
        depth, end = 1, None
        for i, char in enumerate(tail):
            depth += {"(": 1, ")": -1}.get(char, 0)
            if depth == 0:
                end = i
                break
        if not paren or not name or end is None:
            return None
        names.append(name)
        rest = tail[end + 1:]
        if rest and not rest.startswith("."):
            return None
        rest = rest[1:]
    return ".".join(names)


def _attribute(node: Any, root: nn.Module) -> Any:
    """The object a chain of ``prim::GetAttr`` nodes from the graph's ``self`` reads (None if
    the chain starts elsewhere)."""
    path: List[str] = []
    while node.kind() == "prim::GetAttr":
        path.append(node.s("name"))
        node = node.input().node()
    if node.kind() != "prim::Param":
        return None
    value: Any = root
    for name in reversed(path):
        value = getattr(value, name, None)
    return value


def scripted_graph(model: torch.jit.ScriptModule, tensors: Sequence[torch.Tensor]) -> Optional[Any]:
    """``model``'s forward graph, inlined, typed with the shapes of ``tensors`` (the call's
    positional tensor arguments) and of the module's own tensors; None when it is not one fixed
    sequence of ops with known shapes (control flow, a call left opaque, a tensor the shape
    analysis cannot size, arguments that are not plain tensors)."""
    graph: Any = model.inlined_graph  # a copy: the model's own graph is not touched
    inputs = list(graph.inputs())[1:]  # the first is the module itself
    if len(inputs) != len(tensors):
        return None
    for node in graph.nodes():
        if next(iter(node.blocks()), None) is not None or node.kind() in ("prim::CallMethod", "prim::CallFunction"):
            return None
    for value, tensor in zip(inputs, tensors):
        if not isinstance(value.type(), torch.TensorType):
            return None
        value.setType(torch.TensorType.create_from_tensor(tensor))
    for node in graph.findAllNodes("prim::GetAttr"):
        out = node.output()
        if isinstance(out.type(), torch.ClassType):
            continue  # a submodule: only the path to its tensors
        held = _attribute(node, model)
        if isinstance(held, torch.Tensor):
            out.setType(torch.TensorType.create_from_tensor(held))
        elif held is not None or not isinstance(out.type(), (torch.OptionalType, torch.NoneType)):
            # a value the graph reads at run time (``self.training``): the handlers would read it unknown
            return None
    try:
        torch._C._jit_pass_propagate_shapes_on_graph(graph)
    except RuntimeError:
        return None
    for node in graph.nodes():
        for out in node.outputs():
            if isinstance(out.type(), torch.TensorType) and tensor_meta(out.type()) is None:
                return None
    return graph


def scripted_scopes(graph: Any, names: Mapping[nn.Module, str]) -> Tuple[Dict[int, str], Dict[str, int], List[str]]:
    """Each op node's scope (its module stack, ``a/a.b``) by position in ``graph.nodes()``; the
    calls of each module (one per maximal run of consecutive ops inside it: two back-to-back
    calls of one module read as one); and the hierarchies that name no module of ``names``,
    whose ops are kept on the nearest module that is known."""
    known = set(names.values())
    scopes: Dict[int, str] = {}
    calls: Dict[str, int] = {"": 1}
    unread: List[str] = []
    previous: Tuple[str, ...] = ()
    for index, node in enumerate(graph.nodes()):
        if node.kind() in PLUMBING:
            continue
        hierarchy = node.getModuleHierarchy()
        path = module_path(hierarchy)
        if path is None or path not in known:
            unread.append(hierarchy)
            parts = (path or "").split(".")
            while parts and ".".join(parts) not in known:
                parts.pop()
            path = ".".join(parts)
        stack = _stack(path)
        for depth, name in enumerate(stack):
            if depth >= len(previous) or previous[depth] != name:
                calls[name] = calls.get(name, 0) + 1
        previous = stack
        scopes[index] = "/".join(stack)
    return scopes, calls, list(dict.fromkeys(unread))


def _stack(path: str) -> Tuple[str, ...]:
    """``a.b.c`` -> (``a``, ``a.b``, ``a.b.c``); the root, ``""`` -> ()."""
    if not path:
        return ()
    parts = path.split(".")
    return tuple(".".join(parts[: i + 1]) for i in range(len(parts)))
