"""The reading :func:`flopcount.plan` returns: one rank's cost of one training step under
FSDP / tensor parallelism, and the link table and ring formulas its communication time
uses. Plain data, no torch.

Wire bytes per rank follow the ring algorithm on a group of ``n`` ranks, for a
collective over a full buffer of ``B`` bytes: all-gather and reduce-scatter send
``B·(n−1)/n``, all-reduce ``2·B·(n−1)/n`` (a reduce-scatter then an all-gather),
all-to-all ``B·(n−1)/n``, broadcast ``B``. Time = wire bytes / the link's bandwidth in
one direction per GPU. NCCL may pick tree or other algorithms; that is not modelled.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Dict, Mapping, Optional, Tuple, Union

from flopcount.core.deprecation import warn_renamed
from flopcount.core.diagnostics import from_texts, unsupported_ops
from flopcount.core.rendering import Rendered, render
from flopcount.devices.parts import LINKS as _LINKS
from flopcount.errors import UsageError
from flopcount.types import Diagnostic

#: link name -> bandwidth in bytes/s per GPU, one direction (datasheet figures; the one
#: table lives in flopcount.devices.parts)
LINKS: Mapping[str, float] = _LINKS

LinkSpec = Union[None, str, float, Mapping[str, Union[str, float]]]


def ring_factor(kind: str, n: int) -> float:
    """Wire bytes per rank / full buffer bytes for a ring collective on ``n`` ranks."""
    if n <= 1:
        return 0.0
    return {"all_reduce": 2.0 * (n - 1) / n, "broadcast": 1.0}.get(kind, (n - 1) / n)


def link_bandwidth(link: Union[str, float], where: str = "link") -> Tuple[str, float]:
    """``(description, bytes/s)`` of a link name from :data:`LINKS` or a number of bytes/s."""
    if isinstance(link, (int, float)) and not isinstance(link, bool):
        if link <= 0:
            raise UsageError(f"{where}: bandwidth must be > 0 bytes/s, got {link}")
        return f"{float(link):.4g} B/s", float(link)
    if isinstance(link, str):
        key = link.strip().lower().replace("_", "-").replace(" ", "-")
        if key in LINKS:
            return key, LINKS[key]
    raise UsageError(f"{where}: unknown link {link!r} (known: {', '.join(LINKS)}, or bytes/s as a number)")


def links_by_dim(link: LinkSpec, dims: Tuple[str, ...]) -> Dict[str, Tuple[str, float]]:
    """Each mesh dim's link: one link for all, or ``{"dp": ..., "tp": ...}``; {} for None."""
    if link is None:
        return {}
    if isinstance(link, Mapping):
        unknown = [str(k) for k in link if k not in dims]
        if unknown:
            raise UsageError(f"link: unknown mesh dim(s) {', '.join(unknown)} (this plan has {', '.join(dims) or 'none'})")
        return {dim: link_bandwidth(value, f"link[{dim!r}]") for dim, value in link.items()}
    return {dim: link_bandwidth(link) for dim in dims}


@dataclass(frozen=True)
class CommRow:
    """One collective kind on one mesh dim: calls, full-buffer bytes, ring wire bytes per
    rank, and seconds on the dim's link (None without a link)."""

    kind: str
    dim: str
    group_size: int
    calls: int
    tensor_bytes: int
    wire_bytes: int
    seconds: Optional[float] = None
    calls_by_phase: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class StepTimeBounds:
    """Step time of one rank: compute (roofline of its ops: each op takes
    max(FLOPs / peak, bytes / memory bandwidth)), communication (wire bytes / link),
    their sum (no overlap) and max (perfect overlap), and the utilisation each implies:
    MFU = the rank's model FLOPs (``PlanResult.model_flops``: 3 x the forward of the
    unsharded model as written / tp) / (time x peak FLOP/s); HFU = every FLOP the rank ran
    (``PlanResult.total_flops``: forward, backward with any recomputation and the fused
    attention backward's extra work, work replicated on TP ranks, the optimizer step) /
    (time x peak FLOP/s). None where the time (no link given) or the model FLOPs are unknown."""

    peak_flops: float
    memory_bandwidth: Optional[float]
    compute_s: float
    comm_s: Optional[float]
    no_overlap_s: Optional[float]
    overlap_s: Optional[float]
    mfu_no_overlap: Optional[float] = None
    mfu_overlap: Optional[float] = None
    hfu_no_overlap: Optional[float] = None
    hfu_overlap: Optional[float] = None


