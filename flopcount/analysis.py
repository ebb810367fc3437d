"""count_flops: trace the model, cost each op with the registry, aggregate."""

from __future__ import annotations

import dataclasses
import itertools
import warnings
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple, Union

from torch import nn

from .errors import FlopcountWarning, HandlerError, TraceError, UnsupportedOpError, UsageError
from .params import summarize_parameters
from .registry import KNOWN_ZERO, HandlerRegistry, default_registry
from .results import FlopResult, ModuleInfo, aggregate
from .tracers.modules import describe_inputs
from .types import Cost, Handler, OpEvent, Trace, ZERO_COST

TRACERS = ("auto", "jit", "dispatch")


def count_flops(
    model: nn.Module,
    inputs: Any = (),
    kwargs: Optional[Mapping[str, Any]] = None,
    tracer: str = "auto",
    *,
    strict: bool = False,
    handlers: Optional[Mapping[str, Optional[Handler]]] = None,
    registry: Optional[HandlerRegistry] = None,
    backward: bool = False,
    loss_fn: Optional[Callable[[Any], Any]] = None,
    measure: Union[bool, Mapping[str, Any]] = False,
) -> FlopResult:
    """Count FLOPs, MACs and parameters of one forward of ``model``.

    ``inputs``: a tuple is unpacked as positional arguments; a Tensor, list, dict or
    any other container is passed as one positional argument; ``kwargs`` are passed
    as keyword arguments. ``tracer``: "auto" (jit), "jit" or "dispatch".
    ``handlers`` overrides or adds handlers for this call only (``None`` = known zero);
    ``strict=True`` raises :class:`UnsupportedOpError` when an op without a handler ran.
    ``measure=True`` (or a dict of :func:`flopcount.benchmark` options) also times the
    forward and stores the :class:`BenchmarkResult` on ``result.benchmark``, with
    achieved FLOP/s; tables and ``to_dict()`` then show counts and timings together.
    ``backward=True`` (dispatch tracer) also counts the backward pass of a loss made
    from the outputs (their sum, or ``loss_fn(outputs)``); see ``FlopResult.by_phase()``.
    Convention: 1 MAC = 2 FLOPs; MACs count contraction ops only.
    """
    if not isinstance(model, nn.Module):
        raise UsageError(f"count_flops expects a torch.nn.Module, got {type(model).__name__}")
    if tracer not in TRACERS:
        raise UsageError(f"tracer must be one of {', '.join(TRACERS)}; got {tracer!r}")
    table = registry if registry is not None else default_registry()
    if handlers:
        table = table.with_overrides(handlers)

    if loss_fn is not None and not backward:
        raise UsageError("loss_fn is only used with backward=True")
    trace = _run_tracer(model, inputs, kwargs, tracer, backward=backward, loss_fn=loss_fn)
    costed = cost_events(trace.events, table)
    result = aggregate(
        costed,
        tracer=trace.tracer,
        modules=_module_infos(model, trace.module_calls),
        parameters=summarize_parameters(model),
        input_description=describe_inputs(inputs, kwargs),
        warnings=trace.warnings,
        aliases=_module_aliases(model),
    )
    if measure:
        from .bench import benchmark

        options = dict(measure) if isinstance(measure, Mapping) else {}
        timing = benchmark(model, inputs, kwargs, flops=result.by_phase().get("forward", result.flops), **options)
        result = dataclasses.replace(result, benchmark=timing)
    unsupported = result.unsupported_details()
    if unsupported:
        listing = ", ".join(f"{u.op} x{u.count}" for u in unsupported)
        if strict:
            raise UnsupportedOpError(f"ops without a handler ran (strict=True): {listing}")
        warnings.warn(
            f"{len(unsupported)} op type(s) without a handler were not counted: {listing}; "
            "see FlopResult.unsupported_ops() or register a handler",
            FlopcountWarning,
            stacklevel=2,
        )
    return result


