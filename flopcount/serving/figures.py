"""The figures of a serving reading (plain data, no torch): parameters as priced, one
forward's bound, the bounds at one batch size, and the counted facts they are priced from."""

from __future__ import annotations

from dataclasses import astuple, dataclass, field
from typing import Any, Dict, Optional, Tuple

from flopcount.devices.roofline import Bound, bound


@dataclass(frozen=True)
class WeightTensor:
    """One parameter as serving prices it: ``kind`` is "matrix" (a weight that weight-only
    quantization stores quantized), "head" (the LM head, kept in the compute dtype), "table"
    (an embedding read only at the rows gathered), "expert" (one of ``experts`` experts'
    stacked weights) or "other" (norms, biases: compute dtype)."""

    numel: int
    rows: int
    dtype: str
    kind: str
    experts: int = 1


@dataclass(frozen=True)
class Phase:
    """One forward's work and its any-implementation bound on the part (per rank with tp);
    ``attention_flops``: the part of ``flops`` attention ops perform, priced at attention's
    column (:meth:`flopcount.serving.pricing.Pricing.phase`); ``skipped_flops``: the part of
    ``flops`` a kernel that knows the mask skips (the scores a causal or windowed mask leaves
    out, in attention ops or an eager attention's matmuls and elementwise ops), not priced."""

    flops: float
    macs: float
    bytes: float
    compute_s: float
    memory_s: float
    comm_s: float = 0.0
    attention_flops: float = 0.0
    skipped_flops: float = 0.0

    @property
    def seconds(self) -> float:
        return max(self.compute_s, self.memory_s, self.comm_s)

    @property
    def bound(self) -> str:
        if self.comm_s > max(self.compute_s, self.memory_s):
            return "communication"
        kind: Bound = bound(self.compute_s, self.memory_s)
        return kind

    def to_dict(self) -> Dict[str, Any]:
        return {"flops": self.flops, "attention_flops": self.attention_flops,
                "skipped_flops": self.skipped_flops, "macs": self.macs, "bytes": self.bytes,
                "seconds": self.seconds,
                "compute_s": self.compute_s, "memory_s": self.memory_s, "comm_s": self.comm_s, "bound": self.bound}


@dataclass(frozen=True)
class ServeBatch:
    """The bounds at one batch size: ``prefill`` (time to first token), the first and last
    decode steps (inter-token latency at the first and last context), the decode's total,
    tokens/s ceilings and the memory the batch needs."""

    batch: int
    prefill: Phase
    first_step: Optional[Phase]
    last_step: Optional[Phase]
    decode_s: float
    weights_read_per_step: float
    memory_bytes: float
    fits: Optional[bool]
    steps: int = 0

    @property
    def ttft_s(self) -> float:
        """Time-to-first-token lower bound: the prefill's bound (it computes the first token)."""
        return self.prefill.seconds

    @property
    def tokens_per_s_per_sequence(self) -> Optional[float]:
        """Decode tokens/s ceiling of one sequence: steps / their summed bounds."""
        return self.steps / self.decode_s if self.steps and self.decode_s > 0 else None

    @property
    def tokens_per_s(self) -> Optional[float]:
        """Aggregate decode tokens/s ceiling over the batch."""
        per = self.tokens_per_s_per_sequence
        return None if per is None else per * self.batch

    def to_dict(self) -> Dict[str, Any]:
        return {
            "batch": self.batch, "ttft_s": self.ttft_s, "prefill": self.prefill.to_dict(),
            "first_step": None if self.first_step is None else self.first_step.to_dict(),
            "last_step": None if self.last_step is None else self.last_step.to_dict(),
            "decode_s": self.decode_s, "tokens_per_s_per_sequence": self.tokens_per_s_per_sequence,
            "tokens_per_s": self.tokens_per_s, "weights_read_per_step": self.weights_read_per_step,
            "memory_bytes": self.memory_bytes, "fits": self.fits,
        }


@dataclass(frozen=True)
class Work:
    """One forward's counted work: FLOPs, MACs, the cache bytes it reads and writes, and the
    part of its FLOPs attention ops perform (``attention_flops``: ops whose
    :func:`flopcount.devices.roofline.op_family` is "attention"), the part of its FLOPs no
    kernel must perform (``skipped_flops``: the scores a causal or windowed mask leaves out,
    :func:`flopcount.decoding.counted.skipped_flops`) and of those the part attention ops
    perform (``skipped_attention_flops``; the rest are an eager attention's), per sequence in
    :attr:`ServeFacts.prefill` / :attr:`ServeFacts.steps`, the part no sequence adds in
    ``ServeFacts.fixed``."""

    flops: float
    macs: float
    cache_read: float = 0.0
    cache_written: float = 0.0
    attention_flops: float = 0.0
    skipped_flops: float = 0.0
    skipped_attention_flops: float = 0.0

    def times(self, batch: int, fixed: Optional[Work]) -> Work:
        """``batch x self + fixed``: this work at ``batch`` sequences."""
        return Work(*(batch * x + f for x, f in zip(astuple(self), astuple(fixed or Work(0.0, 0.0)))))


@dataclass(frozen=True)
class ServeFacts:
    """What serving is priced from, counted on the model's own code at two batch sizes: each
    figure is affine in the batch B, ``B x figure + fixed[name]`` (per sequence, and the part
    no sequence adds: a rotary table computed once per position, a cache's int64 counters).
    The work of the prefill and of each decode step (:class:`Work`: FLOPs, MACs, the cache bytes
    it reads and writes, the attention FLOPs among the FLOPs), the cache held at the final context, the activations (the largest
    tensor one op writes), the parameters by kind, and the model's shape for tensor parallelism."""

    prompt_tokens: int
    new_tokens: int
    counted_batch: int
    prefill: Work
    steps: Tuple[Work, ...]
    cache_held: float
    cache_dtype: str
    kv_bytes_per_token: float
    activation_bytes: float
    weights: Tuple[WeightTensor, ...]
    model_dtype: str
    fixed: Dict[str, Any] = field(default_factory=dict)
    top_k: int = 0
    layers: int = 0
    hidden: int = 0
    kv_heads: int = 0
    #: the attention (query) heads, 0 when the config does not say
    heads: int = 0
    encoder_decoder: bool = False
    complete: bool = True
    warnings: Tuple[str, ...] = ()
    #: a padded prompt's sequences, each row's real tokens (from ``prompt_lengths`` or a mask whose
    #: values prove them), the lengths the bounds priced; () when every row is the whole prompt
    sequence_lengths: Tuple[int, ...] = ()

    def kv_split(self, tp: int) -> int:
        """How many of ``tp`` ranks the cache is split over (at most the KV heads)."""
        return max(1, min(tp, self.kv_heads or tp))

    def at(self, name: str, batch: int) -> float:
        """``batch x name + its fixed part`` for a scalar figure (``cache_held``, ``activation_bytes``...)."""
        return float(batch * getattr(self, name) + self.fixed.get(name, 0.0))

    def prefill_at(self, batch: int) -> Work:
        """The prefill's work over ``batch`` sequences."""
        return self.prefill.times(batch, self.fixed.get("prefill"))

    def step_at(self, batch: int, index: int) -> Work:
        """Decode step ``index``'s work over ``batch`` sequences."""
        fixed = self.fixed.get("steps")
        return self.steps[index].times(batch, fixed[index] if fixed else None)
