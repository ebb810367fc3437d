"""Plain data shared by every stage: tensor metadata, op calls, op events and costs.

Tracers produce :class:`OpEvent` lists, handlers turn an :class:`OpCall` into a
:class:`Cost`, aggregation sums costs; :class:`ParamSummary` is the static parameter
count. Nothing here imports torch, a tracer or a handler.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from math import prod
from typing import Any, Callable, Dict, Iterable, Iterator, List, Literal, Mapping, Optional, Sequence, Tuple, Union

#: The pass an op ran in: the forward, autograd's backward, or one optimizer step after it.
Phase = Literal["forward", "backward", "optimizer"]


class Status(str, Enum):
    """A verdict, the one spelling every renderer and the CLI use. PASS: within every limit,
    exactly; FAIL: a limit is certainly exceeded; INCOMPLETE: the count may be short, so a
    limit cannot be decided; UNDECIDED: the evidence (a lower bound under the limit, say)
    cannot decide without measuring. A ``str`` subclass: ``Status.PASS == "PASS"``."""

    PASS = "PASS"
    FAIL = "FAIL"
    INCOMPLETE = "INCOMPLETE"
    UNDECIDED = "UNDECIDED"

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    @staticmethod
    def of(lines: Iterable[Any], allow_incomplete: bool = False) -> Status:
        """The verdict of lines that each have a ``status`` and ``passed`` (a budget's, the
        baseline gate's): FAIL when one certainly failed; else INCOMPLETE when one rests on an
        incomplete count (unless ``allow_incomplete``); else UNDECIDED when one cannot be
        decided without measuring; else FAIL when one failed as counted; else PASS."""
        lines = list(lines)
        statuses = {line.status for line in lines}
        if Status.FAIL in statuses:
            return Status.FAIL
        if not allow_incomplete and Status.INCOMPLETE in statuses:
            return Status.INCOMPLETE
        if Status.UNDECIDED in statuses:
            return Status.UNDECIDED
        return Status.PASS if all(line.passed for line in lines) else Status.FAIL


#: What a diagnostic says about a count: an op without a handler ran (``unsupported``), the
#: tracer could not see some work or a placeholder decided a value (``gap``): both make the
#: count incomplete; an op's figure depends on data, or a bound rests on roofs measured under
#: load (``estimate``); anything else (``warning``).
DiagnosticKind = Literal["unsupported", "gap", "estimate", "warning"]


@dataclass(frozen=True)
class Diagnostic:
    """One typed diagnostic of a reading: what kind, the sentence a report prints, and where
    (the op, the modules it ran in, how many calls) when it is about an op."""

    kind: DiagnosticKind
    text: str
    op: str = ""
    modules: Tuple[str, ...] = ()
    count: int = 0

    @property
    def makes_incomplete(self) -> bool:
        """True for the kinds that make a count possibly short (unsupported ops, gaps)."""
        return self.kind in ("unsupported", "gap")


#: The tracers ``count_flops(..., tracer=)`` accepts.
TRACERS: Tuple[str, ...] = ("auto", "jit", "dispatch")

#: The optimizer names ``count_flops``/``estimate_memory(optimizer=)`` and the CLI accept.
OPTIMIZERS: Tuple[str, ...] = ("sgd", "sgd-momentum", "adam", "adamw", "adagrad")

#: The short dtype names every dtype argument takes beside torch's own ("bfloat16",
#: "torch.bfloat16", torch's aliases "half", "float", "double", "long", "int", "short"): the
#: Python API's ``dtype=``, ``autocast=``, ``mixed_precision=``, ``weight_dtype=``, the CLI's
#: ``--dtype`` and an input SPEC's ``:dtype``. Short name -> torch's name (docs/api.md#dtypes);
#: read by :func:`dtype_key` (no torch) and :func:`flopcount.core.dtypes.parse_dtype`.
DTYPE_ALIASES: Mapping[str, str] = {
    "fp32": "float32", "f32": "float32", "float": "float32",
    "fp16": "float16", "f16": "float16", "half": "float16",
    "bf16": "bfloat16",
    "fp64": "float64", "f64": "float64", "double": "float64",
    "i64": "int64", "long": "int64",
    "i32": "int32", "int": "int32",
    "short": "int16",
}

#: The dtypes an error lists by name (with their short names); every other torch dtype is
#: taken by its torch name too ("float8_e4m3fn", "complex128").
DTYPE_NAMES: Tuple[str, ...] = (
    "float32", "float16", "bfloat16", "float64", "int64", "int32", "int16", "int8", "uint8", "bool", "complex64",
)


def dtype_key(text: str) -> str:
    """A dtype's name as torch spells it, from any spelling of :data:`DTYPE_ALIASES` (no torch):
    ``dtype_key(" BF16 ") == dtype_key("torch.bfloat16") == "bfloat16"``; a name it does not
    know comes back lowered, for the caller to refuse."""
    key = text.strip().lower()
    key = key[len("torch."):] if key.startswith("torch.") else key
    return DTYPE_ALIASES.get(key, key)


def out_of_place(op: str) -> str:
    """The out-of-place name of an in-place op (``"aten::addmm_"`` -> ``"aten::addmm"``), the
    name itself for any other op (dunders such as ``"aten::__and__"`` are not in place)."""
    return op[:-1] if op.endswith("_") and not op.endswith("__") else op


#: The counting convention, printed under every report.
#: Version of the JSON report ``FlopResult.to_dict()`` and ``count --format json`` write;
#: ``FlopResult.from_dict`` reads this version and refuses a newer one (docs/api.md).
REPORT_SCHEMA_VERSION = 1

CONVENTION = (
    "MACs count multiply-accumulates of contraction ops (matmul, linear, conv, attention); "
    "FLOPs count every floating-point operation, with 1 MAC = 2 FLOPs."
)


class _DtypeNames(Dict[Any, str]):
    """torch dtype -> its name, each made on first use: a tracer asks once per tensor, and a
    dict's own lookup is the cheapest call there is (a third faster than ``functools.cache``'s)."""

    def __missing__(self, dtype: Any) -> str:
        name = self[dtype] = str(dtype).replace("torch.", "")
        return name


#: A torch dtype's name as :attr:`TensorMeta.dtype` holds it: ``dtype_name(torch.float32) == "float32"``.
dtype_name: Callable[[Any], str] = _DtypeNames().__getitem__


@dataclass(frozen=True)
class TensorMeta:
    """Shape and dtype of one tensor seen by a tracer (never its data).

    A sparse tensor also has its ``layout`` ("sparse_coo", "sparse_csr", "sparse_csc",
    "sparse_bsr", "sparse_bsc") and ``nnz``, its stored values (the element count of its
    values: non-zeros for COO/CSR/CSC, blocks x block area for BSR/BSC); ``nnz`` is None
    when unknown (a fake or meta sparse tensor keeps no values)."""

    shape: Tuple[int, ...]
    dtype: Optional[str] = None
    layout: str = "strided"
    nnz: Optional[int] = None

    @property
    def sparse(self) -> bool:
        return self.layout != "strided"

    @property
    def numel(self) -> int:
        return prod(self.shape)

    @property
    def ndim(self) -> int:
        return len(self.shape)


@dataclass(frozen=True, slots=True)
class OpCall:
    """One aten op as a handler sees it.

    ``op`` is the canonical key (``"aten::addmm"``); ``args`` binds every argument
    by its schema name to a :class:`TensorMeta`, a tuple (for lists), a Python
    scalar/string, or ``None``; ``outputs`` holds the outputs in order (a tuple, or a
    sequence a tracer fills on first access).
    """

    op: str
    args: Mapping[str, Any]
    outputs: Sequence[Any] = ()

    def arg(self, name: str, default: Any = None) -> Any:
        return self.args.get(name, default)

    def tensor(self, name: str) -> TensorMeta:
        """The tensor argument ``name``; raises ``KeyError`` naming the op if absent."""
        value = self.args.get(name)
        if not isinstance(value, TensorMeta):
            raise KeyError(f"{self.op}: argument {name!r} is not a tensor (got {value!r})")
        return value

    def tensors(self) -> Tuple[TensorMeta, ...]:
        """Every tensor argument, lists flattened, in schema order."""
        found = []
        for value in self.args.values():
            if isinstance(value, TensorMeta):
                found.append(value)
            elif isinstance(value, (tuple, list)):
                found.extend(v for v in value if isinstance(v, TensorMeta))
        return tuple(found)

    def out(self, index: int = 0) -> TensorMeta:
        value = self.outputs[index] if index < len(self.outputs) else None
        if not isinstance(value, TensorMeta):
            raise KeyError(f"{self.op}: output {index} is not a tensor (got {value!r})")
        return value


#: The metrics a :class:`Cost` carries, in order: every booking (the ledger) sums each of them.
COST_METRICS: Tuple[str, ...] = ("macs", "flops", "bytes_read", "bytes_written")


@dataclass(frozen=True)
class Cost:
    """Cost of one op call, a small named vector. ``macs`` counts multiply-accumulates of
    contractions only; ``flops`` counts every floating-point operation (1 MAC = 2 FLOPs);
    ``bytes_read`` / ``bytes_written`` are the tensor bytes the op reads and writes (the
    roofline's memory traffic, convention in :mod:`flopcount.core.traffic`). Handlers give
    ``macs`` and ``flops``; the costing stage fills the bytes from the call's tensors
    unless a handler set them.

    ``parts`` is empty for an op that is one operation. A fused op (jit's
    ``aten::_transformer_encoder_layer_fwd``) is reported as the canonical operations it
    performs: one ``(op name, Cost)`` entry per operation, booked by aggregation under
    those names (one call each) instead of the fused op's; every metric is their sum.
    Build it with :meth:`split`.

    ``note`` says why the figure is an estimate or a bound when the op's work depends on
    tensor data the handler cannot see (NMS suppression, RoI sizes); aggregation lists each
    distinct note once in ``FlopResult.warnings``. Set it with :meth:`with_note`.
    """

    macs: int = 0
    flops: int = 0
    parts: Tuple[Tuple[str, Cost], ...] = ()
    note: str = ""
    bytes_read: int = 0
    bytes_written: int = 0

    @property
    def bytes(self) -> int:
        """Bytes read plus bytes written."""
        return self.bytes_read + self.bytes_written

    def __add__(self, other: Cost) -> Cost:
        if not self.parts and not other.parts:
            return Cost(
                self.macs + other.macs, self.flops + other.flops, note=_join_notes(self.note, other.note),
                bytes_read=self.bytes_read + other.bytes_read, bytes_written=self.bytes_written + other.bytes_written,
            )
        for cost in (self, other):
            if not cost.parts and (cost.macs or cost.flops or cost.bytes_read or cost.bytes_written):
                raise ValueError("cannot add an unnamed cost to a split cost: use Cost.split((op, cost), ...)")
        return Cost.split(*self.parts, *other.parts).with_note(_join_notes(self.note, other.note))

    def with_note(self, note: str) -> Cost:
        """This cost, marked as an estimate for the reason ``note`` (one sentence)."""
        return Cost(self.macs, self.flops, self.parts, _join_notes(self.note, note), self.bytes_read, self.bytes_written)

    def with_traffic(self, bytes_read: int, bytes_written: int) -> Cost:
        """This cost with its bytes set; a split cost books them under its first part."""
        if not self.parts:
            return Cost(self.macs, self.flops, (), self.note, bytes_read, bytes_written)
        (first_op, first), *rest = self.parts
        moved = Cost(first.macs, first.flops, (), first.note, bytes_read, bytes_written)
        parts = ((first_op, moved), *((op, Cost(c.macs, c.flops, (), c.note)) for op, c in rest))
        return Cost(self.macs, self.flops, parts, self.note, bytes_read, bytes_written)

    @staticmethod
    def from_macs(macs: int) -> Cost:
        """A pure contraction: FLOPs are twice the MACs."""
        return Cost(macs=int(macs), flops=2 * int(macs))

    @staticmethod
    def from_flops(flops: int) -> Cost:
        """A non-contraction op: FLOPs only, no MACs."""
        return Cost(macs=0, flops=int(flops))

    @staticmethod
    def split(*parts: Tuple[str, Cost]) -> Cost:
        """The cost of a fused op as the operations it performs, one ``(op, cost)`` per call."""
        flat: List[Tuple[str, Cost]] = []
        for op, cost in parts:
            if cost.parts:
                flat.extend(cost.parts)
            else:
                flat.append((op, cost))
        note = _join_notes(*(c.note for _, c in flat))
        return Cost(
            sum(c.macs for _, c in flat), sum(c.flops for _, c in flat), tuple(flat), note,
            sum(c.bytes_read for _, c in flat), sum(c.bytes_written for _, c in flat),
        )


def _join_notes(*notes: str) -> str:
    """Distinct non-empty notes, in order, joined into one text."""
    kept: List[str] = []
    for note in notes:
        for part in note.split("; ") if note else ():
            if part not in kept:
                kept.append(part)
    return "; ".join(kept)


ZERO_COST = Cost()

Handler = Callable[[OpCall], Cost]


@dataclass(frozen=True, slots=True)
class OpEvent:
    """One executed op: the call, the module call stack that ran it, and the phase.

    ``module_stack`` holds qualified module names (as in ``named_modules()``) from
    outermost to innermost; the root module ``""`` is implied and not listed.
    """

    call: OpCall
    module_stack: Tuple[str, ...] = ()
    phase: Phase = "forward"

    @property
    def module(self) -> str:
        return self.module_stack[-1] if self.module_stack else ""


@dataclass(frozen=True, slots=True)
class ReplayedCall:
    """A submodule call booked again from an earlier identical call (structural reuse): that
    call's ops, run again under this call's module names, as ONE record instead of one
    :class:`OpEvent` per op (issue #32: a count's memory flat in depth).

    ``ops`` holds ``(call, stack index, phase)`` per op of the earlier call, in order: the same
    tuple (and the same :class:`OpCall` objects) for every call booked from it; ``stacks`` is
    this call's module stack of each stack index (a sequence that may make each stack when read:
    a replay holds its modules' names, not a tuple per stack), ``root`` the call's own. :meth:`events` gives the events a traced call
    would have left."""

    ops: Tuple[Tuple[OpCall, int, Phase], ...]
    stacks: Sequence[Tuple[str, ...]]
    #: the module stack of the call itself (every stack of ``stacks`` starts with it)
    root: Tuple[str, ...] = ()

    def events(self) -> Iterator[OpEvent]:
        stacks = self.stacks
        for call, k, phase in self.ops:
            yield OpEvent(call, stacks[k], phase)


def expand(records: Iterable[Any]) -> Iterator[OpEvent]:
    """Every op event of a stream of records (:class:`OpEvent` and :class:`ReplayedCall`), groups
    expanded in place: what a tracer without structural reuse would have recorded."""
    for record in records:
        if type(record) is ReplayedCall:
            yield from record.events()
        else:
            yield record


@dataclass(frozen=True)
class Trace:
    """What a tracer returns: the op records in execution order, plus facts about the run.

    ``records`` may hold :class:`ReplayedCall` groups (a call booked from an earlier one);
    ``events`` is every op event, groups expanded (made on each read: a plain count books
    ``records`` as they are, :func:`flopcount.core.analysis.cost_events`)."""

    records: Tuple[Union[OpEvent, ReplayedCall], ...]
    tracer: str
    module_calls: Mapping[str, int] = field(default_factory=dict)
    warnings: Tuple[str, ...] = ()
    #: Why the count may be short, one sentence each: work the tracer could not see, or a
    #: value a placeholder decided (each is also in ``warnings``). Empty when complete.
    gaps: Tuple[str, ...] = ()
    #: The fake path's shape cache: ``{"hits", "misses", "disabled": {op: why}}`` (empty
    #: when no cache ran).
    shape_cache: Mapping[str, Any] = field(default_factory=dict)

    @property
    def events(self) -> Tuple[OpEvent, ...]:
        """Every op event in execution order (each :class:`ReplayedCall` expanded)."""
        records = self.records
        if not any(type(r) is ReplayedCall for r in records):
            return records  # type: ignore[return-value]  # no group: the records are the events
        return tuple(expand(records))

    @property
    def reused_calls(self) -> int:
        """Submodule calls booked from an identical earlier call instead of traced (structural
        reuse, docs/internals.md); 0 where no shape cache ran."""
        return int(self.shape_cache.get("reused_calls", 0))


@dataclass(frozen=True)
class ParamSummary:
    """Unique parameters (tied weights once) and the bytes parameters and buffers take."""

    total: int
    trainable: int
    frozen: int
    bytes_by_dtype: Mapping[str, int] = field(default_factory=dict)
    buffer_bytes_by_dtype: Mapping[str, int] = field(default_factory=dict)
    #: Parameters one token touches in a mixture-of-experts model (shared ones plus k of the
    #: E routed experts per MoE layer); None when no routed experts were found.
    active: Optional[int] = None

    @property
    def param_bytes(self) -> int:
        return sum(self.bytes_by_dtype.values())

    @property
    def buffer_bytes(self) -> int:
        return sum(self.buffer_bytes_by_dtype.values())

    @property
    def size_bytes(self) -> int:
        """Serialised size of the weights: parameters plus buffers, by their dtypes."""
        return self.param_bytes + self.buffer_bytes
