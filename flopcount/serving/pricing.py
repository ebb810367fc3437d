"""Serving figures priced on a part from :class:`ServeFacts` (no torch): the weight bytes a
forward reads (weight-only quantization, the experts a batch routes to, the rows a lookup
gathers), each forward's any-implementation bound (:func:`flopcount.devices.any_implementation`,
the one roofline function), tensor parallelism's all-reduces, memory and capacity."""

from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Tuple

from flopcount.core.traffic import ITEMSIZE
from flopcount.devices import LINKS, Roofs, any_implementation
from flopcount.devices.roofline import ATTENTION, MATMUL
from flopcount.errors import UsageError, int_at_least, is_int_at_least
from flopcount.serving.figures import Phase, ServeBatch, ServeFacts, WeightTensor

#: weight-only formats: bytes per element, and the scales each stores (stated in the result)
QUANTIZED = {
    "int8": (1.0, "int8 weights with one float16 scale per output row"),
    "float8_e4m3fn": (1.0, "fp8 (e4m3) weights with one float32 scale per tensor (per expert)"),
    "int4": (0.5, "int4 weights in groups of 128 along the input dimension, each with a float16 scale and a "
                  "4-bit zero point (GPTQ/AWQ layout)"),
}
#: bytes per element: the spine's sizes (core.traffic), and TF32's storage, float32's
_ITEMSIZE = {**{name: size for name, size in ITEMSIZE.items() if not name.startswith("complex")}, "tfloat32": 4}


#: the names of the weight-only formats ``serve(weight_dtype=)`` takes -> QUANTIZED's key
WEIGHT_FORMATS = {"int8": "int8", "w8": "int8", "int4": "int4", "w4": "int4", "fp8": "float8_e4m3fn",
                  "float8_e4m3fn": "float8_e4m3fn"}


def weight_format(name: Optional[str], dtype: str) -> str:
    """The weight dtype ``name`` (a format of :data:`WEIGHT_FORMATS`, or a float dtype's torch
    name: serve has read the user's spelling) as priced: None -> the compute dtype."""
    if name is None:
        return dtype
    text = WEIGHT_FORMATS.get(name, name)
    if text not in QUANTIZED and text not in _ITEMSIZE:
        raise UsageError(f"weight_dtype {name!r} is not known: int8, int4, fp8, or a float dtype (float16, bfloat16...)")
    return text


def itemsize(dtype: str) -> float:
    if dtype not in _ITEMSIZE:
        raise UsageError(f"no element size known for dtype {dtype!r}")
    return float(_ITEMSIZE[dtype])


