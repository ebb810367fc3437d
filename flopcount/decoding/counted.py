"""The forwards of a greedy ``generate()`` counted one by one: the prefill (one forward, or
one per chunk) and each decode step, traced or costed as the exact affine continuation of the
steps before it (:mod:`flopcount.decoding.runs`). A model whose weights are all on the meta
device (or fake) is traced on fake copies, as ``count_flops`` traces it (shape cache,
structural reuse of repeated layers given the KV cache); one with real weights, or one whose
forward fakes cannot run, by the dispatch tracer on the model as given (:class:`Counter`). Shared by the
readings over generation: ``count_generation`` books them as a GenerationResult, ``serve``
prices them on a part. Besides each forward's FlopResult, :func:`count_decoding` keeps what
the cache held after the prefill and after each traced step (the positions' bytes), so a
reading can say what each decode step reads from the cache."""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Dict, FrozenSet, Iterator, List, Mapping, Optional, Tuple

import torch
from torch import nn

from flopcount.core.analysis import cost_events, uncompiled
from flopcount.core.collection import PausedCollections
from flopcount.core.diagnostics import first_line
from flopcount.core.inputs import (
    PreparedCall,
    describe_inputs,
    fake_tensor_type,
    is_dataless,
    prepare_call,
    require_module,
)
from flopcount.core.ledger import expand_booked
from flopcount.core.model_facts import model_facts
from flopcount.core.results import FlopResult, aggregate
from flopcount.core.state import left_as_found, module_attributes_kept, preserved_random_modules
from flopcount.decoding.caches import cache_position_bytes
from flopcount.decoding.eager import ScoreOps, score_ops
from flopcount.decoding.forwards import (
    Decoding,
    FakeRefused,
    LastOutput,
    Setup,
    cache_of,
    generation_options,
    is_encoder_decoder,
    refuse_without_prompt_input,
    split_prompt,
)
from flopcount.decoding.runs import (
    Affine,
    Costed,
    LayerMask,
    Limits,
    cache_layer_masks,
    cache_limits,
    layer_masks,
    mask_limits,
    module_masks,
    plan_runs,
)
from flopcount.devices.roofline import (
    attention_lengths,
    bottom_right_causal_flops,
    kernel_flops,
    masked_flops,
    one_position_flops,
    sink_flops,
    windowed_causal_flops,
)
from flopcount.errors import TraceError, UsageError, int_at_least
from flopcount.handlers import default_registry
from flopcount.tracers import trace, trace_on_fakes
from flopcount.tracers._real_run import run_for_output
from flopcount.types import OpCall, TensorMeta, Trace

__all__ = [
    "Counter", "DecodeMasks", "Decoded", "Skipped", "causal_modules", "count_decoding", "decode_masks", "eager_masks",
    "on_fakes", "prefill_skipped", "skipped_flops",
]


@dataclass(frozen=True)
class Skipped:
    """A forward's FLOPs that no kernel must perform (:func:`skipped_flops`): ``flops`` in all,
    ``attention`` the part of them booked under attention ops (the rest are an eager
    attention's score matmuls and elementwise ops, booked under their own names)."""

    flops: float = 0.0
    attention: float = 0.0

    def __add__(self, other: Skipped) -> Skipped:
        return Skipped(self.flops + other.flops, self.attention + other.attention)