@dataclass(frozen=True)
class PlanResult(Rendered):
    """One rank's cost of one training step (rank 0 of ``fsdp x tp``).

    ``flops``/``macs``: by phase (forward, backward, optimizer). ``peak_bytes``: torch's
    MemTracker peak on rank 0; ``memory``: its categories at that peak. ``state_bytes``:
    parameter, gradient and optimizer-state shards this rank holds after the step.
    ``comm``: one row per collective kind and mesh dim. ``model_flops``: the MFU's
    numerator, 3 x the forward FLOPs of the unsharded model as written on this rank's
    micro-batch / tp (PaLM's convention; None if it could not be traced); ``total_flops``
    is the HFU's, every FLOP the rank ran."""

    fsdp: int
    tp: int
    #: the modeled GPU of the step times ("" without); 0.2 called it ``device``
    on: str
    dtype: str
    flops: Mapping[str, int]
    macs: Mapping[str, int]
    peak_bytes: int
    memory: Mapping[str, int]
    state_bytes: Mapping[str, int]
    comm: Tuple[CommRow, ...]
    step_time: Optional[StepTimeBounds]
    blocks: str = ""
    wrapped_blocks: int = 0
    tokens: int = 0
    unsupported: Mapping[str, int] = field(default_factory=dict)
    by_operator: Mapping[str, int] = field(default_factory=dict)
    notes: Tuple[str, ...] = ()
    backend: str = "nccl"
    model_flops: Optional[int] = None
    #: one rank's micro-batch, as planned (e.g. ``(Tensor[1, 128] int64)``)
    inputs: str = ""

    def diagnostics(self) -> Tuple[Diagnostic, ...]:
        """Ops without a handler (op and calls, "unsupported"), then the notes ("warning"), each once."""
        return from_texts(unsupported_ops(self.unsupported), self.notes)

    @property
    def device(self) -> str:
        """Deprecated (0.2): :attr:`on`, the modeled GPU (a plan runs on the meta device)."""
        warn_renamed("PlanResult.device", "PlanResult.on (the modeled GPU)")
        return self.on

    @property
    def world_size(self) -> int:
        return self.fsdp * self.tp

    @property
    def total_flops(self) -> int:
        return sum(self.flops.values())

    @property
    def step_time_bounds(self) -> Optional[StepTimeBounds]:
        return self.step_time

    def comm_totals(self, kind: str, dim: Optional[str] = None) -> CommRow:
        """The summed row of ``kind`` (over every dim, or one); zeros if none ran."""
        rows = [r for r in self.comm if r.kind == kind and (dim is None or r.dim == dim)]
        size = rows[0].group_size if rows and dim is not None else 0
        seconds = [r.seconds for r in rows if r.seconds is not None]
        return CommRow(
            kind, dim or "*", size, sum(r.calls for r in rows), sum(r.tensor_bytes for r in rows),
            sum(r.wire_bytes for r in rows), sum(seconds) if seconds else None,
        )

    def to_dict(self) -> Dict[str, Any]:
        data = asdict(self)
        data["world_size"] = self.world_size
        data["total_flops"] = self.total_flops
        data["comm"] = [asdict(r) | {"calls_by_phase": dict(r.calls_by_phase)} for r in self.comm]
        for key in ("flops", "macs", "memory", "state_bytes", "unsupported", "by_operator"):
            data[key] = dict(getattr(self, key))
        data["notes"] = list(self.notes)
        data["device"] = self.on  # 0.2's key for the modeled GPU, kept one release
        return data

    def to_markdown(self) -> str:
        return render(self, "markdown")
