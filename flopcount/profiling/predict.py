"""``flopcount.predict``: a roofline lower bound of a model's latency on a device you may
not have, counted on fake tensors (nothing runs).

Two bounds, each for a stated program (:mod:`flopcount.devices.roofline` computes both):

* **eager** (``latency_s``): each op takes at least ``max(flops / peak, bytes / bandwidth of
  the fastest memory level holding its working set)`` and the ops run one after another, as
  traced: it bounds *this eager program*. A fusing engine (TensorRT, torch.compile) can
  beat it, since fused elementwise work moves fewer bytes.
* **any implementation** (``any_s``): ``max(total FLOPs / peak, unavoidable bytes /
  bandwidth)``, the unavoidable bytes being the parameters, buffers and inputs (caches passed
  in included) the forward reads whole, read once (a lookup table: the rows gathered; a
  tensor only sliced or written in place, or a parameter of a module never called, is left
  out) and, with ``backward``, the gradients written; no engine can run the program faster.

FLOPs are priced at the column of the dtype the kernel computes in (int8 for a quantized
kernel), and only those no kernel can skip (a causal attention's triangle, not the full
Lq x Lk the count books): :mod:`flopcount.profiling._bytes`.

A bound, not a forecast: launch and framework overhead and imperfect kernels only add time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import AbstractSet, Any, Callable, Dict, FrozenSet, Iterator, List, Mapping, Optional, Set, Tuple, Union

import torch

from flopcount.core.analysis import cost_events, is_view_op, uncompiled
from flopcount.core.deprecation import modeled_part
from flopcount.core.diagnostics import OnRoofs, estimate_diagnostics, from_texts, warn_estimated
from flopcount.core.dtypes import parse_dtype
from flopcount.core.inputs import require_module
from flopcount.core.ledger import Ledger
from flopcount.core.model_facts import model_facts
from flopcount.core.params import lookup_tables
from flopcount.core.registry import HandlerRegistry
from flopcount.core.rendering import Rendered, render
from flopcount.core.rows import BookedRows, CostRow
from flopcount.core.traffic import GATHER_SOURCES, element_size, is_floating
from flopcount.devices import AnyBound, BoundKind, Roofs, any_implementation, column_of, named_roofs, op_time
from flopcount.devices.roofline import bound_seconds, kernel_flops
from flopcount.errors import UsageError
from flopcount.handlers import default_registry
from flopcount.profiling._bytes import call_dtype, traffic_as
from flopcount.tracers import trace
from flopcount.types import Cost, Diagnostic, OpEvent, TensorMeta, dtype_key, dtype_name, out_of_place
from flopcount.units import format_count

#: what predict computes on its roofs, as the sentence on roofs measured under load names it
ESTIMATED = "predict: each latency bound"

#: said of a ``torch.compile``-d model (its warning and table line)
COMPILED = ("a torch.compile-d model: the per-op rows and their sum bound the eager program it was compiled from, "
            "not its fused kernels (which move fewer bytes), so its eager bound is the any-implementation bound")

#: predict's rows are the ledger's rows (0.2 name kept): ``latency_s`` is ``attainable_s``
PredictRow = CostRow


@dataclass(frozen=True)
class PredictResult(OnRoofs, BookedRows, Rendered):
    """Lower bounds per op row (op, module, phase) and in total (``latency_s``) on ``roofs``,
    as the ledger booked them: a fused op under the operations it performs, modules credited
    by call stack with their aliases, as :func:`flopcount.count_flops` books them."""

    ESTIMATED = ESTIMATED  # what its figures are (OnRoofs)

    rows: Tuple[CostRow, ...]
    roofs: Roofs
    dtype: Optional[str]
    unsupported: Tuple[str, ...] = ()
    warnings: Tuple[str, ...] = ()
    #: the any-implementation bound (None on results built without it)
    any_bound: Optional[AnyBound] = None
    #: dtypes with FLOPs that the device has no peak for (priced at its highest peak)
    unpriced: Tuple[str, ...] = ()
    _operators: Mapping[str, CostRow] = field(default_factory=dict, repr=False)
    _modules: Mapping[str, CostRow] = field(default_factory=dict, repr=False)
    _phases: Mapping[str, CostRow] = field(default_factory=dict, repr=False)
    #: the model given was a ``torch.compile`` wrapper: the per-op sum bounds the eager program
    #: it compiles, not its fused kernels, so the eager bound is the any-implementation one
    compiled: bool = False
    #: submodule calls booked from an identical earlier call instead of traced (as
    #: ``FlopResult.reused_calls``): how the bound was made, so not in ``to_dict()``
    reused_calls: int = field(default=0, compare=False)

    def diagnostics(self) -> Tuple[Diagnostic, ...]:
        """Ops without a handler, left out of the bound ("unsupported"), that the bounds are
        estimates ("estimate": roofs measured under load), then the warnings ("warning")."""
        unsupported = [Diagnostic("unsupported", f"{op} has no handler: left out of the bound", op) for op in self.unsupported]
        return from_texts([*unsupported, *estimate_diagnostics(self.roofs, ESTIMATED)], self.warnings)

    @property
    def latency_s(self) -> float:
        """The eager program's latency lower bound: the sum of each op's bound."""
        return self.column_sum("attainable_s")

    @property
    def any_s(self) -> float:
        """The any-implementation bound: ``max(total FLOPs / peak, unavoidable bytes /
        bandwidth)`` (0 on results built without it)."""
        return 0.0 if self.any_bound is None else self.any_bound.seconds

    def bound_s(self, kind: BoundKind) -> float:
        """"any": :attr:`any_s`; "eager": the larger of the per-op sum :attr:`latency_s` and
        :attr:`any_s` (the eager program is one implementation, so both bound it); :attr:`any_s`
        for a :attr:`compiled` model, whose fused kernels can beat the per-op sum."""
        return bound_seconds(kind, self.latency_s, self.any_s, self.compiled)

    def float32_math(self) -> Dict[str, str]:
        """The math the bound priced its float32 work at, per op family that did float32 FLOPs
        (``{"matmul": "float32", "attention": "tfloat32x3", "conv": "tfloat32"}``: the part's
        math modes, torch's defaults unless told); empty where no float32 work ran."""
        return self.roofs.float32_math(r.name for r in self.rows if r.dtype == "float32" and r.flops)

    @property
    def compute_s(self) -> float:
        return self.column_sum("compute_s")

    @property
    def memory_s(self) -> float:
        return self.column_sum("memory_s")

    @property
    def complete(self) -> bool:
        """False when an op without a handler ran: the bound leaves its cost out."""
        return not self.unsupported

    def by_operator(self) -> Dict[str, CostRow]:
        """``{op: row}`` summed over modules and phases, largest bound first."""
        return dict(sorted(self._operators.items(), key=lambda kv: (-kv[1].attainable_s, kv[0])))

    def to_dict(self) -> Dict[str, Any]:
        return {
            "device": self.roofs.device,
            "roofs": self.roofs.to_dict(),
            **{key: getattr(self, key) for key in ("dtype", "latency_s", "any_s", "compiled")},
            "any_bound": None if self.any_bound is None else self.any_bound.to_dict(),
            "unpriced_dtypes": list(self.unpriced),
            "float32_math": self.float32_math(),
            **{key: getattr(self, key) for key in ("compute_s", "memory_s", "complete")},
            "unsupported": list(self.unsupported),
            "rows": [r.to_dict() for r in self.rows],
            "warnings": list(self.warnings),
            **self.bound_fields(),
            "note": ("lower bounds, not forecasts: latency_s (eager) = sum over ops of max(FLOPs / peak, bytes / bandwidth of "
                     "the fastest level holding the op's working set); any_s (any implementation) = max(FLOPs / peak, "
                     "unavoidable bytes / bandwidth)"),
        }

    def table(self, limit: Optional[int] = 25) -> str:
        return render(self, "table", limit=limit)


def predict(
    model: Any,
    inputs: Any = (),
    kwargs: Optional[Mapping[str, Any]] = None,
    *,
    on: Union[str, Roofs, None] = None,
    dtype: Any = None,
    backward: bool = False,
    loss_fn: Optional[Callable[[Any], Any]] = None,
    registry: Optional[HandlerRegistry] = None,
    device: Union[str, Roofs, None] = None,
) -> PredictResult:
    """The roofline lower bound of one forward (``backward=True``: forward + backward) of
    ``model`` on the modeled hardware ``on`` (default "h100"; ``device=`` is its deprecated
    0.2 name): a datasheet part ("h100", "H100 NVL", "A100 40GB PCIe", "t4"...;
    :mod:`flopcount.devices.parts`, under torch's default math modes: float32 convolutions and
    RNN layers in TF32, matmuls in FP32, attention at the faster of that and 3xTF32; pass
    ``named_roofs(name, matmul_tf32=True)`` for other modes),
    "this machine" (roofs measured here and written to ``$XDG_CACHE_HOME/flopcount/roofs.json``
    unless ``FLOPCOUNT_NO_ROOFS_CACHE=1``: see :func:`flopcount.devices.named_roofs`), or a
    :class:`~flopcount.devices.Roofs`; a part or Roofs measures and writes nothing.
    ``latency_s`` is the eager bound, ``any_s`` the any-implementation bound.
    ``dtype`` (torch.bfloat16, "bfloat16", "bf16", torch.int8...: a floating dtype or int8,
    docs/api.md#dtypes) prices floating tensors and FLOPs as if the model ran in it (default:
    the dtypes the trace saw). Counted on fake tensors."""
    on = modeled_part(on, device, "predict", default="h100")
    require_module(model, "predict")
    as_dtype = None if dtype is None else column_of(dtype_name(_priced_dtype(dtype)))
    roofs = on if isinstance(on, Roofs) else named_roofs(on)
    table = registry if registry is not None else default_registry()
    compiled = uncompiled(model) is not model
    model = uncompiled(model)
    facts = model_facts(model)
    run = trace(model, () if inputs is None else inputs, kwargs, backward=backward, loss_fn=loss_fn, facts=facts)
    costed = cost_events(run.events, table)
    unsupported: Dict[str, None] = {}
    unpriced: Dict[str, Tuple[int, float]] = {}  # dtype without a peak -> (calls, FLOPs)
    work: Dict[Tuple[str, str], float] = {}
    tables = lookup_tables(model)
    lookup_modules = _lookup_modules(model, tables)
    looked_up = 0  # rows the forward's lookups in those tables gathered (bytes written = rows read)
    priced: List[Tuple[OpEvent, Optional[Cost]]] = []
    seconds: List[Optional[Tuple[float, float, float]]] = []
    dtypes: List[Optional[Tuple[str]]] = []
    read_whole: Set[Tuple[int, ...]] = set()  # shapes the forward's ops read whole
    for event, cost in costed:  # each call priced on the roofs; the ledger books it
        if event.phase == "forward":
            read_whole.update(_read_whole(event.call))
        if cost is None:
            unsupported[event.call.op] = None
            priced.append((event, None))
            seconds.append(None)
            dtypes.append(None)
            continue
        if event.phase == "forward" and event.call.op in _LOOKUPS and event.module in lookup_modules:
            looked_up += _written_as(event.call, as_dtype)
        op_dtype = as_dtype if as_dtype is not None and is_floating(call_dtype(event.call)) else call_dtype(event.call)
        if as_dtype is not None:
            cost = cost.with_traffic(*traffic_as(event.call, as_dtype, phase=event.phase))
        needed = kernel_flops(event.call, cost.flops)  # a causal attention's triangle; else all
        timed = op_time(roofs, needed, cost.bytes, op_dtype, event.call.op)
        if cost.flops and timed.column is None:
            calls, flops = unpriced.get(op_dtype, (0, 0.0))
            unpriced[op_dtype] = (calls + 1, flops + cost.flops)
        if needed:
            key = (op_dtype, event.call.op)
            work[key] = work.get(key, 0.0) + needed
        priced.append((event, cost))
        seconds.append((timed.compute_s, timed.memory_s, timed.seconds))
        dtypes.append((op_dtype,))
    ledger = Ledger(facts.aliases, columns=_COLUMNS, labels=("dtype",)).book_all(priced, seconds, dtypes)
    rows = sorted(ledger.cost_rows("rows").values(), key=lambda r: (-r.attainable_s, r.name, r.module))
    any_bound = any_implementation(roofs, ((f, d, op) for (d, op), f in work.items()),
                                   _unavoidable_bytes(model, inputs, kwargs, as_dtype, backward, tables, looked_up,
                                                      run.module_calls, read_whole))
    warnings = tuple(run.warnings)
    if unsupported:
        warnings += (f"ops without a handler are left out of the bound: {', '.join(unsupported)}",)
    warnings += _unpriced_notes(roofs, unpriced)
    warnings += warn_estimated(roofs, ESTIMATED)
    if compiled:
        warnings += (COMPILED,)
    return PredictResult(
        tuple(rows), roofs, as_dtype, tuple(unsupported), warnings, any_bound, tuple(unpriced),
        ledger.cost_rows("operators"), ledger.cost_rows("modules"), ledger.cost_rows("phases"),
        compiled=compiled, reused_calls=run.reused_calls,
    )


def _priced_dtype(dtype: Any) -> torch.dtype:
    """predict's ``dtype=`` read as every dtype argument is; TF32, which is no dtype but a math
    mode of float32, named as the modes are given."""
    if isinstance(dtype, str) and dtype_key(dtype) in ("tf32", "tfloat32"):
        raise UsageError(f"predict: dtype {dtype!r} is a math mode of float32, not a dtype: "
                         "on=flopcount.devices.named_roofs('h100', matmul_tf32=True) prices float32 matmuls at TF32")
    return parse_dtype(dtype, "predict: dtype", "priced")


def _unpriced_notes(roofs: Roofs, unpriced: Mapping[str, Tuple[int, float]]) -> Tuple[str, ...]:
    """What the bound did with work in dtypes the device has no peak for, one note per kind: a
    floating dtype priced at the highest peak of its kind; the rest (bool masks, int64 indices
    and routing), their calls and FLOPs together, priced by their bytes only."""
    device = roofs.device or "the device"
    notes: Tuple[str, ...] = ()
    stand_ins = [d for d in unpriced if roofs.has_compute_roof(d)]
    if stand_ins:
        priced_at = ", ".join(f"{d} at {roofs.stand_in(d)}" for d in stand_ins)
        notes += (f"{device} has no peak for {', '.join(stand_ins)}: priced at the highest of its kind ({priced_at}), "
                  "so the bound stays a lower bound",)
    bytes_only = [d for d in unpriced if not roofs.has_compute_roof(d)]
    if bytes_only:
        calls = sum(unpriced[d][0] for d in bytes_only)
        flops = sum(unpriced[d][1] for d in bytes_only)
        notes += (f"{device} has no peak for {', '.join(bytes_only)}: {calls} call(s) doing {format_count(flops)} FLOPs "
                  "in them are priced by their bytes only (no compute term), so the bound stays a lower bound",)
    return notes


#: the roofline seconds booked beside each call's cost
_COLUMNS = ("compute_s", "memory_s", "attainable_s")


#: table lookups: an implementation reads the rows they gather, not the table
_LOOKUPS = frozenset({"aten::embedding", "aten::embedding_bag", "aten::_embedding_bag", "aten::_embedding_bag_forward_only"})


def _written_as(call: Any, as_dtype: Optional[str]) -> int:
    """Bytes of a lookup's first output (the gathered rows; an embedding bag's reduced rows,
    fewer than it read), priced at ``as_dtype`` for a floating output."""
    first = call.outputs[0] if call.outputs else None
    if not isinstance(first, TensorMeta):
        return 0
    dtype = as_dtype if as_dtype is not None and is_floating(first.dtype) else first.dtype
    return first.numel * element_size(dtype)


def _lookup_modules(model: Any, tables: FrozenSet[int]) -> FrozenSet[str]:
    """Every name (aliases included) of an embedding module whose weight is a lookup table."""
    from torch import nn

    return frozenset(
        name for name, module in model.named_modules(remove_duplicate=False)
        if isinstance(module, (nn.Embedding, nn.EmbeddingBag)) and all(id(p) in tables for p in module.parameters(recurse=False))
    )


def _read_whole(call: Any) -> Iterator[Tuple[int, ...]]:
    """The shapes of the tensors ``call`` reads whole: none for a view (it reads nothing; a
    slice of a table is read by the op that takes the slice), not the ``self`` or ``out``
    an in-place or out= op writes (``index_copy_`` into a cache reads none of it), and not the
    source a gather picks elements of (``GATHER_SOURCES``: 16 rows of a 64 MiB tensor read
    are 32 KiB, 128x below a real run when counted whole)."""
    if is_view_op(call.op):
        return
    in_place = out_of_place(call.op) != call.op
    gathered = GATHER_SOURCES.get(call.op)
    for name, value in call.args.items():
        if name == "out" or name == gathered or (in_place and name == "self"):
            continue
        if isinstance(value, TensorMeta):
            yield value.shape
        elif isinstance(value, (tuple, list)):
            yield from (v.shape for v in value if isinstance(v, TensorMeta))


def _unavoidable_bytes(
    model: Any, inputs: Any, kwargs: Optional[Mapping[str, Any]], as_dtype: Optional[str], backward: bool,
    tables: FrozenSet[int], looked_up: int, called: Optional[Mapping[str, int]] = None,
    read_whole: Optional[AbstractSet[Tuple[int, ...]]] = None,
) -> int:
    """Bytes any implementation moves at least once: each parameter of a module the forward
    called (``called``, the trace's module names), each buffer and each input tensor (caches
    passed in included) that an op of the forward read whole (``read_whole``: a non-view op
    took a tensor of its shape, not as the ``self`` it writes in place), read once, and with
    ``backward`` those parameters' gradients written. A lookup table (an embedding's weight,
    no other module's) counts as the rows the forward gathered (``looked_up``), not the table,
    and no gradient for it (a sparse gradient writes only those rows). Left out, so the bound
    stays a lower bound: a parameter of a module never called (a head left unused, an expert no
    token was routed to), a tensor only sliced or written in place (a positional table read up
    to the sequence's length, a static KV cache written at one position: 39x above a real run
    when counted whole), the source of a gather (``index_select``, ``gather``, ``x[ids]``: the
    elements picked, priced per op), the outputs, and a lazy module's parameters not yet materialised (their
    size is not known before its first forward). ``called`` or ``read_whole`` None: not used."""
    import torch
    from torch.nn.parameter import is_lazy

    from flopcount.core.inputs import prepare_call

    priced_as = getattr(torch, as_dtype or "", None)  # a column name that is a torch dtype (not "tf32")

    def size(t: torch.Tensor) -> int:
        return t.numel() * (priced_as.itemsize if isinstance(priced_as, torch.dtype) and t.is_floating_point() else t.element_size())

    def read(t: torch.Tensor) -> bool:
        return read_whole is None or tuple(t.shape) in read_whole

    seen: Dict[int, None] = dict.fromkeys(tables)
    total = looked_up
    for tensor in _called_parameters(model, called):
        if id(tensor) in seen or is_lazy(tensor) or not read(tensor):
            continue
        seen[id(tensor)] = None
        total += size(tensor) * (2 if backward and tensor.requires_grad else 1)  # read, and its gradient written
    call = prepare_call(() if inputs is None else inputs, kwargs)
    for tensor in list(model.buffers()) + list(call.tensors):
        if id(tensor) not in seen and read(tensor):
            seen[id(tensor)] = None
            total += size(tensor)
    return total


def _called_parameters(model: Any, called: Optional[Mapping[str, int]]) -> List[Any]:
    """The parameters held by a module the forward called (under any of its names), in
    ``model.parameters()`` order; every parameter where ``called`` is None or empty (a tracer
    that does not say which modules ran)."""
    if not called:
        return list(model.parameters())
    held: Dict[int, Any] = {}
    for name, module in model.named_modules(remove_duplicate=False):
        if name in called:
            for tensor in module.parameters(recurse=False):
                held[id(tensor)] = tensor
    return [tensor for tensor in model.parameters() if id(tensor) in held]
