"""The public entry point ``count_flops``: the counting pipeline plus, on request, the
benchmark (``measure=``) — the one place the two side of flopcount meet."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Callable, Dict, Mapping, Optional, Union

from torch import nn

from flopcount.bench.latency import benchmark
from flopcount.core.analysis import analyze, report_unsupported
from flopcount.core.inputs import prepare_call, require_module
from flopcount.core.registry import HandlerRegistry
from flopcount.core.results import FlopResult
from flopcount.errors import UsageError
from flopcount.step.loss import needs_backward
from flopcount.step.optimizers import OptimizerSpec, check_spec
from flopcount.types import TRACERS, Handler


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
    optimizer: Optional[OptimizerSpec] = None,
    measure: Union[bool, Mapping[str, Any]] = False,
) -> FlopResult:
    """Count FLOPs, MACs and parameters of one forward of ``model``.

    ``inputs``: a tuple is unpacked as positional arguments; a Tensor, list, dict or
    any other container is passed as one positional argument; ``kwargs`` are passed
    as keyword arguments. ``tracer``: "auto" (dispatch on fake copies: nothing computed; one real run
    if the forward needs a value, said in ``warnings``), "jit" or "dispatch" (real runs).
    ``handlers`` overrides or adds handlers for this call only (``None`` = known zero);
    ``strict=True`` raises :class:`UnsupportedOpError` when an op without a handler ran.
    ``inputs=None`` means no positional inputs (same as ``()``).
    ``measure=True`` (or a dict of :func:`flopcount.benchmark` options) also times the
    forward and stores the :class:`BenchmarkResult` on ``result.benchmark``, with
    achieved FLOP/s; tables and ``to_dict()`` then show counts and timings together.
    ``backward=True`` (dispatch tracer) also counts the backward pass of a loss made
    from the outputs (their sum, or ``loss_fn(outputs)``); see ``FlopResult.by_phase()``.
    ``optimizer`` (with ``backward=True``): "sgd", "sgd-momentum", "adam", "adamw", an
    Optimizer instance, class or factory ``f(params)``; one steady-state step of it is
    counted under phase "optimizer", on fake twins of the parameters (nothing is stepped).
    Convention: 1 MAC = 2 FLOPs; MACs count contraction ops only.
    """
    require_module(model, "count_flops")
    if tracer not in TRACERS:
        raise UsageError(f"tracer must be one of {', '.join(TRACERS)}; got {tracer!r}")
    if optimizer is not None:  # the unknown name first: with backward=True it would be next
        check_spec(optimizer, "count_flops")
    needs_backward(backward, loss_fn, optimizer)
    if handlers is not None and not isinstance(handlers, Mapping):
        raise UsageError(
            f"handlers must be a mapping {{op name: handler or None}}, got {type(handlers).__name__} "
            "(e.g. handlers={'mylib::op': my_handler})"
        )
    if registry is not None and not isinstance(registry, HandlerRegistry):
        raise UsageError(f"registry must be a flopcount HandlerRegistry, got {type(registry).__name__}")
    options = _measure_options(measure)
    call = prepare_call(inputs, kwargs)  # walked once; counting and timing share it
    result = analyze(
        model,
        call,
        tracer=tracer,
        handlers=handlers,
        registry=registry,
        backward=backward,
        loss_fn=loss_fn,
        optimizer=optimizer,
    )
    if options is not None:
        timing = benchmark(model, call, flops=result.by_phase().get("forward", result.flops), **options)
        result = dataclasses.replace(result, benchmark=timing)
    report_unsupported(result, strict=strict, stacklevel=3)
    return result



def _measure_options(measure: Any) -> Optional[Dict[str, Any]]:
    """``None`` (do not time), or the keyword arguments for :func:`benchmark`."""
    if measure is None or measure is False:
        return None
    if measure is True:
        return {}
    if not isinstance(measure, Mapping):
        raise UsageError(f"measure must be True, False or a dict of benchmark() options, got {type(measure).__name__}")
    known = [name for name, p in inspect.signature(benchmark).parameters.items() if p.kind is p.KEYWORD_ONLY and name != "flops"]
    unknown = [str(key) for key in measure if key not in known]
    if unknown:
        raise UsageError(f"measure: unknown benchmark option(s) {', '.join(map(repr, unknown))}; known: {', '.join(known)}")
    return dict(measure)
