"""The counting pipeline: trace the model, cost each op with the registry, aggregate."""

from __future__ import annotations

import numbers
import warnings
import weakref
from functools import cache
from types import MappingProxyType
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Tuple, Union

import torch
from torch import nn

from flopcount.core.collection import PausedCollections
from flopcount.core.diagnostics import module_place
from flopcount.core.inputs import prepare_call
from flopcount.core.ledger import Booked
from flopcount.core.model_facts import model_facts
from flopcount.core.registry import KNOWN_ZERO, HandlerRegistry
from flopcount.core.results import FlopResult, aggregate
from flopcount.core.traffic import call_traffic
from flopcount.errors import HandlerError, UnsupportedOpError, UnsupportedOpsWarning
from flopcount.handlers import default_registry
from flopcount.step.optimizers import OptimizerSpec
from flopcount.tracers import trace
from flopcount.tracers._containers import COMPILE_WRAPPER
from flopcount.types import ZERO_COST, Cost, Handler, OpCall, OpEvent, Phase, ReplayedCall


def analyze(
    model: nn.Module,
    inputs: Any = (),
    *,
    tracer: str = "auto",
    handlers: Optional[Mapping[str, Optional[Handler]]] = None,
    registry: Optional[HandlerRegistry] = None,
    backward: bool = False,
    loss_fn: Optional[Callable[[Any], Any]] = None,
    optimizer: Optional[OptimizerSpec] = None,
) -> FlopResult:
    """trace -> cost -> aggregate: the :class:`FlopResult` of one run of ``model`` (and,
    with ``optimizer``, of one optimizer step after its backward: phase "optimizer").

    A ``torch.compile``d module is counted through the module it wraps: the same ops,
    module names without the ``_orig_mod.`` prefix, and no compilation.

    With ``tracer="auto"`` automatic garbage collection is paused for the whole count, model
    facts to the aggregated result (:class:`~flopcount.core.collection.PausedCollections`); a
    real run inside it collects as usual (``collection.resumed``)."""
    with PausedCollections(active=tracer == "auto"):
        return _analyzed(model, inputs, tracer, handlers, registry, backward, loss_fn, optimizer)


def _analyzed(
    model: nn.Module, inputs: Any, tracer: str,
    handlers: Optional[Mapping[str, Optional[Handler]]], registry: Optional[HandlerRegistry], backward: bool,
    loss_fn: Optional[Callable[[Any], Any]], optimizer: Optional[OptimizerSpec],
) -> FlopResult:
    model = uncompiled(model)
    table = registry if registry is not None else default_registry()
    if handlers:
        table = table.with_overrides(handlers)
    call = prepare_call(inputs)
    facts = model_facts(model)
    run = trace(model, call, tracer=tracer, backward=backward, loss_fn=loss_fn, optimizer=optimizer, facts=facts)
    costed = cost_records(run.records, table)
    # the jit tracer counts TorchScript only from its graph, each op under its layer (tracers/jit/scripted.py)
    modules = facts.module_infos(run.module_calls, script_classes=run.tracer == "jit")
    parameters, aliases = facts.summary, facts.aliases
    used, notes, gaps = run.tracer, run.warnings, run.gaps
    reused = run.reused_calls
    # what booking does not read is let go before it: the trace's tuple of records and its
    # module calls, the facts' names (their per-module dictionaries; issue #32, the count's
    # working set at the booking's peak)
    del run, facts
    # the totals now, the tables when one is first read (most counts are read for their totals)
    return aggregate(
        costed, tracer=used, modules=modules, parameters=parameters, input_description=call.description,
        warnings=notes, gaps=gaps, aliases=aliases, reused_calls=reused, deferred=True,
    )


def report_unsupported(result: FlopResult, *, strict: bool = False, stacklevel: int = 2) -> None:
    """Raise (``strict``) or warn once when ops without a handler ran: the one wording of
    "unsupported ops" for every reading that counts."""
    unsupported = result.unsupported_details()
    if not unsupported:
        return
    listing = ", ".join(f"{u.op} x{u.count}" for u in unsupported)
    if strict:
        raise UnsupportedOpError(f"ops without a handler ran (strict=True): {listing}")
    warnings.warn(
        f"{len(unsupported)} op type(s) without a handler were not counted: {listing}; "
        "see FlopResult.unsupported_ops() or register a handler",
        UnsupportedOpsWarning,
        stacklevel=stacklevel + 1,
    )


