"""An eager attention's score matrix, found in a forward's events by module and by shape.

With ``attn_implementation="eager"`` transformers has no attention op: its
``eager_attention_forward`` runs ``matmul(q, k^T)``, then elementwise ops over the Lq x Lk
scores (scaling, Gemma-2's soft-capping ``div``/``tanh``/``mul``, the mask's ``add``,
``softmax``, ``dropout``; GPT-OSS's over the scores and a sink column), then ``matmul(p, v)``,
all booked under the attention module; some models write the scores' product as a
``baddbmm`` over the heads folded into the batch (GPT-2's ``reorder_and_upcast_attn``: (B H, Lq,
Lk) scores, viewed back as (B, H, Lq, Lk) for the ops after it) or as a two-operand ``einsum``. A
kernel that knows the call's mask computes only the scores it admits, and so the prefill's
bound may price these ops at those scores, as it prices an attention op
(:func:`flopcount.devices.roofline.masked_flops`). Nothing here reads a mask: the caller says
which modules' masks it knows (:func:`flopcount.decoding.runs.layer_masks`); this finds, in
each such module's own events, every ``QK^T -> ops on the scores -> PV`` exactly, or nothing."""

from __future__ import annotations

from dataclasses import dataclass
from typing import AbstractSet, Dict, List, Optional, Sequence, Tuple

from flopcount.devices.roofline import MATMUL, op_family
from flopcount.types import Cost, OpCall, OpEvent, TensorMeta

__all__ = ["ScoreOps", "score_ops"]

#: the products eager attention writes its two score matmuls with (torch.matmul; bmm where
#: matmul's dispatch is recorded as its leaf; baddbmm, its added tensor broadcast to the product)
_PRODUCTS = frozenset({"aten::matmul", "aten::bmm", "aten::baddbmm"})
_EINSUM = "aten::einsum"


@dataclass(frozen=True)
class ScoreOps:
    """One eager attention call in a forward: its module, its ``lq`` x ``lk`` scores per head,
    and the indices (among the forward's expanded events) of the ops priced by score: Q K^T,
    the elementwise ops on the scores between, and P V (``events``); and those over the scores
    with one sink logit per query appended, Lq x (Lk + 1) (``sinks``: GPT-OSS's row max,
    subtraction and softmax)."""

    module: str
    lq: int
    lk: int
    events: Tuple[int, ...]
    sinks: Tuple[int, ...] = ()


def score_ops(events: Sequence[Tuple[OpEvent, Optional[Cost]]], modules: AbstractSet[str], queries: int) -> List[ScoreOps]:
    """Each eager attention call of ``modules`` in ``events`` (a forward's, in order): under one
    module, a matmul of (..., Lq, d) by (..., d, Lk) with Lq = ``queries`` (the positions the
    forward feeds), then only ops that are not products, then a matmul of those (..., Lq, Lk)
    scores by (..., Lk, dv). The ops between that read the scores and write their shape, one
    or more FLOPs per score (elementwise), are priced by score too; so are those over the
    scores with one column appended by a ``cat`` along the keys (GPT-OSS's sinks), elementwise
    or a reduction along the keys; the others are not. A module whose products do not pair
    exactly so (a second score product before the first is used, a product between, a product
    left unpaired) gives nothing: its ops stay priced in full."""
    by_module: Dict[str, List[int]] = {}
    for index, (event, _) in enumerate(events):
        if event.module in modules:
            by_module.setdefault(event.module, []).append(index)
    found: List[ScoreOps] = []
    for module, indices in by_module.items():
        found.extend(_module_calls(module, indices, events, queries))
    return found


