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

import inspect
import json
import time
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple

import torch
from torch import nn

from ._decode import Affine, Costed, cache_limits, plan_runs
from .analysis import _module_aliases, cost_events, module_infos, uncompiled
from .errors import UsageError
from .handlers import default_registry
from .inputs import describe_inputs, is_dataless
from .params import summarize_parameters
from .results import FlopResult, aggregate
from .tracers import trace
from .types import Trace

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

    def table(self) -> str:
        """Prefill, decode and total rows (MACs, FLOPs, per token), with the convention."""
        from .report.generation import generation_table

        return generation_table(self)

    def to_dict(self) -> Dict[str, Any]:
        from .report.generation import generation_to_dict

        return generation_to_dict(self)

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


class _LastOutput:
    """Keeps the output of the model's own forward (a process-wide hook, removed on exit)."""

    def __init__(self, model: nn.Module):
        self._model = model
        self.value: Any = None
        self._handle: Any = None

    def __enter__(self) -> _LastOutput:
        from torch.nn.modules import module as module_impl

        def keep(module: nn.Module, args: Any, output: Any) -> None:
            if module is self._model:
                self.value = output

        self._handle = module_impl.register_module_forward_hook(keep)
        return self

    def __exit__(self, *exc: Any) -> None:
        self._handle.remove()

    def take(self) -> Any:
        value, self.value = self.value, None
        if value is None:
            raise UsageError("count_generation: the model's forward returned nothing to continue from")
        return value


def _field(output: Any, name: str) -> Any:
    if isinstance(output, Mapping) or hasattr(output, "keys"):
        try:
            return output[name]
        except (KeyError, TypeError):
            return None
    return getattr(output, name, None)


def _next_tokens(logits: Any) -> torch.Tensor:
    if not isinstance(logits, torch.Tensor) or logits.dim() != 3:
        raise UsageError("count_generation: the model returned no (batch, positions, vocab) logits")
    with torch.no_grad():
        return logits[:, -1, :].argmax(dim=-1, keepdim=True)