def uncompiled(model: nn.Module) -> nn.Module:
    """The module a ``torch.compile`` wrapper (``OptimizedModule``) holds, else ``model``: the
    wrapper's one child module (it registers the module it compiles as its only submodule)."""
    if type(model).__name__ != COMPILE_WRAPPER:
        return model
    children = list(model.children())
    return children[0] if len(children) == 1 else model


def cost_events(events: Iterable[OpEvent], registry: HandlerRegistry) -> List[Tuple[OpEvent, Optional[Cost]]]:
    """Pair each event with its cost (``None`` when no handler knows the op): the
    handler's MACs and FLOPs, and the bytes the call moves (:mod:`flopcount.core.traffic`)
    unless the handler gave them."""
    return cost_records(events, registry)  # type: ignore[return-value]  # no ReplayedCall in, none out


def cost_records(records: Iterable[Union[OpEvent, ReplayedCall]], registry: HandlerRegistry) -> List[Booked]:
    """:func:`cost_events` of a trace's records as they are: an event with its cost, a
    :class:`~flopcount.types.ReplayedCall` with the costs of its ops, in order (one tuple for every
    replay of the same ops: each distinct call is priced once)."""
    resolved: Dict[str, Tuple[Any, bool]] = {}
    costed: List[Booked] = []
    # an event booked again by structural reuse shares its call with the first: one pricing
    # (a handler is a pure function of the call; traffic of the call and the phase)
    priced: Dict[Tuple[int, str], Optional[Cost]] = {}
    groups: Dict[int, Tuple[Any, Tuple[Optional[Cost], ...]]] = {}

    def fresh(call: OpCall, phase: Phase, stack: Tuple[str, ...]) -> Optional[Cost]:
        entry = resolved.get(call.op)
        if entry is None:
            entry = resolved[call.op] = (registry.resolve(call.op), is_view_op(call.op))
        handler: Any = entry[0]
        shared = type(call.args) is MappingProxyType
        if shared:
            # a call the recorder keeps per shape-cache key (read-only, the same object in every
            # count of those shapes): its price from an earlier count by the same handler
            known = _PRICES.get((id(call), phase))
            if known is not None and known[0] is call and _held_handler(known[1]) is handler:
                priced[(id(call), phase)] = known[2]
                return known[2]
        if handler is None:
            cost: Optional[Cost] = None
        else:
            if handler is KNOWN_ZERO:
                cost = ZERO_COST
            else:
                try:
                    cost = handler(call)
                except Exception as exc:
                    raise HandlerError(_handler_failure(OpEvent(call, stack, phase), exc)) from exc
                cost = _checked(cost, call.op, stack[-1] if stack else "")
            if cost is not None and not (cost.bytes_read or cost.bytes_written):
                read, written = call_traffic(call, view=entry[1], phase=phase)
                if read or written:
                    cost = cost.with_traffic(read, written)
        priced[(id(call), phase)] = cost
        if shared:
            held = _handler_kept(handler)
            if held is not None:
                if len(_PRICES) >= _MAX_PRICES:
                    _PRICES.clear()
                _PRICES[(id(call), phase)] = (call, held, cost)  # the call held: its id stays its own
        return cost

    for event in records:
        if isinstance(event, ReplayedCall):
            found = groups.get(id(event.ops))
            if found is None:
                costs = []
                for call, k, phase in event.ops:
                    known = priced.get((id(call), phase), _UNPRICED)
                    costs.append(fresh(call, phase, event.stacks[k]) if known is _UNPRICED else known)
                found = groups[id(event.ops)] = (event.ops, tuple(costs))  # the ops held: their id stays theirs
            costed.append((event, found[1]))
            continue
        call = event.call
        known = priced.get((id(call), event.phase), _UNPRICED)
        costed.append((event, fresh(call, event.phase, event.module_stack) if known is _UNPRICED else known))
    return costed