def _run_tracer(
    model: nn.Module,
    inputs: Any,
    kwargs: Optional[Mapping[str, Any]],
    tracer: str,
    *,
    backward: bool,
    loss_fn: Optional[Callable[[Any], Any]],
) -> Trace:
    """Pick and run a tracer. "auto" uses jit unless it cannot serve the request or
    fails, then the dispatch tracer; the reason is kept in the trace's warnings."""
    from .tracers import dispatch, jit

    if tracer == "jit":
        if backward:
            raise UsageError("backward=True needs tracer='dispatch' (or 'auto'); torch.jit cannot see backward")
        return jit.trace(model, inputs, kwargs)
    if tracer == "dispatch":
        return dispatch.trace(model, inputs, kwargs, backward=backward, loss_fn=loss_fn)
    reason = _jit_unsuitable(model, inputs, kwargs, backward)
    if reason is None:
        try:
            jit_trace = jit.trace(model, inputs, kwargs, stop_on_value_read=True)
        except jit.ValueReadError as exc:
            # jit drops ops whose results only steered Python (an if/while on a tensor,
            # .tolist() routing), so its count would miss them; it stopped at the first read.
            reason = f"{exc} (data-dependent control flow jit cannot trace)"
        except TraceError as exc:
            reason = f"jit could not trace the model ({exc})"
        else:
            opaque = sorted({e.call.op for e in jit_trace.events if e.call.op in _OPAQUE_TO_JIT})
            if not opaque:
                return jit_trace
            reason = f"jit cannot see inside {', '.join(opaque)} (custom autograd Functions, scripted calls)"
    fallback = dispatch.trace(model, inputs, kwargs, backward=backward, loss_fn=loss_fn)
    return dataclasses.replace(fallback, warnings=fallback.warnings + (f"tracer auto: used dispatch because {reason}",))


# jit records a custom torch.autograd.Function as one opaque node, and a scripted function
# it could not inline (control flow in the callee) as a call; dispatch sees their aten ops.
_OPAQUE_TO_JIT = frozenset({"prim::PythonOp", "prim::CallFunction"})


def _jit_unsuitable(model: nn.Module, inputs: Any, kwargs: Optional[Mapping[str, Any]], backward: bool) -> Optional[str]:
    from .tracers import jit
    from .tracers.modules import as_call_args, flatten_tensors, is_dataless

    if backward:
        return "backward=True"
    if not jit.is_available():
        return "torch.jit is not available"

    tensors, _ = flatten_tensors(as_call_args(inputs, kwargs))
    for tensor in itertools.chain(tensors, model.parameters(), model.buffers()):
        if is_dataless(tensor):
            kind = "on the meta device" if tensor.device.type == "meta" else "FakeTensors"
            return f"inputs or weights are {kind}"
    return None


def cost_events(events: Tuple[OpEvent, ...], registry: HandlerRegistry) -> List[Tuple[OpEvent, Optional[Cost]]]:
    """Pair each event with its cost (``None`` when no handler knows the op)."""
    resolved: Dict[str, Any] = {}
    costed: List[Tuple[OpEvent, Optional[Cost]]] = []
    for event in events:
        call = event.call
        handler = resolved.get(call.op, resolved)
        if handler is resolved:
            handler = resolved[call.op] = registry.resolve(call.op)
        if handler is None:
            costed.append((event, None))
        elif handler is KNOWN_ZERO:
            costed.append((event, ZERO_COST))
        else:
            try:
                costed.append((event, handler(call)))
            except Exception as exc:
                shapes = ", ".join(f"{k}={getattr(v, 'shape', v)}" for k, v in call.args.items())
                where = event.module or "<root>"
                raise HandlerError(f"handler for {call.op} failed in module '{where}' on ({shapes}): {exc}") from exc
    return costed


def _module_aliases(model: nn.Module) -> Dict[str, Tuple[str, ...]]:
    """``{canonical name: all names}`` for each module reachable under several names."""
    names: Dict[int, List[str]] = {}
    for name, module in model.named_modules(remove_duplicate=False):
        names.setdefault(id(module), []).append(name)
    return {found[0]: tuple(found) for found in names.values() if len(found) > 1}


def _module_infos(model: nn.Module, calls: Mapping[str, int]) -> List[ModuleInfo]:
    """Each module with its parameter count (its own and its submodules', each tensor
    once), in one pass over the parameters rather than one per module."""
    owned: Dict[str, int] = {}
    counted = set()
    for qualified, param in model.named_parameters(remove_duplicate=False):
        parts = qualified.split(".")[:-1]
        for end in range(len(parts) + 1):
            prefix = ".".join(parts[:end])
            if (prefix, id(param)) not in counted:  # a tied tensor counts once per module
                counted.add((prefix, id(param)))
                owned[prefix] = owned.get(prefix, 0) + param.numel()
    infos = []
    for name, module in model.named_modules():
        depth = 0 if not name else name.count(".") + 1
        infos.append(ModuleInfo(name, type(module).__name__, depth, calls.get(name, 0), owned.get(name, 0)))
    return infos