def count_generation(
    model: nn.Module,
    input_ids: torch.Tensor,
    new_tokens: int = 1,
    kwargs: Optional[Mapping[str, Any]] = None,
    *,
    trace_every_step: bool = False,
) -> GenerationResult:
    """Count what ``model.generate(input_ids, max_new_tokens=new_tokens)`` (greedy, no early
    stop) runs: one prefill forward and ``new_tokens - 1`` one-token decode steps through the
    model's KV cache. ``input_ids``: the (batch, P) prompt (for speech or vision encoders,
    the encoder's main input, e.g. ``input_features``). ``kwargs`` go to the prefill forward
    (an ``attention_mask`` of ones is made when none is given). Works on CPU, CUDA and meta.
    The model and ``input_ids`` are left as found.

    Decode steps differ only in the context length. By default the steps are cut into runs
    at the cache's limits (sliding windows, attention chunks, fixed-size states: see
    ``flopcount._decode``); in each run the first three steps and the last are traced and
    the steps between them are costed as the affine continuation of the first two, checked
    to reproduce the third and the last exactly (the skipped positions reach the model in
    one uncounted forward, so the last step runs on the real cache). When a check fails, or
    ``trace_every_step=True``, every step is traced."""
    started = time.perf_counter()
    if not isinstance(model, nn.Module):
        raise UsageError(f"count_generation expects a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() < 2:
        raise UsageError("count_generation: input_ids must be a (batch, prompt length) tensor")
    if not isinstance(new_tokens, int) or isinstance(new_tokens, bool) or new_tokens < 1:
        raise UsageError(f"count_generation: new_tokens must be an int >= 1, got {new_tokens!r}")
    model = uncompiled(model)
    setup = _Setup(model, input_ids, kwargs)
    counted = _count(model, setup, new_tokens - 1, trace_every_step)
    notes = list(setup.notes)
    if counted is None:  # a traced step did not match its prediction: start again, tracing every step
        counted = _count(model, setup, new_tokens - 1, True)
        notes.append("a traced decode step did not match the affine continuation predicted for it: every step was traced")
    notes += counted.notes
    return GenerationResult(
        prefill=counted.prefill,
        steps=tuple(counted.steps),
        batch=setup.batch,
        prompt_tokens=setup.prompt,
        new_tokens=new_tokens,
        kv_cache_bytes=cache_bytes(counted.cache),
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


class _Setup:
    """The prefill call (prompt, mask, decoder start, ``logits_to_keep``) and what decoding needs."""

    def __init__(self, model: nn.Module, input_ids: torch.Tensor, kwargs: Optional[Mapping[str, Any]]):
        config = getattr(model, "config", None)
        self.encoder_decoder = bool(getattr(config, "is_encoder_decoder", False))
        self.parameters = _forward_parameters(model)
        # (batch, P), or (batch, features, P) for speech
        self.batch, self.prompt = int(input_ids.shape[0]), int(input_ids.shape[-1])
        self.device = input_ids.device
        self.notes: List[str] = []
        if is_dataless(input_ids):
            self.notes.append(
                "count_generation on meta/fake tensors: the generated token ids have no value (a dense model costs the "
                "same whatever the ids); no early stop at an end-of-sequence token"
            )
        main = getattr(model, "main_input_name", "input_ids") if self.encoder_decoder else "input_ids"
        first: Dict[str, Any] = {main: input_ids, "use_cache": True}
        if "attention_mask" in self.parameters and not (kwargs and "attention_mask" in kwargs) and input_ids.dtype in _INT:
            if is_dataless(input_ids):
                # generate's all-ones mask would only be checked with .all(), which meta cannot answer
                self.notes.append("no attention mask was passed on meta (all positions valid, as generate's all-ones mask)")
            else:
                first["attention_mask"] = torch.ones(self.batch, self.prompt, dtype=torch.int64, device=self.device)
        if self.encoder_decoder:
            first["decoder_input_ids"] = torch.full((self.batch, 1), _decoder_start(model), dtype=torch.int64, device=self.device)
        if "logits_to_keep" in self.parameters:
            first["logits_to_keep"] = 1
        first.update(kwargs or {})
        self.first = first
        # transformers >= 5.24 names the cache argument ``cache`` (``past_key_values`` deprecated)
        self.cache_key = "cache" if "cache" in self.parameters else "past_key_values"
        # positions the cache holds after the prefill: the prompt, or the decoder's first token
        self.base = 1 if self.encoder_decoder else self.prompt


@dataclass
class _Counted:
    prefill: FlopResult
    steps: List[FlopResult]
    cache: Any
    notes: List[str]


def _count(model: nn.Module, setup: _Setup, total: int, every_step: bool) -> Optional[_Counted]:
    """The prefill and ``total`` decode steps; ``None`` when a traced step contradicts the
    continuation predicted for it (the caller then traces every step)."""
    counter = _Counter(model)
    with _LastOutput(model) as last:
        prefill = counter.count(setup.first)[2]
        state = _Decoding(model, last.take(), setup)
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
                counter.catch_up(state.call(index, width=final - index))
                state.advance(last.take())
                if not affine.matches(final - first, *step(final)):
                    return None
                break
    notes = []
    if predicted:
        ranges = ", ".join(f"{a}..{b}" for a, b in predicted)
        crossed = limits.within(setup.base + 1, setup.base + total)
        split = f"; runs split where the context reaches the cache's limits ({', '.join(map(str, crossed))})" if crossed else ""
        notes.append(
            f"decode steps {ranges} were costed as the exact affine continuation, in the context length, of the two "
            f"steps before them, not traced: the third step and the last step of each run were traced and matched it "
            f"(the skipped positions were fed in one uncounted forward){split}; trace_every_step=True traces each"
        )
    return _Counted(prefill, steps, state.cache, notes)


class _Counter:
    """Traces one forward with the dispatch tracer and turns it into a FlopResult, as
    :func:`flopcount.analysis.analyze` does (module aliases included); the parameter summary
    and aliases are computed once for all steps."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.registry = default_registry()
        self.parameters = summarize_parameters(model)
        self.aliases = _module_aliases(model)

    def trace(self, call: Mapping[str, Any]) -> Tuple[Trace, Costed]:
        run = trace(self.model, (), call, tracer="dispatch")
        return run, cost_events(run.events, self.registry)

    def catch_up(self, call: Mapping[str, Any]) -> None:
        """Run a forward that is not counted (dispatch, for its meta-kernel stand-ins)."""
        trace(self.model, (), call, tracer="dispatch")

    def count(self, call: Mapping[str, Any]) -> Tuple[Trace, Costed, FlopResult]:
        run, costed = self.trace(call)
        return run, costed, aggregate(
            costed,
            tracer="dispatch",
            modules=module_infos(self.model, run.module_calls),
            parameters=self.parameters,
            input_description=describe_inputs((), call),
            warnings=run.warnings,
            gaps=run.gaps,
            aliases=self.aliases,
        )


class _Decoding:
    """What the next decode step is fed: the greedy token, the cache, the growing mask."""

    def __init__(self, model: nn.Module, output: Any, setup: _Setup):
        self.setup = setup
        self.prepare = _step_preparer(model, setup)
        self.encoder_out = _field(output, "encoder_last_hidden_state") if setup.encoder_decoder else None
        self.mask = setup.first.get("attention_mask")
        self.advance(output)

    def advance(self, output: Any) -> None:
        self.cache = _field(output, self.setup.cache_key)
        if self.cache is None:
            self.cache = _field(output, "past_key_values")
        self.tokens = _next_tokens(_field(output, "logits"))

    def call(self, step: int, width: int = 1) -> Dict[str, Any]:
        """The forward of decode step ``step``, or of ``width`` positions from it at once: as
        the model's ``prepare_inputs_for_generation`` makes it when it has one (Mamba drops
        the attention mask after the prefill), else the tokens, the cache and the mask."""
        call = self._call(step, width)
        if self.prepare is None:
            return call
        setup = self.setup
        ids = call.pop("decoder_input_ids" if setup.encoder_decoder else "input_ids")
        history = ids[:, :1].expand(-1, (1 if setup.encoder_decoder else setup.prompt) + step + width)
        return dict(self.prepare(history, next_sequence_length=width, is_first_iteration=False, **call))

    def _call(self, step: int, width: int) -> Dict[str, Any]:
        setup = self.setup
        tokens = self.tokens if width == 1 else self.tokens.expand(-1, width)
        call: Dict[str, Any] = {setup.cache_key: self.cache, "use_cache": True}
        if setup.encoder_decoder:
            from transformers.modeling_outputs import BaseModelOutput

            call["decoder_input_ids"] = tokens
            call["encoder_outputs"] = BaseModelOutput(last_hidden_state=self.encoder_out)
            if self.mask is not None:
                call["attention_mask"] = self.mask
        else:
            call["input_ids"] = tokens
            if self.mask is not None:
                call["attention_mask"] = torch.ones(setup.batch, setup.prompt + step + width, dtype=torch.int64, device=setup.device)
        if "logits_to_keep" in setup.parameters:
            call["logits_to_keep"] = 1
        return call


def _step_preparer(model: nn.Module, setup: _Setup) -> Any:
    """The model's ``prepare_inputs_for_generation`` when it takes the arguments generate()
    gives it in transformers 5 (``cache``, ``next_sequence_length``), else None."""
    prepare = getattr(model, "prepare_inputs_for_generation", None)
    if not callable(prepare) or setup.cache_key != "cache":
        return None
    try:
        names = inspect.signature(prepare).parameters
    except (TypeError, ValueError):
        return None
    takes_length = "next_sequence_length" in names or any(p.kind is p.VAR_KEYWORD for p in names.values())
    return prepare if takes_length and "cache" in names else None


_INT = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


def _forward_parameters(model: nn.Module) -> Tuple[str, ...]:
    try:
        return tuple(inspect.signature(model.forward).parameters)
    except (TypeError, ValueError):
        return ()


def _decoder_start(model: nn.Module) -> int:
    for source in (getattr(model, "generation_config", None), getattr(model, "config", None)):
        for key in ("decoder_start_token_id", "bos_token_id", "pad_token_id"):
            value = getattr(source, key, None)
            if isinstance(value, int):
                return value
    return 0
