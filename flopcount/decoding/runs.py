"""Which decode steps :func:`flopcount.count_generation` traces, and how it costs the others.

Decode step s attends to a context of ``base + s + 1`` positions. Between two **limits** of
the model's cache (the context lengths at which a layer changes how it grows: a sliding
window filling, a chunk boundary of chunked attention, a fixed-size state's kernel, a
rotary scaling switch) every shape and integer argument of a step is affine in s. So the
steps are cut into runs at the limits (the steps next to a limit are traced one by one);
in each run the first three steps and the last are traced, and the steps between them are
costed as the affine continuation of the first two, provided it reproduces the third and
the last exactly. Otherwise every step is traced.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Callable, Dict, FrozenSet, Iterator, List, Mapping, Optional, Sequence, Set, Tuple

import torch

from flopcount.core.analysis import cost_events
from flopcount.core.registry import HandlerRegistry
from flopcount.core.results import FlopResult, reprice_deferred
from flopcount.decoding.caches import items_of
from flopcount.types import Cost, OpCall, OpEvent, Phase, TensorMeta, Trace

__all__ = [
    "Affine", "LayerMask", "Limits", "NotAffine", "cache_layer_masks", "cache_limits", "layer_masks", "mask_limits",
    "module_masks", "paired", "plan_runs", "same_event",
]

# Attribute and config keys whose integer value is a context length at which a cache layer
# or the position encoding may change behaviour.
_LIMIT_KEYS = frozenset({
    "sliding_window", "sliding_window_size", "attention_window", "local_window_size", "window_size",
    "max_cache_len", "attention_chunk_size", "conv_kernel", "conv_kernel_size", "d_conv", "mamba_d_conv",
    "conv_L_cache", "max_position_embeddings", "original_max_position_embeddings",
})
# The keys of _LIMIT_KEYS past which a layer's attention mask is no longer the causal one (a
# window, an attention chunk): the others change the cache's size or the position encoding.
_MASK_KEYS = frozenset({
    "sliding_window", "sliding_window_size", "attention_window", "local_window_size", "window_size",
    "attention_chunk_size",
})
# Keys whose value is a period: every multiple of it is a limit (chunked attention's chunks).
_PERIOD_KEYS = frozenset({"attention_chunk_size"})
_MARGIN = 1  # steps either side of a limit traced one by one (off-by-one conventions differ)
_MIN_RUN = 5  # a shorter run has nothing to predict: steps a, a+1, a+2 and b are traced anyway
_MAX_PERIODS = 256  # a chunk this small makes most steps traced anyway: trace them all


@dataclass(frozen=True)
class Limits:
    """Context lengths at which the cache may stop growing or change shape (``windows``), and
    chunk sizes whose every multiple is such a length (``periods``)."""

    windows: FrozenSet[int] = frozenset()
    periods: FrozenSet[int] = frozenset()

    def within(self, low: int, high: int) -> List[int]:
        """The limits in the context range ``low..high``, each once, in order."""
        found: Set[int] = {w for w in self.windows if low <= w <= high}
        for period in self.periods:
            first = max(1, -(-low // period))
            found.update(period * k for k in range(first, high // period + 1))
        return sorted(found)


def cache_limits(cache: Any, config: Any, keys: FrozenSet[str] = _LIMIT_KEYS) -> Limits:
    """The limits read from the cache object (each layer's window, ``max_cache_len``, conv
    kernel) and from the model's config (``sliding_window``, ``attention_chunk_size`` with
    ``layer_types``, rotary scaling lengths, in sub-configs too); ``keys``: the names read."""
    windows: Set[int] = set()
    periods: Set[int] = set()
    sources: List[Any] = [cache]
    if config is not None:
        to_dict = getattr(config, "to_dict", None)
        sources.append(to_dict() if callable(to_dict) else config)
    for source in sources:
        for key, value in _keyed_ints(source, set(), keys):
            if key in _PERIOD_KEYS:
                periods.add(value)
            windows.add(value)
    return Limits(frozenset(w for w in windows if w > 0), frozenset(p for p in periods if p > 0))


def mask_limits(cache: Any, config: Any) -> Limits:
    """The context lengths past which a layer's attention mask may stop being the causal one:
    :func:`cache_limits` of the windows and attention chunks only."""
    return cache_limits(cache, config, _MASK_KEYS)


@dataclass(frozen=True)
class LayerMask:
    """An attention layer's causal mask: within a sliding ``window`` (W keys up to the query's
    own), within an attention ``chunk`` (C-aligned blocks), or, with neither, all earlier keys;
    ``slots``: the keys are a static cache's that many slots (position i in slot i, the slots
    not yet written masked), not the positions."""

    window: Optional[int] = None
    chunk: Optional[int] = None
    slots: Optional[int] = None


# transformers' cache layers whose keys are every position fed (DynamicLayer), the latest
# W - 1 of them and the call's own (DynamicSlidingWindowLayer, also for an attention chunk of W),
# or ``max_cache_len`` slots written at the positions' indices (StaticLayer); a static cache's
# sliding layer (StaticSlidingWindowLayer) keeps m = min(W, max_cache_len) slots: position i in
# slot i while they last, then the W latest positions (rolled), and hands a call that fills or
# passes them the positions before it and its own (all of them from an empty cache, else at
# least the W - 1 latest): the keys masked_flops and one_position_flops take for a window and slots
_FULL_LAYER, _SLIDING_LAYER, _STATIC_LAYER = "DynamicLayer", "DynamicSlidingWindowLayer", "StaticLayer"
_STATIC_SLIDING_LAYER = "StaticSlidingWindowLayer"


def layer_masks(model: Any, cache: Any) -> Dict[str, LayerMask]:
    """Qualified module name -> the causal mask its attention runs, for the modules with an
    integer ``layer_idx`` whose layer the config and the cache agree on: transformers' own
    rule gives the layer's type (``cache_utils.get_layer_types_and_kwargs``: ``layer_types``,
    or per layer ``sliding_window`` / ``attention_chunk_size``), and the cache holds that layer
    as the dynamic layer of that type and window (a full layer also as a static cache's
    ``StaticLayer``, a sliding layer as its ``StaticSlidingWindowLayer`` of at most W slots,
    the slots known). Empty where transformers has no such rule,
    or the cache no such ``layers``; a layer they disagree on, or of any other type, is left out."""
    return module_masks(model, cache_layer_masks(model, cache))


def cache_layer_masks(model: Any, cache: Any) -> Dict[int, LayerMask]:
    """:func:`layer_masks` by the cache's layer index: each layer the config and the cache agree on."""
    config = getattr(model, "config", None)
    layers = getattr(cache, "layers", None)
    # a transformers cache has loaded its module: nothing is imported here
    layer_types = getattr(sys.modules.get("transformers.cache_utils"), "get_layer_types_and_kwargs", None)
    if config is None or not isinstance(layers, (list, tuple)) or not callable(layer_types):
        return {}
    try:
        types, options = layer_types(config.get_text_config(decoder=True))
    except (AttributeError, TypeError, ValueError):
        return {}
    known: Dict[int, LayerMask] = {}
    for index, (kind, option) in enumerate(zip(types, options)):
        if index < len(layers):
            mask = _agreed_mask(kind, option.get("sliding_window"), layers[index])
            if mask is not None:
                known[index] = mask
    return known


