"""The ``optimizer=`` argument of ``count_flops`` and ``estimate_memory``, parsed in one place.

An optimizer is given as a name (``"sgd"``, ``"sgd-momentum"``, ``"adam"``, ``"adamw"``,
``"adagrad"``), a
``torch.optim.Optimizer`` instance (its type, param groups and defaults are reused), an
Optimizer subclass (built with its defaults: ``torch.optim.AdamW``) or a factory called
with the list of trainable parameters (``lambda ps: torch.optim.SGD(ps, lr=0.1)``). It is
always rebuilt on fake twins of the parameters: the user's optimizer and parameters are
never stepped.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
from typing import (
    Any,
    Callable,
    Collection,
    Dict,
    FrozenSet,
    Iterator,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
    Type,
    Union,
)

import torch
from torch import nn

from flopcount.errors import UsageError
from flopcount.types import OPTIMIZERS

__all__ = ["OPTIMIZERS", "OptimizerSpec", "build_optimizer", "check_spec", "foreach_default", "gradless", "per_parameter",
           "UNTRACKED_SPARSE", "sparse_gradient", "warm_up"]

OptimizerSpec = Union[str, torch.optim.Optimizer, Type[torch.optim.Optimizer], Callable[[List[torch.Tensor]], Any]]


def check_spec(spec: Any, caller: str) -> None:
    """Raise a UsageError now (before any tracing) if ``spec`` cannot name an optimizer."""
    if isinstance(spec, str):
        if spec.strip().lower() not in OPTIMIZERS:
            raise UsageError(f"{caller}: unknown optimizer {spec!r} (known: {', '.join(OPTIMIZERS)})")
        return
    if isinstance(spec, torch.optim.Optimizer) or callable(spec):
        return
    raise UsageError(
        f"{caller}: optimizer must be a name ({', '.join(OPTIMIZERS)}), an Optimizer, an Optimizer class "
        f"or a factory taking the parameter list; got {type(spec).__name__}"
    )


#: each name of :data:`OPTIMIZERS`: the class and its options
_NAMED: Dict[str, Tuple[Callable[..., torch.optim.Optimizer], Dict[str, Any]]] = {
    "sgd": (torch.optim.SGD, {"lr": 1e-3}), "sgd-momentum": (torch.optim.SGD, {"lr": 1e-3, "momentum": 0.9}),
    "adam": (torch.optim.Adam, {}), "adamw": (torch.optim.AdamW, {}), "adagrad": (torch.optim.Adagrad, {}),
}


def build_optimizer(
    spec: OptimizerSpec, twins: Mapping[int, torch.Tensor], parameters: Sequence[torch.Tensor], caller: str
) -> Tuple[torch.optim.Optimizer, str]:
    """``spec`` built on fake parameters, and the name to report it by.

    ``twins`` maps ``id(real parameter)`` to its fake twin (to rebuild an instance's param
    groups); a name, class or factory is given those of the fake ``parameters`` that require grad.
    Where ``foreach`` is left to torch, it is set as torch would set it for the real
    tensors (multi-tensor kernels on cuda), since torch never picks them for fakes."""
    check_spec(spec, caller)
    params = [p for p in parameters if p.requires_grad]
    if not params and not isinstance(spec, torch.optim.Optimizer):
        raise UsageError(f"{caller}: the model has no trainable parameter (requires_grad=True) for the optimizer to step")
    if isinstance(spec, str):
        key = spec.strip().lower()
        kind, options = _NAMED[key]
        return kind(params, foreach=foreach_default(params), **options), key
    if isinstance(spec, torch.optim.Optimizer):
        return _rebuilt(spec, twins, caller), type(spec).__name__
    label = getattr(spec, "__name__", type(spec).__name__)
    try:
        made = spec(params)  # type: ignore[call-arg]  # a class or a factory: both take the parameter list
    except Exception as exc:
        raise UsageError(f"{caller}: optimizer {label}(params) failed on fake parameters: {type(exc).__name__}: {exc}") from exc
    if not isinstance(made, torch.optim.Optimizer):
        raise UsageError(f"{caller}: optimizer factory {label} returned {type(made).__name__}, not a torch.optim.Optimizer")
    if isinstance(spec, type):
        _set_foreach_defaults(made)
    return made, type(made).__name__


def _rebuilt(optimizer: torch.optim.Optimizer, twins: Mapping[int, torch.Tensor], caller: str) -> torch.optim.Optimizer:
    groups = []
    for index, group in enumerate(optimizer.param_groups):
        missing = [p for p in group["params"] if id(p) not in twins]
        if missing:
            raise UsageError(
                f"{caller}: param group {index} of the optimizer holds {len(missing)} tensor(s) that are not "
                f"parameters of the model (first shape {tuple(missing[0].shape)})"
            )
        options = {key: _own_constant(value) for key, value in group.items() if key != "params"}
        groups.append({**options, "params": [twins[id(p)] for p in group["params"]]})
    defaults = {key: _own_constant(value) for key, value in _constructor_defaults(optimizer).items()}
    try:
        made = type(optimizer)(groups, **defaults)
    except Exception as exc:
        raise UsageError(
            f"{caller} could not rebuild {type(optimizer).__name__} on fake parameters as "
            f"type(opt)(param_groups, **opt.defaults): {type(exc).__name__}: {exc}"
        ) from exc
    _set_foreach_defaults(made)
    return made


def _own_constant(value: Any) -> Any:
    """A tensor option (a tensor ``lr``, ``betas`` of tensors) made again with its value, in
    whichever tensor mode builds the optimizer: under the fake twins' mode a fake constant, which
    the constructor's checks (``0.0 <= lr``) and the step (``lr.item()``) read as the real one."""
    if isinstance(value, torch.Tensor):
        return torch.tensor(value.tolist(), dtype=value.dtype, device=value.device)
    if isinstance(value, (tuple, list)) and any(isinstance(v, torch.Tensor) for v in value):
        return type(value)(_own_constant(v) for v in value)
    return value