@dataclass(frozen=True)
class DecodeMasks:
    """What a decode step's kernels need not touch where the config and the cache say which mask
    each layer runs (:func:`decode_masks`): the attention modules of its chunked-attention layers
    and of a static cache's layers (``modules``, by qualified name), and those cache layers
    (``layers``: each layer's mask and the bytes one position takes in it, keys and values of
    every sequence); ``eager``: the modules among them whose eager attention's score ops are
    priced by score (:func:`eager_masks`); ``pads``: of a padded prompt whose mask is proved
    (:attr:`~flopcount.decoding.forwards.Setup.rows`), each sequence's pad positions, which
    every layer of :func:`_padded_masks` holds (a sliding one until they roll out) and hands each
    step among its keys, masked. Empty where none is known."""

    modules: Mapping[str, LayerMask] = field(default_factory=dict)
    layers: Tuple[Tuple[LayerMask, float], ...] = ()
    eager: FrozenSet[str] = frozenset()
    pads: Tuple[int, ...] = ()

    def indices(self, costed: Costed) -> List[int]:
        """The places in ``costed`` (a decode step's events) of the events of :attr:`modules`."""
        if not self.modules:
            return []
        return [index for index, (event, _) in enumerate(costed) if event.module in self.modules]

    def skipped_flops(self, costed: Costed, position: int) -> Skipped:
        """The FLOPs of the decode step at ``position`` (its one new token's) that a kernel knowing
        each layer's mask does not perform: of an attention handed its mask, the keys the mask
        hides (an earlier attention chunk's, a static cache's empty slots), by
        :func:`flopcount.devices.roofline.one_position_flops`; of an eager attention of
        :attr:`eager` (its one query row's score ops, :func:`flopcount.decoding.eager.score_ops`),
        the same keys' share of each op priced by score, as the prefill prices them
        (:func:`~flopcount.devices.roofline.masked_flops` of one query at ``position``;
        :func:`~flopcount.devices.roofline.sink_flops` over GPT-OSS's scores and sink), booked
        apart from attention's."""
        if not self.modules:
            return Skipped()
        booked = list(expand_booked(costed))
        by_score: Dict[int, Tuple[ScoreOps, bool]] = {}  # event index -> its call, and whether over a sink column too
        for found in score_ops(booked, self.eager, 1) if self.eager else ():
            by_score.update((index, (found, False)) for index in found.events)
            by_score.update((index, (found, True)) for index in found.sinks)
        attention = other = 0.0
        priced: Dict[Tuple[int, LayerMask, float], float] = {}  # one call object in many layers: priced once
        for index, (event, cost) in enumerate(booked):
            mask = self.modules.get(event.module)
            if mask is None or cost is None or not cost.flops or cost.parts:
                continue
            scored = by_score.get(index)
            if scored is not None:  # its one query at ``position``: a forward of one position past the others
                found, sunk = scored
                priced_by_score = sink_flops if sunk else masked_flops
                if self.pads:  # each sequence's share at its own position, its pads among the keys (as slots)
                    other += cost.flops - sum(priced_by_score(cost.flops / len(self.pads), found.lq, found.lk,
                                                              position - pad, mask.window, slots=found.lk)
                                              for pad in self.pads)
                else:
                    other += cost.flops - priced_by_score(cost.flops, found.lq, found.lk, position, mask.window,
                                                          mask.chunk, mask.slots)
                continue
            key = (id(event.call), mask, cost.flops)
            if key not in priced:
                priced[key] = cost.flops - self._kept(event.call, cost.flops, position, mask) if _explicit(event.call) else 0.0
            attention += priced[key]
        return Skipped(attention + other, attention)

    def _kept(self, call: OpCall, flops: float, position: int, mask: LayerMask) -> float:
        """The part of a decode step's attention ``call`` a kernel knowing its mask computes
        (:func:`one_position_flops`); of a padded prompt's batch, each sequence's share (its
        query row) at its own position p - pad, the call's keys its slots, the pads masked (within a
        sliding window W, the min(W, p - pad + 1) of its own: of a left-padded row, the real keys among
        the slots p - W + 1..p that transformers' mask admits)."""
        if not self.pads:
            return one_position_flops(call, flops, position, mask.window, mask.chunk, mask.slots)
        query, lengths = call.arg("query"), attention_lengths(call)
        if lengths is None or not isinstance(query, TensorMeta) or query.shape[0] != len(self.pads):
            return flops
        return sum(one_position_flops(call, flops / len(self.pads), position - pad, mask.window, slots=lengths[1])
                   for pad in self.pads)

    def pad_bytes(self, written: int, stored: bool = False) -> float:
        """The bytes a padded prompt's pad positions take in the cache (every row's, every layer's
        keys and values), once ``written`` positions (pads included) were fed: a full-attention
        layer holds every pad; a sliding-window layer (W) the latest min(written, W - 1) positions
        (``stored``: the storage they are a view of, the last forward's concatenation of them and
        its own, min(written, W) after a decode step), of which the pads not yet rolled out (a
        left-padded row's first ``pad``)."""
        if not self.pads:
            return 0.0
        total = 0.0
        for mask, size in self.layers:
            held = min(written, mask.window - (0 if stored else 1)) if mask.window else written
            total += size * sum(max(0, pad - (written - held)) for pad in self.pads) / len(self.pads)
        return total

    def unread_bytes(self, position: int) -> float:
        """The bytes a chunked layer holds before the decode step at ``position`` p and its mask
        hides: min(p, C - 1) positions held, the p mod C of p's own chunk admitted."""
        return sum(size * (min(position, mask.chunk - 1) - position % mask.chunk)
                   for mask, size in self.layers if mask.chunk)

    def empty_bytes(self, live: int) -> float:
        """The bytes of a static cache's slots no position fills while it holds ``live`` positions."""
        return sum(size * max(0, mask.slots - live) for mask, size in self.layers if mask.slots)


