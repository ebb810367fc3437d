"""The counting pipeline: trace the model, cost each op with the registry, aggregate."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

from torch import nn

from .errors import HandlerError
from .handlers import default_registry
from .inputs import describe_inputs, is_uninitialized
from .params import summarize_parameters
from .registry import KNOWN_ZERO, HandlerRegistry
from .results import FlopResult, ModuleInfo, aggregate
from .tracers import trace
from .types import ZERO_COST, Cost, Handler, OpEvent


def analyze(
    model: nn.Module,
    inputs: Any = (),
    kwargs: Optional[Mapping[str, Any]] = None,
    *,
    tracer: str = "auto",
    handlers: Optional[Mapping[str, Optional[Handler]]] = None,
    registry: Optional[HandlerRegistry] = None,
    backward: bool = False,
    loss_fn: Optional[Callable[[Any], Any]] = None,
) -> FlopResult:
    """trace -> cost -> aggregate: the :class:`FlopResult` of one run of ``model``."""
    table = registry if registry is not None else default_registry()
    if handlers:
        table = table.with_overrides(handlers)
    run = trace(model, inputs, kwargs, tracer=tracer, backward=backward, loss_fn=loss_fn)
    return aggregate(
        cost_events(run.events, table),
        tracer=run.tracer,
        modules=_module_infos(model, run.module_calls),
        parameters=summarize_parameters(model),
        input_description=describe_inputs(inputs, kwargs),
        warnings=run.warnings,
        gaps=run.gaps,
    )


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
                raise HandlerError(_handler_failure(event, exc)) from exc
    return costed


def _handler_failure(event: OpEvent, exc: BaseException) -> str:
    """One readable sentence: the op, the module, what went wrong, the tensor shapes."""
    call = event.call
    text = str(exc).strip().strip('"').splitlines()
    detail = text[0] if text else type(exc).__name__
    if len(detail) > 120:
        detail = detail[:117] + "..."
    shapes = [f"{name}={list(value.shape)}" for name, value in call.args.items() if hasattr(value, "shape")]
    listed = ", ".join(shapes[:4]) + (f" and {len(shapes) - 4} more" if len(shapes) > 4 else "")
    where = f"module '{event.module}'" if event.module else "the root module"
    on = f" (tensor arguments {listed})" if listed else ""
    return f"the handler for {call.op} in {where} failed: {type(exc).__name__}: {detail}{on}"


def _module_infos(model: nn.Module, calls: Mapping[str, int]) -> List[ModuleInfo]:
    """Each module with its parameter count (its own and its submodules', each tensor
    once), in one pass over the parameters rather than one per module."""
    owned: Dict[str, int] = {}
    counted = set()
    for qualified, param in model.named_parameters(remove_duplicate=False):
        if is_uninitialized(param):
            continue  # a lazy module not materialised yet (counting leaves it lazy)
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
