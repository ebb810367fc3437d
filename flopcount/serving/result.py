"""ServeResult: serving bounds of one model on one part (plain data, no torch)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Optional, Tuple

from flopcount.core.diagnostics import OnRoofs
from flopcount.core.rendering import Rendered
from flopcount.devices import Roofs
from flopcount.devices.roofline import ATTENTION, MATMUL
from flopcount.errors import int_at_least
from flopcount.serving.figures import Phase, ServeBatch, ServeFacts, WeightTensor
from flopcount.serving.pricing import price_batch

__all__ = ["ESTIMATED", "LEAVES_OUT", "Phase", "ServeBatch", "ServeFacts", "ServeResult", "WeightTensor"]

#: What the bounds leave out, in the docs and under every report.
LEAVES_OUT = (
    "These are any-implementation lower bounds (ceilings on speed): they leave out scheduling, paging, the batching "
    "policy, kernel launch and host overheads, imperfect kernels and speculative decoding; greedy search, beam width 1."
)

#: what serve computes on its roofs, as the sentence on roofs measured under load names it
ESTIMATED = "serve: each time bound (TTFT, inter-token latency) and tokens/s ceiling"


@dataclass(frozen=True)
class ServeResult(OnRoofs, Rendered):
    """Serving bounds of one model on one part: prefill (TTFT), decode (inter-token latency,
    tokens/s ceilings), memory (weights, KV cache per sequence, activations, the largest
    batch that fits) and the batch at which decode turns compute-bound.

    Every time is an any-implementation lower bound (``max(FLOPs / peak, unavoidable bytes /
    bandwidth)``, :func:`flopcount.devices.any_implementation`), per tensor-parallel rank,
    with the all-reduces over the part's link; see :data:`LEAVES_OUT`."""

    ESTIMATED = ESTIMATED  # what its figures are (OnRoofs)

    part: str
    roofs: Roofs
    dtype: str
    weight_dtype: str
    tp: int
    facts: ServeFacts
    batches: Tuple[ServeBatch, ...]
    weight_bytes: float
    weight_note: str
    kv_bytes_per_sequence: float
    capacity_bytes: Optional[float]
    reserve: float
    max_batch: Optional[int]
    compute_bound_batch: Optional[int]
    link: str = ""
    warnings: Tuple[str, ...] = ()
    leaves_out: str = LEAVES_OUT
    wall_s: float = field(default=0.0, compare=False)

    @property
    def prompt_tokens(self) -> int:
        return self.facts.prompt_tokens

    @property
    def new_tokens(self) -> int:
        return self.facts.new_tokens

    def float32_math(self) -> Dict[str, str]:
        """The math the bounds priced the forwards at when they compute in float32: attention's
        FLOPs at attention's column, every other FLOP as a matmul's (``{"matmul": "float32",
        "attention": "tfloat32x3"}`` on an H100 under torch's defaults; "attention" only for
        a model with attention ops); empty for another compute dtype."""
        if self.dtype != "float32":
            return {}
        works = (self.facts.prefill, *self.facts.steps)
        families = [MATMUL, ATTENTION] if any(work.attention_flops for work in works) else [MATMUL]
        return self.roofs.float32_math(families)

    @property
    def kv_bytes_per_token(self) -> float:
        """Bytes one more position adds to one sequence's cache (per rank), at the first decode step."""
        return self.facts.kv_bytes_per_token / self.kv_split

    @property
    def kv_split(self) -> int:
        """How many ranks the cache is split over (tp, at most the KV heads)."""
        return self.facts.kv_split(self.tp)

    @property
    def usable_bytes(self) -> Optional[float]:
        return None if self.capacity_bytes is None else self.capacity_bytes * (1.0 - self.reserve)

    @property
    def complete(self) -> bool:
        return self.facts.complete

    def at(self, batch: int) -> ServeBatch:
        """The bounds at ``batch`` (one of :attr:`batches`, else priced now)."""
        int_at_least(batch, 1, "serve: batch")  # before the look-up: True == 1 and 2.0 == 2 would find a row
        return next((row for row in self.batches if row.batch == batch), None) or price_batch(self, batch)