def decode_masks(model: nn.Module, setup: Setup, cache: Any) -> DecodeMasks:
    """The :class:`DecodeMasks` of ``cache``, as the prefill returned it, for an unpadded prompt
    (:attr:`Setup.unpadded`) only: the layers :func:`flopcount.decoding.runs.cache_layer_masks`
    knows as chunked attention or a static cache's, each holding what its kind holds after the
    ``setup.base`` positions of the prefill (min(P, C - 1) positions; the static cache's slots)."""
    layers = getattr(cache, "layers", None)
    if setup.rows is not None and isinstance(layers, (list, tuple)):
        return _padded_masks(model, setup, cache, layers)
    if not setup.unpadded or not isinstance(layers, (list, tuple)):
        return DecodeMasks()
    known: Dict[int, LayerMask] = {}
    sizes: List[Tuple[LayerMask, float]] = []
    for index, mask in cache_layer_masks(model, cache).items():
        if not (mask.chunk or mask.slots):
            continue
        keys, values = getattr(layers[index], "keys", None), getattr(layers[index], "values", None)
        if not (isinstance(keys, torch.Tensor) and isinstance(values, torch.Tensor) and keys.dim() == values.dim() == 4):
            continue
        held = mask.slots if mask.slots else min(setup.base, (mask.chunk or 0) - 1)
        if not keys.shape[-2] == values.shape[-2] == held or not held:
            continue
        known[index] = mask
        sizes.append((mask, (keys.numel() * keys.element_size() + values.numel() * values.element_size()) / held))
    if not known:
        return DecodeMasks()
    modules = module_masks(model, known)
    return DecodeMasks(modules, tuple(sizes), frozenset(eager_masks(model, modules)))


def _padded_masks(model: nn.Module, setup: Setup, cache: Any, layers: Any) -> DecodeMasks:
    """The :class:`DecodeMasks` of a padded prompt's cache (:attr:`Setup.rows`): where the config
    and the cache say every layer is a full-attention ``DynamicLayer`` holding the P positions
    of each of the B sequences, pads included, a static cache's full-attention ``StaticLayer`` of S
    slots (position i in slot i, the pads' slots and the empty ones masked), or, with every row
    left-padded, a sliding-window ``DynamicSlidingWindowLayer`` (W) holding the latest min(P, W - 1)
    of them, each step's query row of sequence b sits at its position p - pad_b and its keys are
    the layer's positions, the pads masked (a sliding layer's window counts slots, p - W + 1..p: a
    left-padded row's real keys among them are its own latest min(W, p - pad_b + 1), read live; a
    right-padded row's are fewer than its sequence's, a function of its own, and left in full);
    else none (a static cache's sliding layer, whose slots roll: not proved)."""
    assert setup.rows is not None
    known = cache_layer_masks(model, cache)
    left = all(start + length == setup.prompt for start, length in setup.rows)
    if len(known) != len(layers) or not all(_padded_layer(mask, left) for mask in known.values()):
        return DecodeMasks()
    sizes: List[Tuple[LayerMask, float]] = []
    for index, layer in enumerate(layers):
        mask = known[index]
        held = mask.slots or (min(setup.base, mask.window - 1) if mask.window else setup.base)
        keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
        if not (held and isinstance(keys, torch.Tensor) and isinstance(values, torch.Tensor) and keys.dim() == values.dim() == 4
                and keys.shape[0] == setup.batch and keys.shape[-2] == values.shape[-2] == held):
            return DecodeMasks()
        sizes.append((mask, (keys.numel() * keys.element_size() + values.numel() * values.element_size()) / held))
    modules = module_masks(model, known)
    return DecodeMasks(modules, tuple(sizes), frozenset(eager_masks(model, modules)),
                       tuple(setup.prompt - length for _, length in setup.rows))


def _padded_layer(mask: LayerMask, left: bool) -> bool:
    """Whether a padded prompt's decode steps over a layer of ``mask`` are priced at each row's own
    positions (:func:`_padded_masks`): full attention over the positions or a static cache's slots;
    a sliding window over the positions where every row is left-padded (``left``)."""
    return mask in (LayerMask(), LayerMask(slots=mask.slots)) or (left and mask == LayerMask(window=mask.window))


@dataclass
class Decoded:
    """The counted forwards of one greedy ``generate()`` run and the cache it ends with.

    ``held``: step index -> the bytes of the positions the cache keeps after that step
    (``cache_position_bytes``), for the traced steps; index -1 is after the prefill.
    ``largest_write``: the most bytes one op of the prefill or of a traced step writes.
    ``prefill_skipped``: the prefill's FLOPs its kernels may skip (:func:`skipped_flops`);
    ``step_skipped``: each decode step's (:meth:`DecodeMasks.skipped_flops` of ``masks``)."""

    prefill: FlopResult
    steps: List[FlopResult]
    cache: Any
    notes: List[str]
    setup: Setup
    held: Dict[int, int] = field(default_factory=dict)
    largest_write: int = 0
    wall_s: float = 0.0
    prefill_skipped: Skipped = field(default_factory=Skipped)
    step_skipped: List[Skipped] = field(default_factory=list)
    masks: DecodeMasks = DecodeMasks()