_UNPRICED: Any = object()
#: (id(call), phase) -> (call, handler kept, cost) of the calls the recorder shares across counts
#: (``_recorder._shared``: one read-only OpCall per shape-cache key): a handler is a pure function
#: of the call and the bytes one of the call and the phase, so the same call priced by the same
#: handler object costs the same in the next count (a new handler, as ``handlers=`` or
#: ``register_handler`` make, prices it again). Holds the calls, as the recorder's table does
#: (shapes and Python scalars only); a handler by a weak reference (:func:`_handler_kept`).
_PRICES: Dict[Tuple[int, str], Tuple[OpCall, Any, Optional[Cost]]] = {}
_MAX_PRICES = 50_000


def _handler_kept(handler: Any) -> Any:
    """What :data:`_PRICES` keeps of a handler: no handler (None) and :data:`KNOWN_ZERO` as they
    are, a function by a weak reference: a user's handler (``handlers=``, with what its closure and
    defaults hold) is not kept past its count. None: a handler without weak references, not
    memoized."""
    if handler is None or handler is KNOWN_ZERO:
        return handler
    try:
        return weakref.ref(handler)
    except TypeError:
        return None


def _held_handler(kept: Any) -> Any:
    """The handler :func:`_handler_kept` kept (None once a weakly kept one is gone)."""
    return kept() if type(kept) is weakref.ref else kept


#: Ops that return a view whose schema does not say so (the result shares the input's storage).
_UNTAGGED_VIEWS = frozenset({"aten::_unsafe_view"})


@cache
def is_view_op(op: str) -> bool:
    """True when ``op``'s schema returns an alias of an input that it does not write (a
    view: ``aten::view``, ``aten::t``...). Ops torch does not know (composite names of
    flopcount's vocabulary, custom ops) are not views."""
    if op in _UNTAGGED_VIEWS:
        return True
    namespace, _, name = op.partition("::")
    try:
        packet = getattr(getattr(torch.ops, namespace), name)
        overloads = [getattr(packet, o) for o in packet.overloads()]
    except (AttributeError, RuntimeError):
        return False
    for overload in overloads:
        returns = overload._schema.returns
        if returns and all(r.alias_info is not None and not r.alias_info.is_write for r in returns):
            return True
    return False


def _checked(cost: Any, op: str, module: str) -> Optional[Cost]:
    """A handler's answer: a Cost of non-negative integers, or ``None`` (this call is
    unsupported: reported, never zero). Anything else is a HandlerError naming the op
    and the module."""
    if cost is None:
        return None
    if isinstance(cost, Cost):
        macs, flops = cost.macs, cost.flops
        if _count_ok(macs) and _count_ok(flops):
            return cost
        problem = f"returned Cost(macs={macs!r}, flops={flops!r}); both must be integers >= 0"
    else:
        problem = f"returned {type(cost).__name__} {cost!r:.60}; a handler must return a flopcount.Cost(macs=, flops=)"
    raise HandlerError(f"handler for {op} in {module_place(module)} {problem}")


def _count_ok(value: Any) -> bool:
    if type(value) is int:  # the common case, without the ABC check
        return value >= 0
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and int(value) >= 0


def _handler_failure(event: OpEvent, exc: BaseException) -> str:
    """One readable sentence: the op, the module, what went wrong, the tensor shapes."""
    call = event.call
    text = str(exc).strip().strip('"').splitlines()
    detail = text[0] if text else type(exc).__name__
    if len(detail) > 120:
        detail = detail[:117] + "..."
    shapes = [f"{name}={list(value.shape)}" for name, value in call.args.items() if hasattr(value, "shape")]
    listed = ", ".join(shapes[:4]) + (f" and {len(shapes) - 4} more" if len(shapes) > 4 else "")
    where = module_place(event.module)
    on = f" (tensor arguments {listed})" if listed else ""
    return f"the handler for {call.op} in {where} failed: {type(exc).__name__}: {detail}{on}"