def tensor_bytes(tensor: WeightTensor, weight_dtype: str, dtype: str) -> float:
    """Bytes ``tensor`` is stored in: quantizable matrices and experts in ``weight_dtype``
    (scales included), the LM head, embeddings and the rest in the compute dtype (integer
    parameters in their own)."""
    own = tensor.dtype if tensor.dtype not in ("float16", "bfloat16", "float32", "float64") else dtype
    if tensor.kind not in ("matrix", "expert") or weight_dtype == dtype:
        return tensor.numel * itemsize(own)
    if weight_dtype not in QUANTIZED:
        return tensor.numel * itemsize(weight_dtype)
    per, _ = QUANTIZED[weight_dtype]
    data = math.ceil(tensor.numel * per)
    if weight_dtype == "int8":
        return data + 2.0 * tensor.rows
    if weight_dtype == "int4":
        groups = tensor.rows * math.ceil((tensor.numel // max(1, tensor.rows)) / 128)
        return data + 2.5 * groups
    return data + 4.0 * tensor.experts


def weight_note(weight_dtype: str, dtype: str) -> str:
    if weight_dtype in QUANTIZED:
        return (f"weights: {QUANTIZED[weight_dtype][1]}; the LM head, embeddings, norms and biases kept in {dtype} "
                f"(as weight-only checkpoints keep them)")
    return f"weights in {weight_dtype}"


def expected_fraction(tokens: float, experts: int, k: int) -> float:
    """Expected fraction of a layer's E experts that T tokens, each routed to k distinct
    experts uniformly and independently, touch: 1 - (1 - k/E)^T (E x that experts)."""
    if experts <= 1 or k <= 0:
        return 1.0
    return 1.0 - (1.0 - min(k, experts) / experts) ** tokens


def weights_held(facts: ServeFacts, weight_dtype: str, dtype: str) -> float:
    return sum(tensor_bytes(t, weight_dtype, dtype) for t in facts.weights)


def weights_read(facts: ServeFacts, tokens: float, weight_dtype: str, dtype: str) -> float:
    """Weight bytes one forward over ``tokens`` tokens must read: every weight once, a lookup
    table's gathered rows only, and of each MoE layer's experts the expected share the tokens
    route to."""
    total = 0.0
    for tensor in facts.weights:
        size = tensor_bytes(tensor, weight_dtype, dtype)
        if tensor.kind == "table":
            total += min(size, tokens * size / max(1, tensor.rows))
        elif tensor.kind == "expert":
            total += size * expected_fraction(tokens, tensor.experts, facts.top_k)
        else:
            total += size
    return total


class Pricing:
    """Prices forwards on ``roofs`` for a given dtype, weight format and tp."""

    def __init__(self, facts: ServeFacts, roofs: Roofs, dtype: str, weight_dtype: str, tp: int, link: str) -> None:
        self.facts, self.roofs, self.dtype, self.weight_dtype, self.tp = facts, roofs, dtype, weight_dtype, tp
        self.link_bw = LINKS[link] if link else 0.0
        self.kv_split = facts.kv_split(tp)
        self.scale = itemsize(dtype) / itemsize(facts.model_dtype) if facts.cache_dtype == facts.model_dtype else 1.0
        self._read: Dict[float, float] = {}  # tokens -> weight bytes a forward over them reads

    def weights_read(self, tokens: float) -> float:
        """:func:`weights_read` at this pricing's formats, once per token count (every decode
        step of a batch reads the same weights: one walk of the parameters, not one per step)."""
        found = self._read.get(tokens)
        if found is None:
            found = self._read[tokens] = weights_read(self.facts, tokens, self.weight_dtype, self.dtype)
        return found

    def phase(
        self, flops: float, macs: float, weight_bytes: float, other_bytes: float, tokens: float, *, attention_flops: float,
        skipped_flops: float = 0.0, skipped_attention_flops: float = 0.0,
    ) -> Phase:
        """One forward's bound per rank: the FLOPs a kernel must perform / tp at the compute
        dtype's peak (``flops`` less the ``skipped_flops`` of the scores a causal or windowed
        mask leaves out, :func:`flopcount.decoding.counted.skipped_flops`; the attention FLOPs
        among them, less ``skipped_attention_flops``, at attention's column, the rest at the
        matmul family's:
        :meth:`Roofs.column`), weights / tp and cache bytes / min(tp, KV heads)
        over the bandwidth, and with tp > 1 two ring all-reduces of tokens x hidden per layer
        over the link: 2 (tp - 1) / tp x bytes / link."""
        moved = weight_bytes / self.tp + other_bytes / self.kv_split
        needed = self._work((flops - skipped_flops) / self.tp, (attention_flops - skipped_attention_flops) / self.tp)
        bound = any_implementation(self.roofs, needed, moved)
        comm = 0.0
        if self.tp > 1:
            size = tokens * self.facts.hidden * itemsize(self.dtype)
            comm = 2 * self.facts.layers * 2 * (self.tp - 1) / self.tp * size / self.link_bw
        return Phase(flops / self.tp, macs / self.tp, moved, bound.compute_s, bound.memory_s, comm,
                     attention_flops=attention_flops / self.tp, skipped_flops=skipped_flops / self.tp)

    def _work(self, flops: float, attention_flops: float) -> List[Tuple[float, str, str]]:
        """:func:`any_implementation`'s work items for ``flops`` of which ``attention_flops``
        are attention's: two items where attention has a column of its own (float32 on a part
        whose 3xTF32 beats the matmul mode), else one, the sum at the shared column."""
        if self.roofs.column(self.dtype, ATTENTION) == self.roofs.column(self.dtype, MATMUL):
            return [(flops, self.dtype, MATMUL)]
        rest = flops - attention_flops
        return [(attention_flops, self.dtype, ATTENTION), (rest, self.dtype, MATMUL)]

    def prefill(self, batch: int) -> Phase:
        tokens = batch * self.facts.prompt_tokens
        work = self.facts.prefill_at(batch)
        return self.phase(work.flops, work.macs, self.weights_read(tokens), work.cache_written * self.scale, tokens,
                          attention_flops=work.attention_flops, skipped_flops=work.skipped_flops,
                          skipped_attention_flops=work.skipped_attention_flops)

    def step(self, batch: int, index: int) -> Phase:
        work = self.facts.step_at(batch, index)
        other = (work.cache_read + work.cache_written) * self.scale
        return self.phase(work.flops, work.macs, self.weights_read(batch), other, batch,
                          attention_flops=work.attention_flops, skipped_flops=work.skipped_flops,
                          skipped_attention_flops=work.skipped_attention_flops)

    def memory(self, batch: int) -> float:
        """Per rank: weights held, the cache of ``batch`` sequences at the final context, and
        the activations (the largest tensor one op writes, a lower bound of their peak)."""
        f = self.facts
        return (weights_held(f, self.weight_dtype, self.dtype) / self.tp
                + f.at("cache_held", batch) * self.scale / self.kv_split + f.at("activation_bytes", batch) / self.tp)


def price_batch_with(pricing: Pricing, batch: int, usable: Optional[float]) -> ServeBatch:
    facts = pricing.facts
    int_at_least(batch, 1, "serve: batch")
    steps = [pricing.step(batch, i) for i in range(len(facts.steps))]
    memory = pricing.memory(batch)
    weights = pricing.weights_read(batch) / pricing.tp if steps else 0.0
    return ServeBatch(
        batch, pricing.prefill(batch), steps[0] if steps else None, steps[-1] if steps else None,
        sum(s.seconds for s in steps), weights, memory, None if usable is None else memory <= usable, len(steps),
    )


def price_batch(result: Any, batch: int) -> ServeBatch:
    """The bounds of a ServeResult's model and part at ``batch``."""
    pricing = Pricing(result.facts, result.roofs, result.dtype, result.weight_dtype, result.tp, result.link)
    return price_batch_with(pricing, batch, result.usable_bytes)


def max_batch(pricing: Pricing, usable: Optional[float]) -> Optional[int]:
    """The largest batch whose memory (:meth:`Pricing.memory`) fits ``usable`` bytes (0: not one)."""
    if usable is None:
        return None
    fixed = pricing.memory(0)
    per = pricing.memory(1) - fixed
    if fixed > usable:
        return 0
    return int((usable - fixed) // per) if per > 0 else None


def compute_bound_batch(pricing: Pricing, limit: int = 1 << 24) -> Optional[int]:
    """The smallest batch at which the mean decode step's compute term reaches its memory
    term (None: never below ``limit``, e.g. when the cache's bytes grow as fast as the FLOPs)."""
    facts = pricing.facts
    n = len(facts.steps)
    if not n:
        return None

    def compute_wins(batch: int) -> bool:
        works = [facts.step_at(batch, i) for i in range(n)]
        flops = sum(w.flops for w in works) / n
        attention = sum(w.attention_flops for w in works) / n
        skipped = sum(w.skipped_flops for w in works) / n
        skipped_attention = sum(w.skipped_attention_flops for w in works) / n
        cache = sum(w.cache_read + w.cache_written for w in works) / n
        weights = pricing.weights_read(batch)
        phase = pricing.phase(flops, 0.0, weights, cache * pricing.scale, batch, attention_flops=attention,
                              skipped_flops=skipped, skipped_attention_flops=skipped_attention)
        return phase.compute_s >= phase.memory_s

    high = 1
    while not compute_wins(high):
        high *= 2
        if high > limit:
            return None
    low = high // 2
    while high - low > 1:  # compute_wins(high), not compute_wins(low) (or low == 0)
        middle = (low + high) // 2
        if compute_wins(middle):
            high = middle
        else:
            low = middle
    return high


def batches_of(batch: object, counted: int) -> Tuple[int, ...]:
    if batch is None:
        return (counted,)
    values: List[object] = list(batch) if isinstance(batch, (list, tuple)) else [batch]
    for value in values:
        if not is_int_at_least(value, 1):
            raise UsageError(f"serve: batch must be an int >= 1 or a list of them, got {batch!r}")
    return tuple(dict.fromkeys(int(v) for v in values))  # type: ignore[call-overload]