def module_masks(model: Any, known: Mapping[int, LayerMask]) -> Dict[str, LayerMask]:
    """Qualified module name -> ``known``'s mask of its ``layer_idx``, for the modules with one."""
    found: Dict[str, LayerMask] = {}
    for name, module in model.named_modules():
        layer = getattr(module, "layer_idx", None)
        if isinstance(layer, int) and not isinstance(layer, bool) and layer in known:
            found[name] = known[layer]
    return found


def _agreed_mask(kind: Any, size: Any, layer: Any) -> Optional[LayerMask]:
    """The mask of a layer of type ``kind`` (window or chunk ``size``) whose cache layer is
    ``layer``, where the two agree; None otherwise."""
    held = type(layer).__name__
    if kind == "full_attention" and held == _FULL_LAYER:
        return LayerMask()
    slots = getattr(layer, "max_cache_len", None)
    if kind == "full_attention" and held == _STATIC_LAYER and isinstance(slots, int) and slots > 0:
        return LayerMask(slots=slots)
    if (kind == "sliding_attention" and held == _STATIC_SLIDING_LAYER and isinstance(size, int)
            and isinstance(slots, int) and 0 < slots <= size):
        return LayerMask(window=size, slots=slots)
    if not (isinstance(size, int) and size > 0 and held == _SLIDING_LAYER and getattr(layer, "sliding_window", None) == size):
        return None
    if kind == "sliding_attention":
        return LayerMask(window=size)
    if kind == "chunked_attention":
        return LayerMask(chunk=size)
    return None


