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

from .analysis import cost_events, module_infos
from .errors import UsageError
from .handlers import default_registry
from .inputs import describe_inputs, is_dataless
from .params import summarize_parameters
from .registry import HandlerRegistry
from .results import FlopResult, ModuleInfo, aggregate, reprice
from .tracers import trace
from .types import Cost, OpCall, OpEvent, TensorMeta, Trace

__all__ = ["GenerationResult", "count_generation", "cache_bytes"]


@dataclass(frozen=True)
class GenerationResult:
    """FLOPs and MACs of a greedy ``generate`` run: the prefill, each decode step, totals.

    ``kv_cache_bytes`` is the size of the model's KV cache after the last step (P + N - 1
    positions for a decoder, in the cache's real dtype; cross-attention caches included).
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
    """Bytes of every tensor a KV cache object holds (each storage once), walking its
    attributes, lists, tuples and dicts; real dtypes, data-less tensors included."""
    seen: set = set()
    total = 0
    for tensor in _tensors_in(cache, set()):
        key = (tensor.untyped_storage().data_ptr(), tensor.device) if not is_dataless(tensor) else id(tensor)
        if key in seen or tensor.numel() == 0:
            continue
        seen.add(key)
        total += tensor.numel() * tensor.element_size()
    return total


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

    Decode steps differ only in the context length, so by default steps 0, 1 and 2 are
    traced, every shape and integer argument of step 2 is checked to be exactly the affine
    continuation of steps 0 and 1, and later steps are costed from that continuation (the
    KV cache, which grows by the same bytes each step, too). When the check fails (a sliding window
    filling up, data-dependent routing on real tensors), or ``trace_every_step=True``,
    every step is traced."""
    started = time.perf_counter()
    if not isinstance(model, nn.Module):
        raise UsageError(f"count_generation expects a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() < 2:
        raise UsageError("count_generation: input_ids must be a (batch, prompt length) tensor")
    if not isinstance(new_tokens, int) or isinstance(new_tokens, bool) or new_tokens < 1:
        raise UsageError(f"count_generation: new_tokens must be an int >= 1, got {new_tokens!r}")
    config = getattr(model, "config", None)
    encoder_decoder = bool(getattr(config, "is_encoder_decoder", False))
    parameters = _forward_parameters(model)
    batch, prompt = int(input_ids.shape[0]), int(input_ids.shape[-1])  # (batch, P), or (batch, features, P) for speech
    device = input_ids.device
    notes: List[str] = []
    if is_dataless(input_ids):
        notes.append(
            "count_generation on meta/fake tensors: the generated token ids have no value (a dense model costs the "
            "same whatever the ids); no early stop at an end-of-sequence token"
        )
    main = getattr(model, "main_input_name", "input_ids") if encoder_decoder else "input_ids"
    first: Dict[str, Any] = {main: input_ids, "use_cache": True}
    if "attention_mask" in parameters and not (kwargs and "attention_mask" in kwargs) and input_ids.dtype in _INT:
        if is_dataless(input_ids):
            # generate's all-ones mask would only be checked with .all(), which meta cannot answer
            notes.append("no attention mask was passed on meta (all positions valid, as generate's all-ones mask)")
        else:
            first["attention_mask"] = torch.ones(batch, prompt, dtype=torch.int64, device=device)
    if encoder_decoder:
        first["decoder_input_ids"] = torch.full((batch, 1), _decoder_start(model), dtype=torch.int64, device=device)
    if "logits_to_keep" in parameters:
        first["logits_to_keep"] = 1
    first.update(kwargs or {})
    counter = _Counter(model)
    with _LastOutput(model) as last:
        prefill = counter.count(first)
        output = last.take()
        state = _Decoding(model, output, encoder_decoder, first.get("attention_mask"), parameters, batch, prompt, device)
        if new_tokens > 1 and state.cache is None:
            raise UsageError(f"count_generation: {type(model).__name__} returned no past_key_values (no KV cache to decode with)")
        total = new_tokens - 1
        traced: List[Tuple[Any, Any]] = []  # (trace, costed) of the steps traced so far
        sizes: List[int] = []  # cache bytes after each traced step
        steps: List[FlopResult] = []
        continuation: Optional[_Affine] = None
        kv_bytes = cache_bytes(state.cache)
        for step in range(total):
            if continuation is not None:
                steps.append(continuation.result_at(step, steps[0]))
                continue
            run, costed = counter.trace(state.call(step))
            state.advance(last.take())
            traced.append((run, costed))
            sizes.append(kv_bytes := cache_bytes(state.cache))
            steps.append(counter.result(run, costed))
            if not trace_every_step and len(traced) == 3 and step + 1 < total and sizes[2] - sizes[1] == sizes[1] - sizes[0]:
                continuation = _Affine.check(traced, counter.registry)
                if continuation is not None:  # the cache grows by the same bytes every step
                    kv_bytes = sizes[0] + (sizes[1] - sizes[0]) * (total - 1)
    if continuation is not None:
        notes.append(
            f"decode steps 3..{total - 1} were costed as the exact affine continuation of steps 0 and 1 in the context "
            "length (checked on step 2: every shape and integer argument matched); trace_every_step=True traces each"
        )
    return GenerationResult(
        prefill=prefill,
        steps=tuple(steps),
        batch=batch,
        prompt_tokens=prompt,
        new_tokens=new_tokens,
        kv_cache_bytes=kv_bytes,
        kv_cache_dtype=cache_dtype(state.cache),
        encoder_decoder=encoder_decoder,
        warnings=tuple(notes),
        wall_s=time.perf_counter() - started,
    )


class _Counter:
    """Traces one forward with the dispatch tracer and turns it into a FlopResult; the
    module list and parameter summary are computed once for all steps."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.registry = default_registry()
        self.parameters = summarize_parameters(model)
        self._modules: Optional[List[ModuleInfo]] = None
        self._description = ""
        self._warnings: Tuple[str, ...] = ()
        self._gaps: Tuple[str, ...] = ()

    def trace(self, call: Mapping[str, Any]) -> Tuple[Trace, List[Tuple[OpEvent, Optional[Cost]]]]:
        run = trace(self.model, (), call, tracer="dispatch")
        self._description = describe_inputs((), call)
        return run, cost_events(run.events, self.registry)

    def count(self, call: Mapping[str, Any]) -> FlopResult:
        run, costed = self.trace(call)
        return self.result(run, costed)

    def result(self, run: Trace, costed: List[Tuple[OpEvent, Optional[Cost]]], first: bool = True) -> FlopResult:
        if first:
            self._modules = module_infos(self.model, run.module_calls)
            self._warnings, self._gaps = run.warnings, run.gaps
        return aggregate(
            costed,
            tracer="dispatch",
            modules=self._modules or (),
            parameters=self.parameters,
            input_description=self._description,
            warnings=self._warnings,
            gaps=self._gaps,
        )


class _Decoding:
    """What the next decode step is fed: the greedy token, the cache, the growing mask."""

    def __init__(
        self, model: nn.Module, output: Any, encoder_decoder: bool, mask: Optional[torch.Tensor],
        parameters: Tuple[str, ...], batch: int, prompt: int, device: torch.device,
    ):
        self.encoder_decoder = encoder_decoder
        self.encoder_out = _field(output, "encoder_last_hidden_state") if encoder_decoder else None
        self.mask = mask
        self.logits_to_keep = "logits_to_keep" in parameters
        self.batch, self.prompt, self.device = batch, prompt, device
        self.advance(output)

    def advance(self, output: Any) -> None:
        self.cache = _field(output, "past_key_values")
        self.tokens = _next_tokens(_field(output, "logits"))

    def call(self, step: int) -> Dict[str, Any]:
        call: Dict[str, Any] = {"past_key_values": self.cache, "use_cache": True}
        if self.encoder_decoder:
            from transformers.modeling_outputs import BaseModelOutput

            call["decoder_input_ids"] = self.tokens
            call["encoder_outputs"] = BaseModelOutput(last_hidden_state=self.encoder_out)
            if self.mask is not None:
                call["attention_mask"] = self.mask
        else:
            call["input_ids"] = self.tokens
            if self.mask is not None:
                call["attention_mask"] = torch.ones(self.batch, self.prompt + step + 1, dtype=torch.int64, device=self.device)
        if self.logits_to_keep:
            call["logits_to_keep"] = 1
        return call


class _NotAffine(Exception):
    pass


class _Affine:
    """Decode step s as the affine continuation of steps 0 and 1: every tensor dimension and
    integer argument is ``v0 + (v1 - v0) * s``; everything else is unchanged."""

    def __init__(self, first: List[Tuple[OpEvent, Optional[Cost]]], second: List[Tuple[OpEvent, Optional[Cost]]], registry: HandlerRegistry):
        if len(first) != len(second):
            raise _NotAffine
        self.registry = registry
        self.first = first
        self.varying: List[Tuple[int, OpEvent, OpEvent]] = []
        for index, ((a, _), (b, _)) in enumerate(zip(first, second)):
            if a.call.op != b.call.op or a.module_stack != b.module_stack or a.phase != b.phase:
                raise _NotAffine
            if a.call.args != b.call.args or tuple(a.call.outputs) != tuple(b.call.outputs):
                self.varying.append((index, a, b))

    @staticmethod
    def check(traced: List[Tuple[Any, Any]], registry: HandlerRegistry) -> Optional[_Affine]:
        """The continuation of the first two traced steps if it reproduces the third exactly."""
        (run0, costed0), (run1, costed1), (run2, costed2) = traced[:3]
        if run0.gaps or run1.gaps or run2.gaps:
            return None
        try:
            affine = _Affine(costed0, costed1, registry)
            predicted = affine.events(2)
        except _NotAffine:
            return None
        if len(predicted) != len(costed2):
            return None
        for event, (actual, _) in zip(predicted, costed2):
            if event.call.op != actual.call.op or event.module_stack != actual.module_stack:
                return None
            if event.call.args != actual.call.args or tuple(event.call.outputs) != tuple(actual.call.outputs):
                return None
        return affine

    def events(self, step: int) -> List[OpEvent]:
        events = [event for event, _ in self.first]
        for index, a, b in self.varying:
            events[index] = OpEvent(
                OpCall(a.call.op, _continue(a.call.args, b.call.args, step), _continue(tuple(a.call.outputs), tuple(b.call.outputs), step)),
                a.module_stack,
                a.phase,
            )
        return events

    def result_at(self, step: int, first: FlopResult) -> FlopResult:
        """Step ``step``'s FlopResult: step 0's, with the events that change re-costed."""
        moved = [
            OpEvent(
                OpCall(a.call.op, _continue(a.call.args, b.call.args, step), _continue(tuple(a.call.outputs), tuple(b.call.outputs), step)),
                a.module_stack,
                a.phase,
            )
            for _, a, b in self.varying
        ]
        changes = []
        for (index, _, _), (event, cost) in zip(self.varying, cost_events(tuple(moved), self.registry)):
            old = self.first[index][1]
            if cost is None or old is None:  # unsupported either way: nothing to re-cost
                continue
            changes.append((event, old, cost))
        return reprice(first, changes)


def _continue(a: Any, b: Any, step: int) -> Any:
    """``a`` at step 0 and ``b`` at step 1, continued to ``step``."""
    if a == b:
        return a
    if isinstance(a, TensorMeta) and isinstance(b, TensorMeta):
        if a.dtype != b.dtype or len(a.shape) != len(b.shape):
            raise _NotAffine
        return TensorMeta(tuple(x + (y - x) * step for x, y in zip(a.shape, b.shape)), a.dtype)
    if isinstance(a, int) and isinstance(b, int) and not isinstance(a, bool) and not isinstance(b, bool):
        return a + (b - a) * step
    if isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b):
        return tuple(_continue(x, y, step) for x, y in zip(a, b))
    if isinstance(a, Mapping) and isinstance(b, Mapping) and a.keys() == b.keys():
        return {key: _continue(a[key], b[key], step) for key in a}
    raise _NotAffine


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