def skipped_flops(costed: Costed, causal: FrozenSet[str] = frozenset(), past: int = 0,
                  masks: Optional[Mapping[str, LayerMask]] = None,
                  eager: Optional[Mapping[str, LayerMask]] = None, queries: int = 0) -> Skipped:
    """The FLOPs of ``costed``'s events that no kernel must perform: counted FLOPs minus
    :func:`flopcount.devices.roofline.kernel_flops` (a causal attention's scores past the
    diagonal; 0 for every other op). Each such op is booked under its own attention name
    (no ``Cost.parts``), so these FLOPs are also among those booked under attention ops.

    A later chunk of a causal prefill (``past`` positions cached before it): an attention of a
    module in ``causal`` (:func:`causal_modules` of the first chunk) whose keys are exactly the
    ``past`` positions and the chunk's own runs with a mask that is causal with that offset,
    priced as a bottom-right causal kernel computes it
    (:func:`flopcount.devices.roofline.bottom_right_causal_flops`).

    A prefill forward or chunk of an unpadded prompt (:attr:`Setup.unpadded`): an attention
    with an explicit mask of a module whose sliding window or attention chunk ``masks`` knows
    (:func:`flopcount.decoding.runs.layer_masks`) is priced at the scores that mask admits
    (:func:`flopcount.devices.roofline.windowed_causal_flops`), and so is a later chunk over a
    static cache's slots (the causal mask with its offset, the empty slots hidden); so are the score matmuls and
    the elementwise ops on the scores of each eager attention call of a module whose mask
    ``eager`` knows (:func:`eager_masks`), found over the forward's ``queries`` positions
    (:func:`flopcount.decoding.eager.score_ops`), at
    :func:`flopcount.devices.roofline.masked_flops` (:func:`~flopcount.devices.roofline.sink_flops`
    over GPT-OSS's scores with their sink column): these are not attention ops."""
    booked = list(expand_booked(costed))
    by_score: Dict[int, Tuple[ScoreOps, bool]] = {}  # event index -> its call, and whether over a sink column too
    for found in score_ops(booked, frozenset(eager or ()), queries) if eager else ():
        by_score.update((index, (found, False)) for index in found.events)
        by_score.update((index, (found, True)) for index in found.sinks)
    attention = other = 0.0
    for index, (event, cost) in enumerate(booked):
        if cost is None or not cost.flops or cost.parts:
            continue
        scored = by_score.get(index)
        if scored is not None:
            (found, sunk), layer = scored, (eager or {})[scored[0].module]
            priced = sink_flops if sunk else masked_flops
            other += cost.flops - priced(cost.flops, found.lq, found.lk, past, layer.window, layer.chunk, layer.slots)
            continue
        mask = (masks or {}).get(event.module)
        if mask is not None and (mask.window or mask.chunk or mask.slots) and _explicit(event.call):
            attention += cost.flops - windowed_causal_flops(event.call, cost.flops, past, mask.window, mask.chunk, mask.slots)
        elif event.module in causal and _after(event.call, past):
            attention += cost.flops - bottom_right_causal_flops(event.call, cost.flops)
        else:
            attention += cost.flops - kernel_flops(event.call, cost.flops)
    return Skipped(attention + other, attention)


def causal_modules(costed: Costed) -> FrozenSet[str]:
    """The modules whose every attention op of a forward with no past (a prefill's first
    chunk) ran a causal kernel over its own positions (``is_causal``, Lq = Lk): the model's
    mask for them is the causal one, which in a later chunk it hands the kernel explicitly."""
    causal: set[str] = set()
    other: set[str] = set()
    for event, cost in expand_booked(costed):
        if cost is None or not cost.flops or cost.parts:
            continue
        lengths = attention_lengths(event.call)
        if lengths is None:
            continue
        ran_causal = lengths[0] == lengths[1] and kernel_flops(event.call, cost.flops) < cost.flops
        (causal if ran_causal else other).add(event.module)
    return frozenset(causal - other)


def _after(call: OpCall, past: int) -> bool:
    """Whether attention ``call`` runs a chunk's queries over exactly ``past`` cached positions
    and the chunk's own, with an explicit mask (not ``is_causal``)."""
    lengths = attention_lengths(call)
    return lengths is not None and lengths[1] == past + lengths[0] and _explicit(call)


def _explicit(call: OpCall) -> bool:
    """Whether ``call`` is handed its mask (not causal by its own arguments)."""
    return not call.arg("is_causal") and call.arg("custom_mask_type") in (None, 0)