def _constructor_defaults(optimizer: torch.optim.Optimizer) -> Dict[str, Any]:
    """``optimizer.defaults`` less the keys its constructor does not take (AdamW keeps
    ``decoupled_weight_decay`` there but fixes it itself); each group carries them anyway."""
    accepted = inspect.signature(type(optimizer).__init__).parameters  # torch.optim.Optimizer's, or a subclass's
    if any(p.kind is p.VAR_KEYWORD for p in accepted.values()):
        return dict(optimizer.defaults)
    return {k: v for k, v in optimizer.defaults.items() if k in accepted}


def _set_foreach_defaults(optimizer: torch.optim.Optimizer) -> None:
    """``foreach`` left to torch (None, not fused) set as torch would set it for the real tensors."""
    for group in optimizer.param_groups:
        if "foreach" in group and group["foreach"] is None and not group.get("fused"):
            group["foreach"] = foreach_default(group["params"])


def foreach_default(params: Sequence[torch.Tensor]) -> Optional[bool]:
    """True where torch would pick its multi-tensor kernels for the real tensors (cuda, xpu)."""
    return True if params and all(p.device.type in ("cuda", "xpu") for p in params) else None


#: torch.optim classes (exact types) whose step keeps one state entry per parameter, made and
#: updated from that parameter's metadata, its gradient and its group's options alone (no state
#: shared between parameters, none that depends on a parameter's place in the list): the
#: warm-up of one parameter then stands for every parameter of its kind (:func:`warm_up`)
_PER_PARAMETER = frozenset(
    getattr(torch.optim, name)
    for name in ("SGD", "Adam", "AdamW", "Adamax", "NAdam", "RAdam", "RMSprop", "Adadelta", "Adagrad")
)


def per_parameter(opt: Any) -> bool:
    """Whether ``opt`` is one of torch's per-parameter optimizers (:data:`_PER_PARAMETER`)."""
    return type(opt) in _PER_PARAMETER


def sparse_gradient(model: nn.Module, caller: str, consequence: str) -> Optional[Tuple[str, str]]:
    """(the module's name, ``caller``'s refusal) for the first module of ``model`` whose weight
    gradient is sparse (``Embedding`` or ``EmbeddingBag`` with ``sparse=True`` and a trained weight;
    the root as ""), the message naming it and going on with ``consequence``; None when none is."""
    for name, module in model.named_modules():
        if isinstance(module, (nn.Embedding, nn.EmbeddingBag)) and module.sparse and module.weight.requires_grad:
            who = repr(name) if name else "the model"
            return name, f"{caller}: {who} makes a sparse gradient (sparse=True){consequence}"
    return None


#: why ``estimate_memory`` and ``plan`` refuse a sparse gradient (:func:`sparse_gradient`'s ``consequence``)
UNTRACKED_SPARSE = ", which torch's MemTracker cannot measure (a sparse tensor has no storage to track); "


def gradless(model: nn.Module, optimizer: Optional[torch.optim.Optimizer], skip: Collection[nn.Parameter] = ()) -> FrozenSet[str]:
    """Names of ``model``'s trainable parameters that have no gradient after a step and yet
    hold optimizer state (``skip``: parameters not to judge). torch's optimizers skip a
    parameter without a gradient, so in a real run they never make its state (the state an
    optimizer makes in its constructor, Adagrad's, is there in the real run too); a warm-up
    must not make it either (``warm_up(..., stateless=)``)."""
    if optimizer is None or not optimizer.state:
        return frozenset()
    skipped = {id(p) for p in skip}
    return frozenset(
        name for name, p in model.named_parameters()
        if p.requires_grad and p.grad is None and p in optimizer.state and id(p) not in skipped
    )