def _module_calls(module: str, indices: List[int], events: Sequence[Tuple[OpEvent, Optional[Cost]]],
                  queries: int) -> List[ScoreOps]:
    """:func:`score_ops` within one module's events (``indices``), or none if they do not pair exactly."""
    calls: List[ScoreOps] = []
    scores: Optional[Tuple[int, ...]] = None  # the pending call's score shape, after its Q K^T
    sunk: Optional[Tuple[int, ...]] = None  # its scores with a sink column, once a cat made them
    priced: List[int] = []
    sinks: List[int] = []
    for index in indices:
        call, cost = events[index][0].call, events[index][1]
        if op_family(call.op) == MATMUL:
            if scores is None:  # a product that is not Q K^T (a projection written inline) is left as counted
                scores = _query_key(call, queries)
                priced, sinks, sunk = [index], [], None
                continue
            if _probabilities_value(call, scores):
                calls.append(ScoreOps(module, scores[-2], scores[-1], (*priced, index), tuple(sinks)))
                scores = None
                continue
            return []
        if scores is None or cost is None or cost.parts:
            continue
        if _on_scores(call, cost, scores):
            priced.append(index)
        elif sunk is None and _sink_column(call, scores):
            sunk = (*scores[:-1], scores[-1] + 1)
        elif sunk is not None and (_on_scores(call, cost, sunk) or _along_keys(call, cost, sunk)):
            sinks.append(index)
    return [] if scores is not None else calls


def _pair(call: OpCall) -> Optional[Tuple[Tuple[int, ...], Tuple[int, ...], Tuple[int, ...]]]:
    """The shapes (..., M, K) and (..., K, N) of the two batched matrices a product multiplies,
    and its output's (..., M, N): a matmul or bmm of two with the same batch dimensions, a
    baddbmm (its added tensor broadcast to the output), or a two-operand :func:`_einsum_pair`;
    None for any other call."""
    if call.op == _EINSUM:
        return _einsum_pair(call)
    if call.op not in _PRODUCTS:
        return None
    inputs = call.tensors()
    try:
        out = tuple(call.out(0).shape)
    except KeyError:
        return None
    if call.op == "aten::baddbmm":  # (added, batch1, batch2)
        if len(inputs) != 3 or not _broadcasts(inputs[0], out):
            return None
        inputs = inputs[1:]
    if len(inputs) != 2:
        return None
    a, b = tuple(inputs[0].shape), tuple(inputs[1].shape)
    if len(a) < 3 or len(a) != len(b) or a[:-2] != b[:-2] or a[-1] != b[-2] or out != (*a[:-1], b[-1]):
        return None
    return a, b, out


def _einsum_pair(call: OpCall) -> Optional[Tuple[Tuple[int, ...], Tuple[int, ...], Tuple[int, ...]]]:
    """:func:`_pair` of an ``einsum`` of two operands, each subscript once in each, that is a
    batched matrix product written with subscripts ("bhqd,bhkd->bhqk", "bhqk,bhkd->bhqd"): one
    subscript contracted, one free in each operand, the rest batch subscripts of both; the output
    written as the batch subscripts then the two free ones, in that order. Its shapes as the
    matmul of the same product: (batch..., M, K), (batch..., K, N) and the output's."""
    equation, operands = call.arg("equation"), call.arg("tensors")
    if not (isinstance(equation, str) and isinstance(operands, (tuple, list)) and len(operands) == 2
            and all(isinstance(t, TensorMeta) for t in operands)) or "." in equation or equation.count("->") != 1:
        return None
    inputs, output = equation.replace(" ", "").split("->")
    letters = inputs.split(",")
    try:
        out = tuple(call.out(0).shape)
    except KeyError:
        return None
    if len(letters) != 2 or any(len(set(x)) != len(x) for x in (*letters, output)) or len(output) != len(out):
        return None
    sizes: Dict[str, int] = {}
    for subscripts, shape in zip((*letters, output), (*(tuple(t.shape) for t in operands), out)):
        if len(subscripts) != len(shape) or any(sizes.setdefault(x, n) != n for x, n in zip(subscripts, shape)):
            return None
    a, b = letters
    batch = [x for x in a if x in b and x in output]
    contracted = [x for x in a if x in b and x not in output]
    free_a, free_b = [x for x in a if x not in b], [x for x in b if x not in a]
    if len(contracted) != 1 or len(free_a) != 1 or len(free_b) != 1 or output != "".join([*batch, *free_a, *free_b]):
        return None
    leading = tuple(sizes[x] for x in batch)
    m, k, n = sizes[free_a[0]], sizes[contracted[0]], sizes[free_b[0]]
    return (*leading, m, k), (*leading, k, n), out