def _keyed_ints(obj: Any, visited: Set[int], keys: FrozenSet[str]) -> Iterator[Tuple[str, int]]:
    """``(key, int)`` for every key of ``keys`` found in ``obj``'s attributes, mappings and lists."""
    if id(obj) in visited or obj is None or isinstance(obj, (int, float, str, bool, bytes)):
        return
    visited.add(id(obj))
    for key, value in () if isinstance(obj, (torch.Tensor, torch.nn.Module)) else items_of(obj):
        if isinstance(key, str) and key in keys:
            yield from ((key, v) for v in _ints(value))
        elif not isinstance(value, (int, float, str, bool)):
            yield from _keyed_ints(value, visited, keys)


def _ints(value: Any) -> Iterator[int]:
    if isinstance(value, int) and not isinstance(value, bool):
        yield value
    elif isinstance(value, (Mapping, list, tuple)):
        for v in value.values() if isinstance(value, Mapping) else value:
            yield from _ints(v)


def plan_runs(total: int, base: int, limits: Limits, every_step: bool) -> List[Tuple[int, int, bool]]:
    """Steps ``0..total-1`` as consecutive runs ``(first, last, predictable)``: a predictable
    run crosses no limit and is long enough to predict; the others are traced step by step.
    ``base``: the positions cached after the prefill (step s has context ``base + s + 1``)."""
    if total <= 0:
        return []
    if every_step:
        return [(0, total - 1, False)]
    kinks = limits.within(base + 1, base + total)
    if len(kinks) > _MAX_PERIODS:
        return [(0, total - 1, False)]
    near: Set[int] = set()
    for context in kinks:
        step = context - base - 1
        near.update(range(max(0, step - _MARGIN), min(total - 1, step + _MARGIN) + 1))
    runs: List[Tuple[int, int, bool]] = []
    start = 0
    for step in range(total + 1):
        if step == total or step in near:
            if step > start:
                runs.append((start, step - 1, step - start >= _MIN_RUN))
            if step < total:
                runs.append((step, step, False))
            start = step + 1
    return _merged(runs)


def _merged(runs: List[Tuple[int, int, bool]]) -> List[Tuple[int, int, bool]]:
    """Adjacent traced-only runs as one."""
    merged: List[Tuple[int, int, bool]] = []
    for run in runs:
        if merged and not run[2] and not merged[-1][2]:
            merged[-1] = (merged[-1][0], run[1], False)
        else:
            merged.append(run)
    return merged


def same_event(a: OpEvent, b: OpEvent, *, call: bool = True) -> bool:
    """Whether two events run one op in the same modules and phase (``call``: with equal
    arguments and outputs too)."""
    return a.call.op == b.call.op and a.module_stack == b.module_stack and a.phase == b.phase and (
        not call or (a.call.args == b.call.args and tuple(a.call.outputs) == tuple(b.call.outputs)))