def count_decoding(
    model: nn.Module,
    input_ids: torch.Tensor,
    new_tokens: int,
    kwargs: Optional[Mapping[str, Any]] = None,
    *,
    trace_every_step: bool = False,
    options: Optional[Mapping[str, Any]] = None,
    who: str = "count_generation",
) -> Decoded:
    """Count the prefill and the ``new_tokens - 1`` decode steps of greedy
    ``model.generate(input_ids, max_new_tokens=new_tokens, **options)``; ``who`` names the
    caller in errors. See :func:`flopcount.count_generation` for the conventions."""
    started = time.perf_counter()
    require_module(model, who)
    int_at_least(new_tokens, 1, f"{who}: new_tokens")
    model = uncompiled(model)
    refuse_without_prompt_input(model, who)  # a model that takes no prompt first: what it is given is then moot
    input_ids, kwargs = split_prompt(model, input_ids, kwargs, who)
    resolved = generation_options(model, int(input_ids.shape[-1]), new_tokens, dict(options or {}))
    prompt = describe_inputs((input_ids,), kwargs)  # a failing forward's line names the caller's inputs

    def attempt(fast: bool) -> Decoded:
        # each attempt on a Setup of its own: a forward with real weights fills the cache the
        # Setup hands the prefill in place, and a retry must not start from what a failed one filled
        # the model's own generation rules run on it and may write on it (Qwen2-VL's rope_deltas): set back
        with module_attributes_kept(model.modules()):
            try:
                return _count(Counter(model, fast, who, prompt), Setup(model, input_ids, kwargs, resolved), new_tokens - 1,
                              trace_every_step)
            except _Mismatch as why:  # the shortcut failed its check: start again, tracing every step
                counted = _count(Counter(model, fast, who, prompt), Setup(model, input_ids, kwargs, resolved), new_tokens - 1, True)
                counted.notes.insert(0, f"{why}: every decode step was traced")
                return counted

    fast = on_fakes(model)
    try:
        counted = attempt(fast)
    except FakeRefused:
        if not fast:
            raise
        counted = attempt(False)  # a forward fakes cannot run: every forward by the dispatch tracer, as given
    counted.notes = list(resolved.notes) + list(counted.setup.notes) + counted.notes
    counted.wall_s = time.perf_counter() - started
    return counted


def decode_step(index: int, base: int) -> str:
    """How a failure line names decode step ``index`` (0-based, as docs/llm.md and the notes
    count them): with the position of the token it feeds, ``base`` (the positions the prefill
    cached) + ``index``, which a model's table of positions must hold."""
    return f"decode step {index} counted from 0, feeding the token at position {base + index}"


class _Mismatch(Exception):
    """A traced step is not the continuation predicted for the steps before it."""


def _count(counter: Counter, setup: Setup, total: int, every_step: bool) -> Decoded:
    """The prefill and ``total`` decode steps; raises :class:`_Mismatch` when a run's last
    step, traced, contradicts the continuation predicted for it, :class:`FakeRefused` when a
    forward of a fake run could not be."""
    model = counter.model
    counter.known_values = setup.known_values
    held: Dict[int, int] = {}
    with counter.outputs() as last:
        prefill, output, prefill_skips = _prefill(counter, setup, last)
        state = Decoding(output, setup, encoder=last.encoder)
        if total > 0 and state.cache is None:
            raise UsageError(f"count_generation: {type(model).__name__} returned no past_key_values (no KV cache to decode with)")
        held[-1] = cache_position_bytes(state.cache)
        limits = cache_limits(state.cache, getattr(model, "config", None))
        masks = decode_masks(model, setup, state.cache)
        skipped: List[Skipped] = []
        steps: List[FlopResult] = []
        predicted: List[Tuple[int, int]] = []
        shortcut = not every_step

        def step(index: int) -> Tuple[Trace, Costed]:
            run, costed, result = counter.count(state.call(index), decode_step(index, setup.base), step=index)
            state.advance(last.take())
            held[index] = cache_position_bytes(state.cache)
            steps.append(result)
            skipped.append(masks.skipped_flops(costed, setup.base + index))
            return run, costed

        for first, final, predictable in plan_runs(total, setup.base, limits, every_step):
            traced: List[Tuple[Trace, Costed]] = []
            index = first
            while index <= final:
                traced.append(step(index))
                index += 1
                if not (shortcut and predictable and len(traced) == 3 and final - index >= 1):
                    continue
                affine = Affine.check(traced, counter.registry)
                if affine is None:
                    shortcut = False  # any mismatch: every later step is traced
                    continue
                # a continued step was not traced: none of its calls reused (its base's figure is not its own)
                base_result = replace(steps[first], reused_calls=0) if steps[first].reused_calls else steps[first]
                masked = masks.indices(affine.first)
                for continued in range(index, final):
                    # described by its own inputs (a growing mask, CpmAnt's whole sequence), not its base's
                    result = affine.result_at(continued - first, base_result)
                    steps.append(replace(result, input_description=counter.describe(state.call(continued))))
                    skipped.append(masks.skipped_flops(affine.costed_at(continued - first, masked), setup.base + continued)
                                   if masked else Skipped())
                predicted.append((index, final - 1))
                try:
                    counter.catch_up(state.call(index, width=final - index))
                except FakeRefused:
                    raise
                except TraceError as exc:
                    raise _Mismatch(f"the model refused {final - index} positions in one forward ({first_line(exc)[:160]})") from exc
                state.advance(last.take())
                if not affine.matches(final - first, *step(final)):
                    raise _Mismatch(f"decode step {final} did not match the affine continuation predicted for it")
                break
    notes = list(state.notes)
    if predicted:
        ranges = ", ".join(f"{a}..{b}" if b > a else str(a) for a, b in predicted)
        crossed = limits.within(setup.base + 1, setup.base + total)
        split = f"; runs split where the context reaches the cache's limits ({', '.join(map(str, crossed))})" if crossed else ""
        notes.append(
            f"decode steps {ranges} were costed as the exact affine continuation, in the context length, of the two "
            f"steps before them, not traced: the third step and the last step of each run were traced and matched it "
            f"(the skipped positions were fed in one uncounted forward){split}; trace_every_step=True traces each"
        )
    return Decoded(prefill, steps, state.cache, notes, setup, held, counter.largest_write, prefill_skipped=prefill_skips,
                   step_skipped=skipped, masks=masks)