@contextlib.contextmanager
def _sitting_out(model: Optional[nn.Module], names: Collection[str]) -> Iterator[None]:
    """``model``'s parameters named in ``names`` frozen while the block runs (a warm-up then
    gives them no state), put back after."""
    held = [p for name, p in model.named_parameters() if name in names and p.requires_grad] if model is not None and names else []
    for p in held:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p in held:
            p.requires_grad_(True)


def warm_up(
    opt: torch.optim.Optimizer, caller: str, *, reuse: bool = False, model: Optional[nn.Module] = None,
    stateless: Collection[str] = (),
) -> None:
    """One step on zero gradients, so the optimizer state exists as in every step after the
    first (the steady state); gradients are then set to None.

    ``reuse`` (fake tensors only: their values are never read, except scalar constants,
    which are cloned with their values): for a per-parameter torch optimizer
    (:data:`_PER_PARAMETER`), only the first parameter of each kind (its group, class, shape,
    stride, dtype, device, DTensor placements and mesh) is stepped, and every other parameter
    of that kind gets a clone of its state (same keys, tensors of the same metadata, one
    storage each, aliases kept), in the order a full step would have made them. The state is
    then the one a full warm-up makes, tensor for tensor; other optimizers (LBFGS, a
    subclass, a user's class) are stepped in full.

    ``stateless``: names of ``model``'s parameters the step gives no gradient (:func:`gradless`
    of an earlier run): they sit out the warm-up, as a real run's optimizer never makes their
    state."""
    from flopcount.tracers._reuse import reuse_enabled  # the one on/off switch of #32's reuse

    with _sitting_out(model, stateless):
        if reuse and type(opt) in _PER_PARAMETER and reuse_enabled():
            _warm_up_by_kind(opt, caller)
            return
        for group in opt.param_groups:
            for param in group["params"]:
                if param.requires_grad:
                    param.grad = torch.zeros_like(param)
        _step(opt, caller)
        opt.zero_grad(set_to_none=True)


def _step(opt: torch.optim.Optimizer, caller: str) -> None:
    try:
        opt.step()
    except Exception as exc:
        raise UsageError(f"{caller}: {type(opt).__name__}.step() failed on fake tensors: {type(exc).__name__}: {exc}") from exc


def _kind(index: int, param: torch.Tensor) -> Tuple[Any, ...]:
    """What a per-parameter optimizer's state of ``param`` (in group ``index``) can depend on."""
    placements = getattr(param, "placements", None)  # a DTensor's (FSDP2, TP): its local shard follows
    mesh = getattr(param, "device_mesh", None)
    return (
        index, type(param), tuple(param.shape), param.stride(), param.dtype, param.device, param.requires_grad,
        None if placements is None else tuple(placements), id(mesh),
    )


def _warm_up_by_kind(opt: torch.optim.Optimizer, caller: str) -> None:
    kinds: Dict[Tuple[Any, ...], torch.Tensor] = {}
    order: List[Tuple[torch.Tensor, torch.Tensor]] = []  # (parameter, the one stepped for it), in step order
    before = list(opt.state)  # made by the constructor (Adagrad): kept in place, as a full step keeps them
    groups = opt.param_groups
    saved = [group["params"] for group in groups]
    try:
        for index, group in enumerate(groups):
            firsts = []
            for param in group["params"]:
                if not param.requires_grad:
                    continue
                first = kinds.setdefault(_kind(index, param), param)
                if first is param:
                    firsts.append(param)
                    param.grad = torch.zeros_like(param)
                order.append((param, first))
            group["params"] = firsts
        _step(opt, caller)
    finally:
        for group, params in zip(groups, saved):
            group["params"] = params
    opt.zero_grad(set_to_none=True)
    states: Dict[torch.Tensor, Any] = {}
    for param, first in order:
        if first in opt.state and param not in states:
            states[param] = opt.state[first] if param is first else _cloned(opt.state[first])
    made = {param: states.get(param, opt.state[param]) for param in before}
    made.update((param, state) for param, state in states.items() if param not in made)
    opt.state.clear()
    opt.state.update(made)


def _cloned(state: Mapping[str, Any]) -> Dict[str, Any]:
    """A copy of one parameter's state: each tensor cloned (same metadata, a storage of its
    own, a fake scalar's constant kept; two keys holding one tensor still hold one), the rest
    deep-copied."""
    clones: Dict[int, torch.Tensor] = {}
    out: Dict[str, Any] = {}
    for key, value in state.items():
        if isinstance(value, torch.Tensor):
            if id(value) not in clones:
                with torch.no_grad():
                    clones[id(value)] = value.clone()
            out[key] = clones[id(value)]
        else:
            out[key] = copy.deepcopy(value)
    return out
