"""An eager attention's score matrix, found in a forward's events by module and by shape.

With ``attn_implementation="eager"`` transformers has no attention op: its
``eager_attention_forward`` runs ``matmul(q, k^T)``, then elementwise ops over the Lq x Lk
scores (scaling, Gemma-2's soft-capping ``div``/``tanh``/``mul``, the mask's ``add``,
``softmax``, ``dropout``; GPT-OSS's over the scores and a sink column), then ``matmul(p, v)``,
all booked under the attention module. A
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
#: matmul's dispatch is recorded as its leaf)
_PRODUCTS = frozenset({"aten::matmul", "aten::bmm"})


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
    """The two inputs' and the output's shapes of a matmul or bmm of two batched matrices with
    the same batch dimensions; None for any other call."""
    if call.op not in _PRODUCTS:
        return None
    inputs = call.tensors()
    try:
        out = call.out(0)
    except KeyError:
        return None
    if len(inputs) != 2:
        return None
    a, b = inputs[0].shape, inputs[1].shape
    if len(a) < 3 or len(a) != len(b) or a[:-2] != b[:-2] or a[-1] != b[-2] or tuple(out.shape) != (*a[:-1], b[-1]):
        return None
    return tuple(a), tuple(b), tuple(out.shape)


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
    return shapes is not None and shapes[0] == scores


def _on_scores(call: OpCall, cost: Cost, scores: Tuple[int, ...]) -> bool:
    """Whether ``call`` is an elementwise op on the ``scores``: it reads a tensor of their shape,
    its other tensors broadcast to it, it writes their shape, and it is priced per score (its
    FLOPs a whole multiple of the scores' count)."""
    try:
        out = call.out(0)
    except KeyError:
        return False
    inputs = call.tensors()
    return (tuple(out.shape) == scores and any(tuple(t.shape) == scores for t in inputs)
            and all(_broadcasts(t, scores) for t in inputs) and cost.flops > 0 and cost.flops % _count(scores) == 0)


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