def _prefill(counter: Counter, setup: Setup, last: LastOutput) -> Tuple[FlopResult, Any, Skipped]:
    """The prefill's count, its output and the FLOPs its kernels may skip (:func:`skipped_flops`):
    one forward, or one per chunk (each chunk fed the cache the one before returned), booked as
    one prefill; each as generate() makes it (:meth:`Setup.prefill_call`: through the model's
    ``prepare_inputs_for_generation``)."""
    if len(setup.prefill_calls) == 1:
        _, costed, result = counter.count(setup.prefill_call(0), "prefill")
        taken = last.take()
        return result, taken, prefill_skipped(counter.model, setup, costed, taken)
    runs: List[Tuple[Trace, Costed]] = []
    output: Any = None
    skipped, causal, limits = Skipped(), frozenset[str](), Limits()
    masks, eager = dict[str, LayerMask](), dict[str, LayerMask]()
    for index in range(len(setup.prefill_calls)):
        cache = cache_of(output, setup) if index else None
        runs.append(counter.trace(setup.prefill_call(index, cache), f"prefill chunk {index + 1} of {len(setup.prefill_calls)}"))
        output = last.take()
        costed = runs[-1][1]
        if not index:
            causal = causal_modules(costed)
            limits = mask_limits(cache_of(output, setup), getattr(counter.model, "config", None))
            masks = _known_masks(counter.model, setup, output)
            eager = eager_masks(counter.model, masks)
        # a later chunk's mask is causal with its offset where no window or attention chunk of the
        # model ends within the positions up to the chunk's last, and on a layer the config and
        # cache say has neither (a Gemma's full layers)
        full = frozenset(module for module in causal if masks.get(module) == LayerMask())
        whole = causal if not limits.within(1, setup.chunk_start(index + 1)) else full
        start = setup.chunk_start(index)
        skipped += skipped_flops(costed, whole, start, masks, eager, setup.chunk_start(index + 1) - start)
    description = f"{prepare_call((), setup.first).description} in {len(runs)} chunks"
    return counter.combined(runs, description), output, skipped


def prefill_skipped(model: nn.Module, setup: Setup, costed: Costed, output: Any) -> Skipped:
    """:func:`skipped_flops` of a prefill run as one forward (``costed``, which returned
    ``output``): its masks as the config and the cache it returned know them."""
    masks = _known_masks(model, setup, output)
    return skipped_flops(costed, masks=masks, eager=eager_masks(model, masks), queries=setup.chunk_start(1))


def _known_masks(model: nn.Module, setup: Setup, output: Any) -> Dict[str, LayerMask]:
    """Each attention module's mask as the config and the cache the prefill returned know it
    (:func:`flopcount.decoding.runs.layer_masks`), for an unpadded prompt only: none otherwise."""
    return layer_masks(model, cache_of(output, setup)) if setup.unpadded else {}