class NotAffine(Exception):
    """Two steps that no affine continuation joins (different ops, dtypes or ranks)."""


Costed = List[Tuple[OpEvent, Optional[Cost]]]


class Affine:
    """Step ``first + s`` of a run as the affine continuation of its first two steps: every
    tensor dimension and integer argument is ``v0 + (v1 - v0) * s``; the rest is unchanged."""

    def __init__(self, first: Costed, second: Costed, registry: HandlerRegistry):
        if len(first) != len(second):
            raise NotAffine
        self.registry = registry
        self.first = first
        self.varying: List[Tuple[int, OpEvent, OpEvent]] = []
        for index, ((a, _), (b, _)) in enumerate(zip(first, second)):
            if not same_event(a, b, call=False):
                raise NotAffine
            if not same_event(a, b):
                self.varying.append((index, a, b))
        # the distinct (step 0, step 1) call pairs among the varying events (the same attention in
        # each of 80 layers): each is continued and priced once per step
        groups: Dict[Any, int] = {}
        #: each group's first varying event: the pair its call is continued from
        self._firsts: Dict[int, Tuple[int, OpEvent, OpEvent]] = {}
        #: the varying events by (group, phase, their cost at the run's first step)
        self._members: Dict[Tuple[int, Phase, Cost], List[OpEvent]] = {}
        #: each varying event's group (in the order of :attr:`varying`)
        self._groups: List[int] = []
        #: the index in a step's events -> its group, for the varying events (made when first asked)
        self._group_of: Optional[Dict[int, int]] = None
        for varying in self.varying:
            index, a, b = varying
            group = groups.setdefault(_pair_key(a.call, b.call), len(groups))
            self._groups.append(group)
            self._firsts.setdefault(group, varying)
            old = first[index][1]
            if old is not None:  # unpriced at the first step: nothing to re-cost
                self._members.setdefault((group, a.phase, old), []).append(a)

    @staticmethod
    def check(traced: List[Tuple[Trace, Costed]], registry: HandlerRegistry) -> Optional[Affine]:
        """The continuation of the first two traced steps if it reproduces the third exactly."""
        (run0, costed0), (run1, costed1), (run2, costed2) = traced[:3]
        if run0.gaps or run1.gaps or run2.gaps:
            return None
        try:
            affine = Affine(costed0, costed1, registry)
        except NotAffine:
            return None
        return affine if affine.matches(2, run2, costed2) else None

    def matches(self, step: int, run: Trace, costed: Costed) -> bool:
        """Whether the traced ``costed`` events are exactly the continuation at ``step``."""
        if run.gaps:
            return False
        try:
            predicted = self.events(step)
        except NotAffine:
            return False
        return len(predicted) == len(costed) and all(same_event(event, actual) for event, (actual, _) in zip(predicted, costed))

    def events(self, step: int) -> List[OpEvent]:
        """The run's events at ``step``: each distinct pair of calls continued once (equal pairs
        continue into equal calls), as :meth:`changes` continues them."""
        events = [event for event, _ in self.first]
        calls = {group: _moved_call(a, b, step) for group, (_, a, b) in self._firsts.items()}
        for (index, a, _), group in zip(self.varying, self._groups):
            events[index] = OpEvent(calls[group], a.module_stack, a.phase)
        return events

    def costed_at(self, step: int, indices: Sequence[int]) -> Costed:
        """The events at ``indices`` of the run's step ``step`` with their costs: one that does not
        vary as at the first step, one that varies as its continued call (each distinct pair of
        calls among them continued and priced once)."""
        if self._group_of is None:
            self._group_of = {index: group for (index, _, _), group in zip(self.varying, self._groups)}
        group_of = self._group_of
        groups = sorted({group_of[i] for i in indices if i in group_of})
        heads = [OpEvent(_moved_call(a, b, step), a.module_stack, a.phase)
                 for a, b in (self._firsts[group][1:] for group in groups)]
        moved = dict(zip(groups, cost_events(heads, self.registry)))
        out: Costed = []
        for index in indices:
            event, cost = self.first[index]
            if index in group_of:
                head, cost = moved[group_of[index]]
                event = OpEvent(head.call, event.module_stack, event.phase)
            out.append((event, cost))
        return out

    def changes(self, step: int) -> List[Tuple[List[OpEvent], Cost, Cost]]:
        """The varying events at ``step`` as (events, cost at the run's first step, cost now),
        events grouped by the pair of calls they continue (the same call in each of 80 layers is
        continued once, into one call object, priced once per phase); events unpriced at the
        first step or now are left out (unsupported either way: nothing to re-cost)."""
        calls = {group: _moved_call(a, b, step) for group, (_, a, b) in self._firsts.items()}
        heads = tuple(OpEvent(calls[group], events[0].module_stack, phase) for (group, phase, _), events in self._members.items())
        return [(events, old, new) for ((_, _, old), events), (_, new) in zip(self._members.items(), cost_events(heads, self.registry))
                if new is not None]

    def result_at(self, step: int, first: FlopResult) -> FlopResult:
        """The run's step ``step``: its first step's result with the events that change re-costed
        (:meth:`changes`): the step's work is the number of distinct changing calls, not the
        model's depth. Its totals are exact at once, its tables are booked when first read
        (:func:`reprice_deferred`)."""
        return reprice_deferred(first, self.changes(step))


