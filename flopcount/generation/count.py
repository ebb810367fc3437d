"""The cost of ``model.generate(input_ids, max_new_tokens=N)`` (greedy), measured step by step.

``generate`` runs one **prefill** forward over the P prompt positions (the LM head on the
last position only: ``logits_to_keep=1``), then N - 1 **decode** steps of one token each
through the model's own KV cache; decode step s (0-based) attends to P + s + 1 positions.
An encoder-decoder runs its encoder once, in the prefill, beside the decoder's first
(one-token) step; the decode steps reuse the encoder output. :func:`count_generation` runs
exactly these forwards (on fake copies for a model on meta, with structural reuse of its
repeated layers; by the dispatch tracer on the model as given for real weights: see
:mod:`flopcount.decoding.counted`), and feeds each step the greedy token (the argmax of the
last logits; the argmax itself, like generate's logits processors, is not counted). On meta/fake tensors the tokens have no value: the ids fed
back are data-less, which does not change a dense model's cost (every token costs the same);
a mixture-of-experts model is counted with each token routed to exactly k experts.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Optional, Tuple

import torch
from torch import nn

from flopcount.core.diagnostics import from_texts, unique
from flopcount.core.rendering import Rendered
from flopcount.core.results import FlopResult
from flopcount.decoding.caches import cache_bytes, cache_dtype, cache_position_bytes
from flopcount.decoding.counted import count_decoding
from flopcount.types import Diagnostic

__all__ = ["GenerationResult", "count_generation", "cache_bytes", "cache_position_bytes"]


@dataclass(frozen=True)
class GenerationResult(Rendered):
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
    def reused_calls(self) -> int:
        """Submodule calls of the traced forwards (the prefill, the traced decode steps) booked from
        an identical earlier call instead of traced (``FlopResult.reused_calls``; a step costed as a
        continuation was not traced and reuses none): how the count was made, not in ``to_dict()``."""
        return self.prefill.reused_calls + sum(step.reused_calls for step in self.steps)

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
        parts = [("prefill", self.prefill)] + [("decode", step) for step in self.steps]
        return tuple(dict.fromkeys(f"{where}: {reason}" for where, result in parts for reason in result.incomplete_reasons()))

    def diagnostics(self) -> Tuple[Diagnostic, ...]:
        """Every diagnostic of the prefill and decode counts as a typed record, each once:
        what makes a count incomplete first, worded as :meth:`incomplete_reasons` ("prefill: ..."
        or "decode: ..."), then the other records of the counts and generation's own notes."""
        parts = [("prefill", self.prefill)] + [("decode", step) for step in self.steps]
        short = [replace(d, text=f"{where}: {d.text}") for where, result in parts for d in result.diagnostics() if d.makes_incomplete]
        other = [d for _, result in parts for d in result.diagnostics() if not d.makes_incomplete]
        return from_texts(unique(short) + unique(other), self.warnings)



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
    decoded = count_decoding(
        model, input_ids, new_tokens, kwargs, trace_every_step=trace_every_step,
        options={"cache_implementation": cache_implementation, "max_cache_len": max_cache_len,
                 "prefill_chunk_size": prefill_chunk_size},
    )
    return GenerationResult(
        prefill=decoded.prefill,
        steps=tuple(decoded.steps),
        batch=decoded.setup.batch,
        prompt_tokens=decoded.setup.prompt,
        new_tokens=new_tokens,
        kv_cache_bytes=cache_bytes(decoded.cache),
        kv_cache_dtype=cache_dtype(decoded.cache),
        encoder_decoder=decoded.setup.encoder_decoder,
        # count_generation's own notes, then every warning of the counts it is made of, each once
        warnings=tuple(dict.fromkeys([*decoded.notes, *(w for r in [decoded.prefill, *decoded.steps] for w in r.warnings)])),
        kv_cache_position_bytes=cache_position_bytes(decoded.cache),
        wall_s=decoded.wall_s,
    )