def eager_masks(model: nn.Module, masks: Mapping[str, LayerMask]) -> Dict[str, LayerMask]:
    """The modules of ``masks`` whose eager attention calls' scores the prefill may price at
    their mask (:func:`flopcount.decoding.eager.score_ops`): those transformers marks causal
    (``is_causal``, the flag its SDPA path reads; False for an encoder's or a bidirectional
    model's attention), since an eager call hands no ``is_causal`` of its own."""
    if not masks:
        return {}
    modules = dict(model.named_modules())
    return {name: mask for name, mask in masks.items() if getattr(modules.get(name), "is_causal", None) is True}


def _encoder_name(model: nn.Module, names: Mapping[nn.Module, str]) -> str:
    """The qualified name of an encoder-decoder's encoder (``model.get_encoder()``), as the
    tracer's module stack names it; "" for any other model, or an encoder not among its modules."""
    if not is_encoder_decoder(model):
        return ""
    get_encoder = getattr(model, "get_encoder", None)
    if not callable(get_encoder):
        return ""
    try:
        encoder = get_encoder()
    except Exception:  # the model's own accessor: no encoder to keep, the prefill's last hidden state is handed on
        return ""
    return names.get(encoder, "") if isinstance(encoder, nn.Module) else ""


def on_fakes(model: nn.Module) -> bool:
    """Whether the decoding loop traces ``model`` on fake copies: every parameter and buffer
    (at least one) on the meta device or fake. Real weights are traced as given: the greedy
    tokens, a router's choices, a mask's values are real there, and fakes have none."""
    tensors = [*model.parameters(), *model.buffers()]
    return bool(tensors) and all(is_dataless(t) for t in tensors)