def _pair_key(a: OpCall, b: OpCall) -> Any:
    """Two equal keys continue into equal calls (the continuation is a function of the pair).
    By value where the arguments hash; else by the calls' identity (structural reuse books one
    call object for a call booked again)."""
    key = (a.op, tuple(a.args.items()), tuple(a.outputs), tuple(b.args.items()), tuple(b.outputs))
    try:
        hash(key)
    except TypeError:
        return (id(a), id(b))
    return key


def _moved_call(a: OpEvent, b: OpEvent, step: int) -> OpCall:
    return OpCall(a.call.op, _continue(a.call.args, b.call.args, step), _continue(tuple(a.call.outputs), tuple(b.call.outputs), step))


def _continue(a: Any, b: Any, step: int) -> Any:
    """``a`` at step 0 and ``b`` at step 1, continued to ``step``."""
    return paired(a, b, lambda x, y: TensorMeta(tuple(p + (q - p) * step for p, q in zip(x.shape, y.shape)), x.dtype),
                  lambda x, y: x + (y - x) * step, lambda x: x)


def paired(a: Any, b: Any, tensors: Callable[[TensorMeta, TensorMeta], Any], ints: Callable[[int, int], Any],
           equal: Callable[[Any], Any]) -> Any:
    """Two values of one structure walked together (tuples and mappings entry by entry):
    ``equal(a)`` where they are equal, ``tensors(a, b)`` for two tensors of one dtype and rank
    and ``ints(a, b)`` for two ints that differ; :class:`NotAffine` where they differ otherwise."""
    if a == b:
        return equal(a)
    if isinstance(a, TensorMeta) and isinstance(b, TensorMeta):
        if a.dtype != b.dtype or len(a.shape) != len(b.shape):
            raise NotAffine
        return tensors(a, b)
    if isinstance(a, int) and isinstance(b, int) and not isinstance(a, bool) and not isinstance(b, bool):
        return ints(a, b)
    if isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b):
        return tuple(paired(x, y, tensors, ints, equal) for x, y in zip(a, b))
    if isinstance(a, Mapping) and isinstance(b, Mapping) and a.keys() == b.keys():
        return {key: paired(a[key], b[key], tensors, ints, equal) for key in a}
    raise NotAffine
