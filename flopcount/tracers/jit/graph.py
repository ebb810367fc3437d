"""jit-only graph machinery: what counts as plumbing in a traced graph, types to shapes,
inlining scripted callees, and keeping ops whose result nothing reads (so the jit tracer
counts discarded work, issue #9.1). Used only by :mod:`flopcount.tracers.jit.tracer`."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

import torch

from flopcount.types import TensorMeta

__all__ = [
    "FUNCTION_CALL", "MODULE_CALL", "PLUMBING", "function_body", "inline_script_calls", "keep_unread_results",
    "tensor_meta",
]

_CALL_FUNCTION = "prim::CallFunction"  # a call of a torch.jit.script-ed function

# Graph plumbing, not operations: the values they carry are read where they are used.
PLUMBING = frozenset(
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

# How a live trace records a module call: a node whose block holds the module's ops
# (torch turns it into scope names when the trace ends).
MODULE_CALL = "prim::TracedModuleForward"
FUNCTION_CALL = "prim::PythonOp"  # a custom autograd.Function

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



def tensor_meta(jit_type: Any) -> Optional[TensorMeta]:
    try:
        sizes = jit_type.sizes()
    except RuntimeError:
        return None
    if sizes is None:
        return None
    dtype = jit_type.scalarType()
    return TensorMeta(tuple(int(s) for s in sizes), _JIT_DTYPES.get(dtype, dtype.lower() if dtype else None))


def inline_script_calls(graph: Any, inputs: Sequence[torch.Tensor]) -> Tuple[Any, Dict[int, str]]:
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
        value.setType(torch.TensorType.create_from_tensor(tensor))
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
            if isinstance(out.type(), torch.TensorType) and tensor_meta(out.type()) is None:
                return graph, {}
        scopes[index] = scope
    return inlined, scopes


def function_body(node: Any) -> Optional[Any]:
    """The ops a custom ``autograd.Function``'s forward ran, as jit keeps them in the
    ``prim::PythonOp`` node's ``Subgraph`` attribute (with shapes); None when this torch
    keeps no subgraph or it holds no op (the Function then stays one opaque node)."""
    if not node.hasAttribute("Subgraph"):
        return None
    body = node.g("Subgraph")
    return body if any(inner.kind() not in PLUMBING for inner in body.nodes()) else None


def keep_unread_results(graph: Any) -> None:
    """Make every recorded op whose result nothing reads an output of the graph being traced.

    At the end of a trace torch removes, as dead code, every op that does not lead to the
    returned tensors: work whose result is discarded (``self.aux(x)``), stored on a module
    (``self.aux_loss = ...``), appended to a list, or only read into Python (``if m.any():``,
    ``.item()``). Such work ran and costs what it costs, so it is kept: called while the
    trace is still live, after the forward and before torch registers the outputs. Those
    extra outputs are never read; torch's own passes (module scopes, op-alias names) then
    treat the kept ops like every other. The ops a custom ``autograd.Function`` ran are
    left alone: its ``prim::PythonOp`` stands for them (see _function_bodies)."""
    has_functions = bool(graph.findAllNodes(FUNCTION_CALL))  # rare: most graphs take the quick loop
    blocks = [graph.block()]
    while blocks:
        nodes: Any = blocks.pop().nodes()
        bodies: Set[int] = set()
        if has_functions:
            nodes = list(nodes)
            bodies = _function_bodies(nodes)
        for index, node in enumerate(nodes):
            if node.hasUses() or (bodies and index in bodies):
                continue
            kind = node.kind()
            if kind == "prim::Constant":
                continue
            if kind == MODULE_CALL:  # a module's ops, recorded in its own block
                blocks.extend(node.blocks())
            elif node.outputsSize():
                # one output keeps the node and all it was computed from (also through
                # plumbing: ``int(mask.sum())`` ends in an unused aten::Int)
                graph.registerOutput(node.outputsAt(0))
            else:
                for value in node.inputs():  # an op without results (an assert): keep its inputs
                    graph.registerOutput(value)


def _function_bodies(nodes: Sequence[Any]) -> Set[int]:
    """Positions in ``nodes`` (one block) of the ops custom autograd Functions' forwards recorded.

    jit records a Function call as a ``prim::PythonOp`` (counted by a handler for it, or
    reported unsupported), then the forward's ops right after it (after a
    ``prim::TupleUnpack`` of its results, if any). torch copies those into the node's
    ``Subgraph`` and leaves the originals to its dead-code cleanup; keeping them would
    count the Function twice. Without a ``Subgraph`` their extent is unknown: nothing
    after the call is kept."""
    bodies: Set[int] = set()
    for index, call in enumerate(nodes):
        if call.kind() != FUNCTION_CALL or index in bodies:
            continue
        start = index + 1
        if start < len(nodes) and nodes[start].kind() == "prim::TupleUnpack":
            start += 1
        if call.hasAttribute("Subgraph"):
            bodies.update(range(start, start + sum(1 for _ in call.g("Subgraph").nodes())))
        else:
            bodies.update(range(start, len(nodes)))
    return bodies