class Counter:
    """Traces one forward and turns it into a FlopResult, as
    :func:`flopcount.core.analysis.analyze` does (module aliases included); the model facts
    (names, aliases, parameter summary) are read once for all steps. ``fast``: each forward
    runs on fake copies of the model and its arguments (the KV cache included), with the
    shape cache and structural reuse (:func:`flopcount.tracers.trace_on_fakes`), else with the
    dispatch tracer on the model as given. Enter :meth:`outputs` around the loop to get each
    forward's output; a forward fakes cannot run raises :class:`FakeRefused`. A forward that
    fails is named by ``who`` (the function called) and the forward's part of generate() (the
    prefill, decode step s), with ``prompt``, the caller's inputs, not the call the loop made."""

    def __init__(self, model: nn.Module, fast: bool = False, who: str = "count_generation", prompt: str = ""):
        self.model = model
        self.who = who
        self.prompt = prompt
        #: the values of a forward's meta tensors that the decoding loop knows (Setup.known_values)
        self.known_values: Optional[Callable[[Tuple[torch.Tensor, ...]], Tuple[Optional[torch.Tensor], ...]]] = None
        self.registry = default_registry()
        self.facts = model_facts(model)
        self.largest_write = 0
        self.fast = fast
        self._last: Optional[LastOutput] = None
        self._collections: Optional[PausedCollections] = None
        # meta weights: what a fake run feeds back stands for meta tensors
        self._on_meta = fast and any(p.device.type == "meta" for p in self.facts.parameters)
        self._encoder = _encoder_name(model, self.facts.names)

    @contextlib.contextmanager
    def outputs(self) -> Iterator[LastOutput]:
        """The decoding loop's context: what keeps each forward's output (process-wide hooks on
        the dispatch path only); on fake copies, the collector's automatic collections paused
        (:class:`~flopcount.core.collection.PausedCollections`: young garbage collected
        between forwards and on exit, no full collection of the process)."""
        self._last = LastOutput(hooks=not self.fast)
        # each step's draws from Python's and numpy's generators follow the last step's, as in the
        # model's own loop, and so do the globals and class data its forwards write; set back when the loop ends
        modules = (module for _, module in self.facts.modules)
        with self._last, PausedCollections(active=self.fast) as collections, preserved_random_modules(), \
                left_as_found(modules):
            self._collections = collections
            try:
                yield self._last
            finally:
                self._collections = None

    def _run(self, prepared: PreparedCall, forward: str = "", step: Optional[int] = None) -> Trace:
        try:
            return self._traced(prepared, forward)
        except TraceError as exc:
            exc.decode_step = step
            raise

    def _traced(self, prepared: PreparedCall, forward: str) -> Trace:
        # an encoder-decoder's encoder output, as its encoder returns it in the prefill: what generate() hands each step
        encoder = (self._encoder, self._last.keep_encoder) if self._last is not None and self._encoder else None
        run_name = f"{self.who}, {forward}" if forward else None
        if run_name is not None and self.prompt:  # what a failure line says the inputs were
            prepared = replace(prepared, description=self.prompt)
        if not self.fast:
            return trace(self.model, prepared, tracer="dispatch", facts=self.facts, set_back=False,
                         module_output=encoder, run_name=run_name)
        keep = self._last.keep if self._last is not None else None
        known = self.known_values(prepared.tensors) if self.known_values is not None else ()
        if any(value is not None for value in known):  # a fake run's index checks read them
            prepared = replace(prepared, known=known)
        run = trace_on_fakes(self.model, prepared, facts=self.facts, on_output=keep, module_output=encoder,
                             run_name=run_name or "auto tracer")
        if self._collections is not None:
            self._collections.tidy()
        if run is None:
            raise FakeRefused(f"a forward of {type(self.model).__name__} could not run on fake copies")
        return run

    def _described(self, prepared: PreparedCall) -> str:
        """The call's description; on a fake run, a fake tensor the loop feeds back (a legacy
        cache's tensors) is described as the meta tensor it stands for, as on the dispatch path."""
        fake = fake_tensor_type()
        if not self._on_meta or not any(isinstance(t, fake) for t in prepared.tensors):
            return prepared.description
        twins = [torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta") if isinstance(t, fake) else t
                 for t in prepared.tensors]
        args, kwargs = prepared.rebuild(twins)
        return describe_inputs(args, kwargs)

    def _costed(self, run: Trace) -> Costed:
        costed = cost_events(run.events, self.registry)
        for _, cost in costed:
            if cost is not None and cost.bytes_written > self.largest_write:
                self.largest_write = cost.bytes_written
        return costed

    def trace(self, call: Mapping[str, Any], forward: str = "") -> Tuple[Trace, Costed]:
        """``call`` traced; ``forward`` names it in a failure line (``"prefill"``), with :attr:`who`."""
        run = self._run(prepare_call((), call), forward)
        return run, self._costed(run)

    def combined(self, runs: List[Tuple[Trace, Costed]], description: str) -> FlopResult:
        """Several traced forwards booked as one result (a chunked prefill)."""
        calls: Dict[str, int] = {}
        for run, _ in runs:
            for name, count in run.module_calls.items():
                calls[name] = calls.get(name, 0) + count
        return self._result([pair for _, costed in runs for pair in costed], calls, description,
                            tuple(dict.fromkeys(w for run, _ in runs for w in run.warnings)),
                            tuple(dict.fromkeys(g for run, _ in runs for g in run.gaps)),
                            reused_calls=sum(run.reused_calls for run, _ in runs))

    def _result(self, costed: Costed, calls: Mapping[str, int], description: str, warnings: Tuple[str, ...],
                gaps: Tuple[str, ...], reused_calls: int) -> FlopResult:
        """The forward's result, as :func:`flopcount.core.analysis.analyze` books it (its tables on
        first read), with the calls its trace(s) reused."""
        return aggregate(costed, tracer="dispatch", modules=self.facts.module_infos(calls), parameters=self.facts.summary,
                         input_description=description, warnings=warnings, gaps=gaps, aliases=self.facts.aliases,
                         deferred=True, reused_calls=reused_calls)

    def catch_up(self, call: Mapping[str, Any]) -> None:
        """Run a forward that is not counted (for its output: the cache it fills). With real
        weights and inputs it runs as the dispatch tracer runs it (:meth:`_run_uncounted`) with
        nothing recorded; else it is traced and its events dropped."""
        prepared = prepare_call((), call)
        if not self._run_uncounted(prepared):
            self._run(prepared)

    def _run_uncounted(self, prepared: PreparedCall) -> bool:
        """The forward run for its output only, as ``trace(..., tracer="dispatch")`` runs it on
        real tensors, with nothing recorded (:func:`flopcount.tracers._real_run.run_for_output`:
        the real run's one setup). False, nothing run, on fake copies, or where the traced run
        does more than that (a tensor without data, lazy modules, a model the twin cannot stand for)."""
        if self.fast:
            return False
        return run_for_output(self.model, prepared, self.facts)

    def describe(self, call: Mapping[str, Any]) -> str:
        """How a step's FlopResult describes the forward ``call`` (a continued step's own call
        described as a traced one would be)."""
        return self._described(prepare_call((), call))

    def count(self, call: Mapping[str, Any], forward: str = "", step: Optional[int] = None) -> Tuple[Trace, Costed, FlopResult]:
        """``call`` traced and booked as one forward's FlopResult; ``forward`` as for :meth:`trace`,
        ``step`` the decode step's index a failure carries (:attr:`TraceError.decode_step`)."""
        prepared = prepare_call((), call)
        run = self._run(prepared, forward, step)
        costed = self._costed(run)
        result = self._result(costed, run.module_calls, self._described(prepared), run.warnings, run.gaps,
                              reused_calls=run.reused_calls)
        return run, costed, result
