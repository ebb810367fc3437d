"""serve's count: ``generate()``'s forwards traced once at the prompt's batch B, the rest
derived exactly (issue #31's speed target).

Serve needs, at two batch sizes (B and B + 1: every figure is affine in the batch), the
FLOPs and MACs of the prefill and of every decode step, the cache's bytes after each step
and the largest tensor one op writes; it needs no per-module table of any step. So instead
of two full counts (:func:`flopcount.decoding.counted.count_decoding` at B and at B + 1,
each re-booking every continued step's tables), :func:`derive` runs:

* at B, what ``count_decoding`` traces: the prefill, decode steps 0, 1 and 2, one uncounted
  forward over the positions between, and the last step; the steps between are the affine
  continuation in the context length of steps 0 and 1 (:class:`flopcount.decoding.runs.Affine`),
  which must reproduce steps 2 and the last exactly;
* at B + 1 only the prefill and decode steps 0 and 1: every event's change from step 0 to
  step 1 must equal its change at B (op by op, the same ops, modules and phases), so the
  steps of B + 1 continue in the context length exactly as B's, which B's steps 2 and last
  proved. Where a change depends on the batch (an integer b x c, such as a real mask's sum,
  grows by b per step) step 2 is traced too: B + 1's own continuation must reproduce it, each
  event varying in the same dimensions as at B. The cache's bytes at B + 1 differ from B's by
  an amount affine in the step, checked after the prefill and steps 0 and 1;
* each continued step's FLOPs and MACs as step 0's plus the change of the events that vary,
  each distinct varying call (the same call in each of 80 layers) priced once per step by
  the handlers, not per layer.

What this checks less than the full count: B + 1's last step is not traced, so code that
branches on batch x context between B + 1's step 1 and its last (a threshold B never crosses)
would go unseen, where the full count would see it if it held at the last step.

Any check that fails, a cache with limits inside the decode (sliding windows filling,
attention chunks, static caches), chunked prefill or fewer than five decode steps: ``derive``
returns None and serve counts both batch sizes in full (every figure is then today's)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import torch
from torch import nn

from flopcount.core.analysis import uncompiled
from flopcount.core.inputs import is_dataless
from flopcount.core.ledger import TOTAL_FIELDS, cost_change, expand_booked
from flopcount.core.results import FlopResult
from flopcount.core.state import module_attributes_kept
from flopcount.decoding.caches import cache_bytes, cache_position_bytes

# generate()'s forwards are traced, costed and booked by the one counter count_generation uses
from flopcount.decoding.counted import (
    Counter,
    DecodeMasks,
    Skipped,
    count_decoding,
    decode_masks,
    on_fakes,
    prefill_skipped,
)
from flopcount.decoding.forwards import Decoding, FakeRefused, LastOutput, Setup, generation_options
from flopcount.decoding.runs import Affine, Costed, NotAffine, cache_limits, paired, plan_runs, same_event
from flopcount.devices.roofline import ATTENTION, op_family
from flopcount.errors import TraceError, UsageError
from flopcount.types import Cost, OpCall, Trace

__all__ = ["Counted", "Derived", "attention_flops", "derive", "held_per_step", "real_prefills"]

#: decode steps below which both batch sizes are counted in full (steps 0, 1, 2 and the last
#: are traced anyway, with at least one step between them to continue)
MIN_STEPS = 5
#: where a booked total (:func:`cost_change`'s sums) holds its FLOPs
_FLOPS_AT = TOTAL_FIELDS.index("flops")
#: no cost: ``cost_change(op, _NOTHING, cost)`` is what ``cost`` books, under each name
_NOTHING = Cost()


@dataclass
class Counted:
    """One batch size's figures. ``prefill_attention`` and ``step_attention``: the part of
    the prefill's and each step's FLOPs that attention ops perform (:func:`attention_flops`);
    ``prefill_skipped``: the prefill's FLOPs its kernels may skip (:func:`prefill_skipped`);
    ``held``: step -> the bytes of the positions the cache keeps after it (-1: after the
    prefill), at the steps measured (or derived) only; ``stored``: the storages the cache holds
    at the end (:func:`cache_bytes`); ``results``: every traced forward's result (their
    warnings and what makes them incomplete)."""

    batch: int
    prefill_flops: int
    prefill_macs: int
    prefill_attention: int
    step_flops: List[int]
    step_macs: List[int]
    step_attention: List[int]
    held: Dict[int, float]
    stored: float
    largest_write: int
    results: List[FlopResult] = field(default_factory=list)
    #: the cache's storage bytes after the prefill (-1) and the steps traced
    stored_early: Dict[int, float] = field(default_factory=dict)
    prefill_skipped: Skipped = field(default_factory=Skipped)
    #: each decode step's FLOPs its kernels may skip (:meth:`DecodeMasks.skipped_flops`; none: 0)
    step_skipped: List[Skipped] = field(default_factory=list)
    #: the layers whose held positions a decode step's kernels need not all touch
    masks: DecodeMasks = DecodeMasks()
    #: the bytes of a padded prompt's pad positions in the cache once so many positions were fed (no
    #: engine that packs the sequences holds them): DecodeMasks.pad_bytes, at the batch's mean row
    pad_bytes: Callable[[int, bool], float] = lambda written, stored: 0.0


@dataclass
class Derived:
    """Both batch sizes' figures, the cache B's generation ends with, the setup and the notes."""

    one: Counted
    two: Counted
    cache: Any
    setup: Setup
    notes: List[str]


class _Refused(Exception):
    """A check of the derivation failed: count both batch sizes in full instead."""


def derive(
    model: nn.Module, input_ids: torch.Tensor, wider_ids: torch.Tensor, new_tokens: int,
    kwargs: Optional[Mapping[str, Any]], wider_kwargs: Optional[Mapping[str, Any]],
) -> Optional[Derived]:
    """Serve's figures at the prompt's batch B (``input_ids``) and at B + 1 (``wider_ids``)
    from nine forwards (ten where a step's change depends on the batch) instead of twelve and
    no per-step table (see the module's text); None where a check fails and both batch sizes
    must be counted in full. Bad input is left to the full count, which says what is wrong."""
    total = new_tokens - 1 if isinstance(new_tokens, int) and not isinstance(new_tokens, bool) else 0
    if not isinstance(model, nn.Module) or total < MIN_STEPS:  # serve_facts checked the prompt
        return None
    model = uncompiled(model)
    counter = Counter(model, on_fakes(model))  # on fake copies for meta weights, as count_generation
    try:
        with counter.outputs() as last, module_attributes_kept(model.modules()):  # as count_generation: its rules write on the model
            setup, options_notes = _setup(model, input_ids, new_tokens, kwargs)
            if not _one_run(total, setup.base, None, model):  # the config's limits: refuse before any forward
                return None
            one, cache, affine, second, state_notes = _count_b(counter, setup, last, total)
            wider, _ = _setup(model, wider_ids, new_tokens, wider_kwargs)
            two = _count_wider(counter, wider, last, total, one, affine, second)
    except (_Refused, UsageError, TraceError):
        return None
    notes = options_notes + setup.notes + state_notes + [
        f"decode steps 3..{total - 2} were costed as the exact affine continuation, in the context length, of the two "
        f"steps before them, not traced: the third step and the last step were traced and matched it (the skipped "
        f"positions were fed in one uncounted forward); batch {setup.batch + 1} was counted through its prefill and "
        f"first two decode steps (three where a change depends on the batch), which change from step to step as "
        f"batch {setup.batch}'s do, op by op"
    ]
    return Derived(one, two, cache, setup, notes)


def _setup(model: nn.Module, ids: torch.Tensor, new_tokens: int, kwargs: Optional[Mapping[str, Any]]) -> Tuple[Setup, List[str]]:
    options = generation_options(model, int(ids.shape[-1]), new_tokens, {})
    if options.static_len is not None or options.prefill_chunk is not None:
        raise _Refused  # a static cache is attended over in full; chunks: several prefill forwards
    setup = Setup(model, ids, kwargs, options)
    if len(setup.prefill_calls) != 1:
        raise _Refused
    return setup, list(options.notes)


def _one_run(total: int, base: int, cache: Any, model: nn.Module) -> bool:
    """Whether the decode is one predictable run: no limit of the cache (or, with ``cache``
    None, of the config) inside it (:func:`flopcount.decoding.runs.plan_runs`)."""
    limits = cache_limits(cache, getattr(model, "config", None))
    return plan_runs(total, base, limits, False) == [(0, total - 1, True)]


def _count_b(
    counter: Counter, setup: Setup, last: LastOutput, total: int,
) -> Tuple[Counted, Any, Affine, Costed, List[str]]:
    """Batch B as ``count_decoding`` counts it, the continued steps priced by :func:`_continued`;
    also the continuation and step 1's events."""
    steps = _Steps(counter, setup, last)
    if not _one_run(total, setup.base, steps.state.cache, counter.model):
        raise _Refused  # the cache changes how it grows inside the decode: traced run by run
    traced = [steps.step(index) for index in range(3)]
    affine = Affine.check([(run, costed) for run, costed, _ in traced], counter.registry)
    if affine is None:
        raise _Refused
    counter.catch_up(steps.state.call(3, width=total - 4))
    steps.state.advance(last.take())
    final = steps.step(total - 1)
    if not affine.matches(total - 1, final[0], final[1]):
        raise _Refused
    continued = _continued(affine, traced[0], total, steps.masks, setup.base)
    for index, (_, costed, result) in zip((0, 1, 2, total - 1), steps.traced):
        continued.take(index, costed, result, steps.masks.skipped_flops(costed, setup.base + index))
    counted = Counted(
        batch=setup.batch, prefill_flops=steps.prefill.flops, prefill_macs=steps.prefill.macs,
        prefill_attention=steps.prefill_attention, prefill_skipped=steps.prefill_skipped, step_flops=continued.flops, step_macs=continued.macs,
        step_attention=continued.attention, held=steps.held, stored=steps.stored[total - 1],
        largest_write=counter.largest_write, results=steps.results(), stored_early=steps.stored,
        step_skipped=continued.skipped, masks=steps.masks,
    )
    return counted, steps.state.cache, affine, traced[1][1], list(steps.state.notes)


class _Steps:
    """One batch size's forwards as counted: the prefill, then each decode step asked for, with
    the cache's position bytes (``held``) and storage bytes (``stored``) after each (-1: after
    the prefill)."""

    def __init__(self, counter: Counter, setup: Setup, last: LastOutput):
        self.counter, self.last = counter, last
        counter.known_values = setup.known_values  # meta position ids' values: read past its table, the count refuses
        _, costed, self.prefill = counter.count(setup.prefill_call(0))
        self.prefill_attention = booked_attention(costed)
        output = last.take()
        self.prefill_skipped = prefill_skipped(counter.model, setup, costed, output)
        self.state = Decoding(output, setup, encoder=last.encoder)
        if self.state.cache is None:
            raise _Refused
        self.masks = decode_masks(counter.model, setup, self.state.cache)
        self.held: Dict[int, float] = {}
        self.stored: Dict[int, float] = {}
        self.traced: List[Tuple[Trace, Costed, FlopResult]] = []
        self._measure(-1)

    def _measure(self, index: int) -> None:
        self.held[index] = float(cache_position_bytes(self.state.cache))
        self.stored[index] = float(cache_bytes(self.state.cache))

    def step(self, index: int) -> Tuple[Trace, Costed, FlopResult]:
        self.traced.append(self.counter.count(self.state.call(index)))
        self.state.advance(self.last.take())
        self._measure(index)
        return self.traced[-1]

    def results(self) -> List[FlopResult]:
        return [self.prefill, *(result for _, _, result in self.traced)]


def _count_wider(
    counter: Counter, setup: Setup, last: LastOutput, total: int, one: Counted, affine: Affine, second: Costed,
) -> Counted:
    """Batch B + 1 from its prefill and decode steps 0 and 1, where each event changes from
    step 0 to step 1 exactly as at B (``affine``, checked through B's last step, continues
    both); else also step 2, which B + 1's own continuation must reproduce, each event
    varying in the same dimensions as at B (an integer b x c, a mask's sum, changes by b per
    step). The cache's bytes must differ from B's by an amount affine in the step (after the
    prefill, steps 0 and 1; and 2 where traced)."""
    counter.largest_write = 0  # B + 1's own (the counter counted B's forwards first)
    steps = _Steps(counter, setup, last)
    first = steps.step(0)
    (run0, costed0, _), (run1, costed1, _) = first, steps.step(1)
    if run0.gaps or run1.gaps:
        raise _Refused
    if not _same_steps(affine.first, second, costed0, costed1, exact=True):
        steps.step(2)
        if not _same_steps(affine.first, second, costed0, costed1, exact=False) \
                or Affine.check([(run, costed) for run, costed, _ in steps.traced], counter.registry) is None:
            raise _Refused
    wider = Affine(costed0, costed1, counter.registry)
    continued = _continued(wider, first, total, steps.masks, setup.base)
    for index, (_, costed, result) in enumerate(steps.traced):
        continued.take(index, costed, result, steps.masks.skipped_flops(costed, setup.base + index))
    # the largest write of the steps a full count traces (2 and the last), predicted
    largest = max(counter.largest_write, continued.written.get(2, 0), continued.written.get(total - 1, 0))
    # the cache's bytes: B's (measured at -1, 0, 1, 2 and the last step) plus a difference affine
    # in the step (proved at -1, 0, 1)
    held = steps.held
    derived_held = {s: held[s] for s in (-1, 0, 1)}
    for index in (2, total - 1):
        derived_held[index] = one.held[index] + _extended(held, one.held, index)
    if 2 in held and held[2] != derived_held[2]:
        raise _Refused
    final_stored = one.stored + _extended(steps.stored, one.stored_early, total - 1)
    return Counted(
        batch=setup.batch, prefill_flops=steps.prefill.flops, prefill_macs=steps.prefill.macs,
        prefill_attention=steps.prefill_attention, prefill_skipped=steps.prefill_skipped, step_flops=continued.flops, step_macs=continued.macs,
        step_attention=continued.attention, held=derived_held, stored=final_stored, largest_write=largest,
        results=steps.results(), step_skipped=continued.skipped, masks=steps.masks,
    )


def _extended(wider: Mapping[int, float], base: Mapping[int, float], index: int) -> float:
    """``wider - base`` at ``index``, continued from its values at -1, 0 and 1 (which must lie
    on a line)."""
    d = [wider[s] - base[s] for s in (-1, 0, 1)]
    if d[1] - d[0] != d[2] - d[1]:
        raise _Refused
    return d[2] + (index - 1) * (d[2] - d[1])


def held_per_step(known: Mapping[int, float], total: int) -> Dict[int, float]:
    """The cache's position bytes after each step: measured, and linear between two measured
    steps (the steps between are an affine run)."""
    points = sorted(known)
    out = {p: float(known[p]) for p in points}
    for left, right in zip(points, points[1:]):
        for s in range(left + 1, right):
            out[s] = known[left] + (known[right] - known[left]) * (s - left) / (right - left)
    for s in range(-1, total):
        out.setdefault(s, float(known[points[-1]]))
    return out


def real_prefills(model: nn.Module, input_ids: torch.Tensor, rows: Sequence[Tuple[int, int]]) -> Skipped:
    """What a padded prompt's sequences need in the prefill, each prefilled alone over its real
    tokens (``rows``: per row, the (start, length) the mask proves, ``Setup.rows``), as an engine
    that packs them (varlen attention) runs them: summed over the rows, the FLOPs the bound prices
    for that one-row prompt (counted less :func:`prefill_skipped`'s), in ``flops``, and those of
    its attention ops in ``attention``. One prefill forward traced per distinct row (by length, on
    ids without values), all by one :class:`Counter` (the model's facts read once), each row's
    attention FLOPs read from its events (:func:`booked_attention`, no table booked): what
    ``count_decoding(model, row, 1)``'s prefill gives, without its per-row setup."""
    model = uncompiled(model)
    fast = on_fakes(model)
    try:
        return _real_prefills(model, input_ids, rows, fast)
    except FakeRefused:  # a forward fakes cannot run: every row by the dispatch tracer, as count_decoding retries
        if not fast:
            raise
        return _real_prefills(model, input_ids, rows, False)


def _real_prefills(model: nn.Module, input_ids: torch.Tensor, rows: Sequence[Tuple[int, int]], fast: bool) -> Skipped:
    counter = Counter(model, fast, who="serve")
    seen: Dict[Any, Skipped] = {}
    total = Skipped()
    with counter.outputs() as last, module_attributes_kept(model.modules()):  # as count_decoding: its rules write on the model
        for index, (start, length) in enumerate(rows):
            ids = input_ids[index:index + 1, start:start + length]
            key = length if is_dataless(ids) else (length, tuple(ids.flatten().tolist()))
            if key not in seen:
                seen[key] = _prefill_alone(counter, model, ids, last)
            total += seen[key]
    return total


def _prefill_alone(counter: Counter, model: nn.Module, ids: torch.Tensor, last: LastOutput) -> Skipped:
    """The priced prefill of the one-row prompt ``ids`` (no mask given), as ``count_decoding(model,
    ids, 1)`` prices it: its FLOPs less :func:`prefill_skipped`'s, and its attention ops' less theirs.
    A prompt generate() would prefill in chunks is counted so, by ``count_decoding``."""
    setup = Setup(model, ids, None, generation_options(model, int(ids.shape[-1]), 1, {}))
    if len(setup.prefill_calls) != 1:
        decoded = count_decoding(model, ids, 1, who="serve")
        skipped = decoded.prefill_skipped
        return Skipped(decoded.prefill.flops - skipped.flops, attention_flops(decoded.prefill) - skipped.attention)
    counter.known_values = setup.known_values
    _, costed, result = counter.count(setup.prefill_call(0), "prefill")
    skipped = prefill_skipped(counter.model, setup, costed, last.take())
    return Skipped(result.flops - skipped.flops, booked_attention(costed) - skipped.attention)


def attention_flops(result: FlopResult) -> int:
    """The FLOPs ``result`` books under attention ops (:func:`op_family` "attention"): the
    part of a forward a float32 bound may price at attention's column, not the matmuls'."""
    return sum(flops for op, flops in result.by_operator("flops").items() if op_family(op) == ATTENTION)


def booked_attention(costed: Costed) -> int:
    """:func:`attention_flops` of the result ``costed`` books, from the events (the names the
    ledger books each cost's parts under: :func:`cost_change` from nothing), without booking
    the result's tables."""
    total = 0
    for event, cost in expand_booked(costed):
        if cost is None or (not cost.parts and op_family(event.call.op) != ATTENTION):
            continue  # no handler, or one operation booked under its own name (Cost.parts), not attention
        for name, booked in cost_change(event.call.op, _NOTHING, cost).items():
            if op_family(name) == ATTENTION:
                total += booked[_FLOPS_AT]
    return total


@dataclass
class _Continued:
    """Each decode step's FLOPs, MACs and attention FLOPs (:func:`attention_flops`), and the
    most bytes one varying op writes per step."""

    flops: List[int]
    macs: List[int]
    attention: List[int]
    written: Dict[int, int]
    skipped: List[Skipped]

    def take(self, index: int, costed: Costed, result: FlopResult, skipped: Skipped) -> None:
        """Step ``index`` as traced (its events ``costed``, booked as ``result``, ``skipped`` FLOPs
        its kernels may skip), in place of its continuation."""
        self.flops[index], self.macs[index] = result.flops, result.macs
        self.attention[index] = booked_attention(costed)
        self.skipped[index] = skipped


def _continued(affine: Affine, first: Tuple[Trace, Costed, FlopResult], total: int, masks: DecodeMasks,
               base: int) -> _Continued:
    """Every step's FLOPs, MACs and attention FLOPs as ``affine`` continues step 0 (``first``,
    as traced): step 0's plus, for each event that varies, its cost at the step minus its cost
    at step 0 (each distinct varying call priced once per step: :meth:`Affine.changes`); the
    attention FLOPs change by the change booked under attention ops (:func:`cost_change`, the
    names a fused op's parts are booked under, as :func:`attention_flops` reads them). Also the
    most bytes one varying op writes, per step, and the FLOPs its kernels may skip
    (:meth:`DecodeMasks.skipped_flops` of the events of ``masks``' modules as continued; step s
    feeds the token at position ``base`` + s)."""
    _, costed, result = first
    out = _Continued(flops=[result.flops] * total, macs=[result.macs] * total,
                     attention=[booked_attention(costed)] * total, written={}, skipped=[Skipped()] * total)
    masked = masks.indices(affine.first)
    for s in range(1, total):
        if masked:
            out.skipped[s] = masks.skipped_flops(affine.costed_at(s, masked), base + s)
        out.written[s] = 0
        for events, old, new in affine.changes(s):
            out.flops[s] += len(events) * (new.flops - old.flops)
            out.macs[s] += len(events) * (new.macs - old.macs)
            out.written[s] = max(out.written[s], new.bytes_written)
            for name, change in cost_change(events[0].call.op, old, new).items():
                if op_family(name) == ATTENTION:
                    out.attention[s] += len(events) * change[_FLOPS_AT]
    return out


def _same_steps(first: Costed, second: Costed, wider0: Costed, wider1: Costed, *, exact: bool) -> bool:
    """Whether batch B + 1's steps 0 and 1 run the ops of batch B's (op, modules, phase), each
    changing from step 0 to step 1 exactly as it does at B (``exact``), or in the same
    dimensions and arguments (not ``exact``)."""
    if not (len(first) == len(second) == len(wider0) == len(wider1)):
        return False
    for (a, _), (b, _), (c, _), (d, _) in zip(first, second, wider0, wider1):
        if not all(same_event(a, x, call=False) for x in (b, c, d)):
            return False
        try:
            if _change(a.call, b.call, exact) != _change(c.call, d.call, exact):
                return False
        except NotAffine:
            return False
    return True


def _change(a: OpCall, b: OpCall, exact: bool) -> Any:
    return _delta(dict(a.args), dict(b.args), exact), _delta(tuple(a.outputs), tuple(b.outputs), exact)


def _delta(a: Any, b: Any, exact: bool) -> Any:
    """How ``b`` differs from ``a`` in the terms :class:`Affine` continues: "=" where equal,
    the difference of each dimension or integer (not ``exact``: only which of them change);
    raises NotAffine where it cannot continue."""
    return paired(a, b, lambda x, y: ("tensor", tuple(q - p if exact else q != p for p, q in zip(x.shape, y.shape))),
                  lambda x, y: ("int", y - x if exact else None), lambda _: "=")
