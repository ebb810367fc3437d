"""The cost of ``model.generate(input_ids, max_new_tokens=N)`` (greedy), measured step by step.

``generate`` runs one **prefill** forward over the P prompt positions (the LM head on the
last position only: ``logits_to_keep=1``), then N - 1 **decode** steps of one token each
through the model's own KV cache; decode step s (0-based) attends to P + s + 1 positions.
An encoder-decoder runs its encoder once, in the prefill, beside the decoder's first
(one-token) step; the decode steps reuse the encoder output. :func:`count_generation` runs
exactly these forwards, each counted by the dispatch tracer, and feeds each step the greedy
token (the argmax of the last logits; the argmax itself, like generate's logits
processors, is not counted). On meta/fake tensors the tokens have no value: the ids fed
back are data-less, which does not change a dense model's cost (every token costs the same);
a mixture-of-experts model is counted with each token routed to exactly k experts.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, replace
from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple

import torch
from torch import nn

from flopcount.core.analysis import cost_events, uncompiled
from flopcount.core.diagnostics import from_texts, unique
from flopcount.core.inputs import prepare_call
from flopcount.core.model_facts import model_facts
from flopcount.core.rendering import render
from flopcount.core.results import FlopResult, aggregate
from flopcount.decoding.forwards import Decoding, LastOutput, Setup, cache_of, generation_options
from flopcount.decoding.runs import Affine, Costed, cache_limits, plan_runs
from flopcount.errors import TraceError, UsageError
from flopcount.handlers import default_registry
from flopcount.tracers import trace
from flopcount.types import Diagnostic, Trace

__all__ = ["GenerationResult", "count_generation", "cache_bytes", "cache_position_bytes"]


@dataclass(frozen=True)
class GenerationResult:
    """FLOPs and MACs of a greedy ``generate`` run: the prefill, each decode step, totals.

    ``kv_cache_bytes`` is the memory the model's cache holds after the last step: each
    storage its tensors keep alive, once and whole, in the cache's real dtype (cross-attention
    caches, recurrent states and bookkeeping tensors included). ``kv_cache_position_bytes``
    is the positions it keeps times their bytes (the tensors' own elements: P + N - 1
    positions per full-attention layer, the window per sliding layer).
    ``warnings`` holds every diagnostic of the prefill and step counts, each once.
    Convention: 1 MAC = 2 FLOPs; attention counts the full query x key product.
    """

    prefill: FlopResult
    steps: Tuple[FlopResult, ...]
    batch: int
    prompt_tokens: int
    new_tokens: int
    kv_cache_bytes: int
    encoder_decoder: bool = False
    warnings: Tuple[str, ...] = ()
    kv_cache_position_bytes: int = 0
    wall_s: float = field(default=0.0, compare=False)
    #: the dtype(s) of the cache's floating tensors, e.g. "bfloat16" ("" when it holds none)
    kv_cache_dtype: str = ""

    @property
    def macs(self) -> int:
        return self.prefill.macs + sum(step.macs for step in self.steps)

    @property
    def flops(self) -> int:
        return self.prefill.flops + sum(step.flops for step in self.steps)

    @property
    def decode_macs(self) -> int:
        return sum(step.macs for step in self.steps)

    @property
    def decode_flops(self) -> int:
        return sum(step.flops for step in self.steps)

    @property
    def prefill_flops_per_token(self) -> float:
        """Prefill FLOPs per prompt token (batch x P tokens)."""
        return self.prefill.flops / max(1, self.batch * self.prompt_tokens)

    @property
    def decode_flops_per_token(self) -> float:
        """Mean decode FLOPs per generated token (batch x (N - 1) tokens; 0 when N = 1)."""
        return self.decode_flops / (self.batch * len(self.steps)) if self.steps else 0.0

    @property
    def complete(self) -> bool:
        return self.prefill.complete and all(step.complete for step in self.steps)

    def incomplete_reasons(self) -> Tuple[str, ...]:
        reasons: Dict[str, None] = {}
        for where, result in [("prefill", self.prefill)] + [(f"decode step {i}", s) for i, s in enumerate(self.steps)]:
            for reason in result.incomplete_reasons():
                reasons.setdefault(f"{where}: {reason}" if where == "prefill" else f"decode: {reason}", None)
        return tuple(reasons)

    def diagnostics(self) -> Tuple[Diagnostic, ...]:
        """Every diagnostic of the prefill and decode counts as a typed record, each once:
        what makes a count incomplete first, worded as :meth:`incomplete_reasons` ("prefill: ..."
        or "decode: ..."), then the other records of the counts and generation's own notes."""
        parts = [("prefill", self.prefill)] + [("decode", step) for step in self.steps]
        short = [replace(d, text=f"{where}: {d.text}") for where, result in parts for d in result.diagnostics() if d.makes_incomplete]
        other = [d for _, result in parts for d in result.diagnostics() if not d.makes_incomplete]
        return from_texts(unique(short) + unique(other), self.warnings)

    def table(self) -> str:
        """Prefill, decode and total rows (MACs, FLOPs, per token), with the convention."""
        return render(self, "table")

    def to_dict(self) -> Dict[str, Any]:
        return render(self, "dict")

    def to_json(self, indent: Optional[int] = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def __str__(self) -> str:
        return self.table()


def cache_bytes(cache: Any) -> int:
    """Bytes a KV cache object holds: every storage its tensors keep alive, each once and
    whole (a sliding-window layer's keys are a view of a larger tensor), found by walking
    its attributes, lists, tuples and dicts; real dtypes, meta/fake tensors included."""
    storages: Dict[int, Any] = {}  # id -> storage (kept alive while the walk lasts)
    loose = 0
    for tensor in _unique_tensors(cache):
        try:
            storage = tensor.untyped_storage()
        except (RuntimeError, NotImplementedError):  # sparse or opaque tensors: their own elements
            loose += tensor.numel() * tensor.element_size()
            continue
        storages.setdefault(id(storage), storage)
    return loose + sum(storage.nbytes() for storage in storages.values())


def cache_position_bytes(cache: Any) -> int:
    """Bytes of the positions a KV cache keeps: each of its tensors' own elements
    (``nbytes`` of the views), the figure positions x bytes per position gives."""
    return sum(tensor.numel() * tensor.element_size() for tensor in _unique_tensors(cache))


def _unique_tensors(cache: Any) -> Iterator[torch.Tensor]:
    seen: set = set()
    for tensor in _tensors_in(cache, set()):
        if id(tensor) not in seen:
            seen.add(id(tensor))
            yield tensor


def cache_dtype(cache: Any) -> str:
    """The dtype of a KV cache's floating tensors ("bfloat16"; several joined by "+"; "" if none)."""
    names = {str(t.dtype).replace("torch.", "") for t in _tensors_in(cache, set()) if t.is_floating_point()}
    return "+".join(sorted(names))


def _tensors_in(obj: Any, visited: set) -> Iterator[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield obj
        return
    if id(obj) in visited or obj is None or isinstance(obj, (int, float, str, bool, torch.dtype, torch.device)):
        return
    visited.add(id(obj))
    if isinstance(obj, Mapping):
        children: Any = obj.values()
    elif isinstance(obj, (list, tuple)):
        children = obj
    elif hasattr(obj, "__dict__"):
        children = vars(obj).values()
    else:
        return
    for child in children:
        yield from _tensors_in(child, visited)


def count_generation(
    model: nn.Module,
    input_ids: torch.Tensor,
    new_tokens: int = 1,
    kwargs: Optional[Mapping[str, Any]] = None,
    *,
    trace_every_step: bool = False,
    cache_implementation: Optional[str] = None,
    max_cache_len: Optional[int] = None,
    prefill_chunk_size: Optional[int] = None,
) -> GenerationResult:
    """Count what ``model.generate(input_ids, max_new_tokens=new_tokens)`` (greedy, no early
    stop) runs: one prefill forward and ``new_tokens - 1`` one-token decode steps through the
    model's KV cache. ``input_ids``: the (batch, P) prompt (for speech or vision encoders,
    the encoder's main input, e.g. ``input_features``). ``kwargs`` go to the prefill forward
    (an ``attention_mask`` of ones is made when none is given). Works on CPU, CUDA and meta.
    The model and ``input_ids`` are left as found.

    Decode steps differ only in the context length. By default the steps are cut into runs
    at the cache's limits (sliding windows, attention chunks, fixed-size states: see
    ``flopcount.decoding.runs``); in each run the first three steps and the last are traced and
    the steps between them are costed as the affine continuation of the first two, checked
    to reproduce the third and the last exactly (the skipped positions reach the model in
    one uncounted forward, so the last step runs on the real cache). When a check fails, or
    ``trace_every_step=True``, every step is traced.

    Generation options that change the work are honoured as ``generate()`` honours them,
    read from ``model.generation_config`` unless given here (as ``generate(**options)``
    would): ``cache_implementation`` ("dynamic", "offloaded"; "static" and its sliding/hybrid
    spellings: a StaticCache attended over in full at every step, the prefill included),
    ``max_cache_len`` (the static cache's length when longer than prompt + new tokens - 1),
    ``prefill_chunk_size`` (the prompt prefilled in chunks through the cache). Options whose
    work is not modelled ("quantized", "paged") are refused with a
    UsageError; what was honoured is said in ``warnings`` (docs/llm.md lists them)."""
    started = time.perf_counter()
    if not isinstance(model, nn.Module):
        raise UsageError(f"count_generation expects a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() < 2:
        raise UsageError("count_generation: input_ids must be a (batch, prompt length) tensor")
    if not isinstance(new_tokens, int) or isinstance(new_tokens, bool) or new_tokens < 1:
        raise UsageError(f"count_generation: new_tokens must be an int >= 1, got {new_tokens!r}")
    model = uncompiled(model)
    options = generation_options(
        model, int(input_ids.shape[0]), int(input_ids.shape[-1]), new_tokens,
        {"cache_implementation": cache_implementation, "max_cache_len": max_cache_len, "prefill_chunk_size": prefill_chunk_size},
    )
    setup = Setup(model, input_ids, kwargs, options)
    notes = list(options.notes) + list(setup.notes)
    try:
        counted = _count(model, setup, new_tokens - 1, trace_every_step)
    except _Mismatch as why:  # the shortcut failed its check: start again, tracing every step
        counted = _count(model, setup, new_tokens - 1, True)
        notes.append(f"{why}: every decode step was traced")
    notes += counted.notes
    return GenerationResult(
        prefill=counted.prefill,
        steps=tuple(counted.steps),
        batch=setup.batch,
        prompt_tokens=setup.prompt,
        new_tokens=new_tokens,
        kv_cache_bytes=cache_bytes(counted.cache),
        kv_cache_dtype=cache_dtype(counted.cache),
        encoder_decoder=setup.encoder_decoder,
        warnings=_diagnostics(notes, [counted.prefill, *counted.steps]),
        kv_cache_position_bytes=cache_position_bytes(counted.cache),
        wall_s=time.perf_counter() - started,
    )


def _diagnostics(notes: List[str], results: List[FlopResult]) -> Tuple[str, ...]:
    """count_generation's own notes, then every warning of the counts it is made of, each once."""
    found: Dict[str, None] = dict.fromkeys(notes)
    for result in results:
        found.update(dict.fromkeys(result.warnings))
    return tuple(found)


@dataclass
class _Counted:
    prefill: FlopResult
    steps: List[FlopResult]
    cache: Any
    notes: List[str]


class _Mismatch(Exception):
    """A traced step is not the continuation predicted for the steps before it."""


def _count(model: nn.Module, setup: Setup, total: int, every_step: bool) -> _Counted:
    """The prefill and ``total`` decode steps; raises :class:`_Mismatch` when a run's last
    step, traced, contradicts the continuation predicted for it."""
    counter = _Counter(model)
    with LastOutput(model) as last:
        prefill, output = _prefill(counter, setup, last)
        state = Decoding(model, output, setup)
        if total > 0 and state.cache is None:
            raise UsageError(f"count_generation: {type(model).__name__} returned no past_key_values (no KV cache to decode with)")
        limits = cache_limits(state.cache, getattr(model, "config", None))
        steps: List[FlopResult] = []
        predicted: List[Tuple[int, int]] = []
        shortcut = not every_step

        def step(index: int) -> Tuple[Trace, Costed]:
            run, costed, result = counter.count(state.call(index))
            state.advance(last.take())
            steps.append(result)
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
                base_result = steps[first]
                steps += [affine.result_at(s - first, base_result) for s in range(index, final)]
                predicted.append((index, final - 1))
                try:
                    counter.catch_up(state.call(index, width=final - index))
                except TraceError as exc:
                    first_line = (str(exc).splitlines() or [type(exc).__name__])[0][:160]
                    raise _Mismatch(f"the model refused {final - index} positions in one forward ({first_line})") from exc
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
    return _Counted(prefill, steps, state.cache, notes)


def _prefill(counter: _Counter, setup: Setup, last: LastOutput) -> Tuple[FlopResult, Any]:
    """The prefill's count and its output: one forward, or one per chunk (each chunk fed the
    cache the one before returned), booked as one prefill."""
    if len(setup.prefill_calls) == 1:
        return counter.count(setup.first)[2], last.take()
    runs: List[Tuple[Trace, Costed]] = []
    output: Any = None
    for index, call in enumerate(setup.prefill_calls):
        if index:
            cache = cache_of(output, setup)
            call = {**call, setup.cache_key: cache if cache is not None else setup.first.get(setup.cache_key)}
        runs.append(counter.trace(call))
        output = last.take()
    description = f"{prepare_call((), setup.first).description} in {len(runs)} chunks"
    return counter.combined(runs, description), output


class _Counter:
    """Traces one forward with the dispatch tracer and turns it into a FlopResult, as
    :func:`flopcount.core.analysis.analyze` does (module aliases included); the model facts
    (names, aliases, parameter summary) are read once for all steps."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.registry = default_registry()
        self.facts = model_facts(model)

    def trace(self, call: Mapping[str, Any]) -> Tuple[Trace, Costed]:
        run = trace(self.model, prepare_call((), call), tracer="dispatch", facts=self.facts)
        return run, cost_events(run.events, self.registry)

    def combined(self, runs: List[Tuple[Trace, Costed]], description: str) -> FlopResult:
        """Several traced forwards booked as one result (a chunked prefill)."""
        calls: Dict[str, int] = {}
        for run, _ in runs:
            for name, count in run.module_calls.items():
                calls[name] = calls.get(name, 0) + count
        return aggregate(
            [pair for _, costed in runs for pair in costed],
            tracer="dispatch",
            modules=self.facts.module_infos(calls),
            parameters=self.facts.summary,
            input_description=description,
            warnings=tuple(dict.fromkeys(w for run, _ in runs for w in run.warnings)),
            gaps=tuple(dict.fromkeys(g for run, _ in runs for g in run.gaps)),
            aliases=self.facts.aliases,
        )

    def catch_up(self, call: Mapping[str, Any]) -> None:
        """Run a forward that is not counted (dispatch, for its meta-kernel stand-ins)."""
        trace(self.model, prepare_call((), call), tracer="dispatch", facts=self.facts)

    def count(self, call: Mapping[str, Any]) -> Tuple[Trace, Costed, FlopResult]:
        prepared = prepare_call((), call)
        run = trace(self.model, prepared, tracer="dispatch", facts=self.facts)
        costed = cost_events(run.events, self.registry)
        return run, costed, aggregate(
            costed,
            tracer="dispatch",
            modules=self.facts.module_infos(run.module_calls),
            parameters=self.facts.summary,
            input_description=prepared.description,
            warnings=run.warnings,
            gaps=run.gaps,
            aliases=self.facts.aliases,
        )