def _query_key(call: OpCall, queries: int) -> Optional[Tuple[int, ...]]:
    """The score shape (..., Lq, Lk) of Q K^T, a product of (..., Lq, d) by (..., d, Lk) whose
    rows are the forward's ``queries`` positions; None for any other product."""
    shapes = _pair(call)
    if shapes is None or shapes[2][-2] != queries:
        return None
    return shapes[2]


def _probabilities_value(call: OpCall, scores: Tuple[int, ...]) -> bool:
    """Whether ``call`` is P V: the (..., Lq, Lk) ``scores`` times (..., Lk, dv)."""
    shapes = _pair(call)
    return shapes is not None and _as_scores(shapes[0], scores)


def _as_scores(shape: Tuple[int, ...], scores: Tuple[int, ...]) -> bool:
    """Whether a tensor of ``shape`` holds the (..., Lq, Lk) ``scores``, their heads and batch
    rows as they are or folded into one dimension, or unfolded (a view of them): the same Lq x Lk
    planes, as many of them."""
    return tuple(shape[-2:]) == tuple(scores[-2:]) and _count(tuple(shape)) == _count(scores)


def _on_scores(call: OpCall, cost: Cost, scores: Tuple[int, ...]) -> bool:
    """Whether ``call`` is an elementwise op on the ``scores``: it reads a tensor of their shape
    (:func:`_as_scores`), its other tensors broadcast to it, it writes that shape, and it is
    priced per score (its FLOPs a whole multiple of the scores' count)."""
    try:
        out = tuple(call.out(0).shape)
    except KeyError:
        return False
    inputs = call.tensors()
    return (_as_scores(out, scores) and any(tuple(t.shape) == out for t in inputs)
            and all(_broadcasts(t, out) for t in inputs) and cost.flops > 0 and cost.flops % _count(scores) == 0)


def _sink_column(call: OpCall, scores: Tuple[int, ...]) -> bool:
    """Whether ``call`` appends one column to the ``scores`` along the keys: ``cat`` of the
    (..., Lq, Lk) scores and a (..., Lq, 1) tensor, in that order, into (..., Lq, Lk + 1)."""
    if call.op != "aten::cat" or call.arg("dim") not in (-1, len(scores) - 1):
        return False
    parts = call.arg("tensors")
    try:
        out = call.out(0)
    except KeyError:
        return False
    return (isinstance(parts, (tuple, list)) and len(parts) == 2
            and all(isinstance(t, TensorMeta) for t in parts) and tuple(parts[0].shape) == scores
            and tuple(parts[1].shape) == (*scores[:-1], 1) and tuple(out.shape) == (*scores[:-1], scores[-1] + 1))


def _along_keys(call: OpCall, cost: Cost, scores: Tuple[int, ...]) -> bool:
    """Whether ``call`` reduces the ``scores`` along the keys (a row's max: (..., Lq, Lk) into
    (..., Lq, 1)), priced per score."""
    inputs = call.tensors()
    try:
        out = call.out(0)
    except KeyError:
        return False
    return (len(inputs) == 1 and tuple(inputs[0].shape) == scores and tuple(out.shape) == (*scores[:-1], 1)
            and cost.flops > 0 and cost.flops % _count(scores) == 0)


def _count(shape: Tuple[int, ...]) -> int:
    numel = 1
    for size in shape:
        numel *= size
    return numel


def _broadcasts(tensor: TensorMeta, shape: Tuple[int, ...]) -> bool:
    """Whether ``tensor`` broadcasts to ``shape`` without growing it."""
    own = tuple(tensor.shape)
    if len(own) > len(shape):
        return False
    return all(a in (1, b) for a, b in zip(own[::-1], shape[::-1]))
