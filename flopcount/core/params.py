"""Parameter counts and sizes, read statically from the model (no forward needed)."""

from __future__ import annotations

from typing import Any, Dict, FrozenSet, Iterable, Iterator, List, Optional, Sequence, Tuple

import torch
from torch import nn

from flopcount.core.inputs import is_uninitialized
from flopcount.core.packed import held_tensors, packed_objects
from flopcount.types import ParamSummary, dtype_name

#: Config keys that name how many experts each token is routed to.
TOP_K_KEYS = ("num_experts_per_tok", "moe_top_k", "moe_topk", "num_selected_experts", "top_k")


def summarize_parameters(model: nn.Module, *, experts_per_token: Optional[int] = None) -> ParamSummary:
    """Count each parameter tensor once, even when shared by several modules; with routed
    experts, also the parameters one token touches (every parameter less (E - k) / E of each
    block of E routed experts, k = ``experts_per_token`` or the config's ``num_experts_per_tok``)."""
    return summary_of(model, list(model.named_modules()), experts_per_token=experts_per_token)


def summary_of(
    model: nn.Module,
    modules: Sequence[Tuple[str, nn.Module]],
    *,
    experts_per_token: Optional[int] = None,
    parameters: Optional[Iterable[torch.Tensor]] = None,
    buffers: Optional[Iterable[torch.Tensor]] = None,
    packed: Optional[Iterable[Tuple[str, nn.Module, Any]]] = None,
    experts: Optional[Sequence[Tuple[str, nn.Module]]] = None,
) -> ParamSummary:
    """:func:`summarize_parameters` from ``model.named_modules()`` read already; ``parameters``,
    ``buffers`` (each tensor once, in ``modules`` order) and ``packed`` (:func:`packed_objects`)
    when the caller has them too (``ModelFacts``: one walk of the tree), and ``experts``: the
    modules among ``modules`` that may hold routed experts (the others cannot: no
    ``num_experts``/``num_local_experts`` anywhere :func:`routed_experts` looks, no ModuleList
    named ``...experts``)."""
    total = trainable = 0
    by_dtype: Dict[str, int] = {}
    if parameters is None:
        parameters = _unique(t for _, m in modules for t in m._parameters.values())  # a shared tensor once
    for param in parameters:
        if is_uninitialized(param):
            continue  # a lazy module not materialised yet: its size is not known
        n = param.numel()
        total += n
        if param.requires_grad:
            trainable += n
        key = dtype_name(param.dtype)
        by_dtype[key] = by_dtype.get(key, 0) + n * param.element_size()
    # quantized modules: packed weights/biases are not nn.Parameters (frozen, stored dtype)
    for _, module, obj in packed_objects(model, modules) if packed is None else packed:
        for tensor, stored in held_tensors(module, obj):
            n = tensor.numel()
            total += n
            size = torch.finfo(stored).bits // 8 if stored != tensor.dtype else tensor.element_size()
            key = dtype_name(stored)
            by_dtype[key] = by_dtype.get(key, 0) + n * size
    found: Dict[str, int] = {}
    if buffers is None:
        buffers = _unique(t for _, m in modules for t in m._buffers.values())
    for buf in buffers:
        if is_uninitialized(buf):
            continue
        key = dtype_name(buf.dtype)
        found[key] = found.get(key, 0) + buf.numel() * buf.element_size()
    active = _active(model, modules if experts is None else experts, experts_per_token)
    return ParamSummary(total, trainable, total - trainable, by_dtype, found, active=active)


def config_value(model: nn.Module, keys: Tuple[str, ...]) -> Optional[int]:
    """The first positive int among ``keys`` of the model's (text) config, if it has one."""
    config: Any = getattr(model, "config", None)
    if config is None:
        return None
    configs = [config]
    get_text = getattr(config, "get_text_config", None)
    if callable(get_text):
        try:
            configs.insert(0, get_text())
        except Exception:  # a config without a text part
            pass
    for cfg in configs:
        for key in keys:
            value = getattr(cfg, key, None)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return None


def routed_experts(
    model: nn.Module, modules: Optional[Sequence[Tuple[str, nn.Module]]] = None
) -> Iterator[Tuple[str, int, List[nn.Parameter]]]:
    """(module name, E, parameters) of every block of E routed experts.

    Two layouts are recognised: a module with an int ``num_experts`` (or ``num_local_experts``)
    attribute E > 1 whose own weights are stacked 3-D tensors with a leading dimension E
    (transformers 5's experts modules; their (E, out) biases count too), and an ``nn.ModuleList`` named ``experts`` (or ``...experts``) of E
    identical modules. Shared experts live outside these blocks and count as always active."""
    looked: Dict[Tuple[type, str], bool] = {}
    silent: Dict[type, bool] = {}
    for name, module in model.named_modules() if modules is None else modules:
        if counts_no_experts(module, silent):
            count = None  # what _declared answers for both names (most modules: one check)
        else:
            count = _declared(module, "num_experts", looked) or _declared(module, "num_local_experts", looked)
        if isinstance(count, int) and count > 1:
            stacked = [p for p in module.parameters(recurse=False) if p.dim() >= 2 and p.shape[0] == count]
            if any(p.dim() >= 3 for p in stacked):  # a router's (E, hidden) weight alone is not experts
                yield name, count, stacked
                continue
        if isinstance(module, nn.ModuleList) and name.split(".")[-1].endswith("experts") and len(module) > 1:
            yield name, len(module), list(module.parameters())


_MODULE_GETATTR = nn.Module.__getattr__
EXPERT_COUNTS = frozenset({"num_experts", "num_local_experts"})


def counts_no_experts(module: nn.Module, silent: Dict[type, bool]) -> bool:
    """Whether ``module`` surely holds neither name of :data:`EXPERT_COUNTS`: its class answers
    neither (:func:`class_answers`; ``silent``: class -> that, for this walk) and neither is in
    its ``__dict__`` or its tables of children, parameters and buffers."""
    kind = type(module)
    quiet = silent.get(kind)
    if quiet is None:
        quiet = silent[kind] = not any(class_answers(kind, key) for key in EXPERT_COUNTS)
    state = vars(module)
    return quiet and EXPERT_COUNTS.isdisjoint(state) and EXPERT_COUNTS.isdisjoint(state.get("_modules", ())) \
        and EXPERT_COUNTS.isdisjoint(state.get("_parameters", ())) and EXPERT_COUNTS.isdisjoint(state.get("_buffers", ()))


def class_answers(kind: type, name: str) -> bool:
    """Whether ``getattr`` on a module of class ``kind`` may find ``name`` outside the module's
    ``__dict__`` and its parameter/buffer/child tables: its own ``__getattr__``, a class attribute."""
    return kind.__getattr__ is not _MODULE_GETATTR or hasattr(kind, name)  # type: ignore[attr-defined]


def _declared(module: nn.Module, name: str, looked: Dict[Tuple[type, str], bool]) -> Any:
    """``getattr(module, name, None)`` without the AttributeError nn.Module raises for a name
    it does not hold (one per module per name: a third of the parameter summary's time).
    ``looked``: (class, name) -> whether the class may answer (its own ``__getattr__``, a class
    attribute or property), for this walk."""
    state = vars(module)
    if name in state:
        return state[name]
    kind = type(module)
    answers = looked.get((kind, name))
    if answers is None:
        answers = looked[kind, name] = class_answers(kind, name)
    if answers or name in state.get("_modules", ()) or name in state.get("_parameters", ()) \
            or name in state.get("_buffers", ()):
        return getattr(module, name, None)
    return None


def _active(
    model: nn.Module, modules: Optional[Sequence[Tuple[str, nn.Module]]], experts_per_token: Optional[int]
) -> Optional[int]:
    blocks = list(routed_experts(model, modules))
    if not blocks:
        return None
    k = experts_per_token or config_value(model, TOP_K_KEYS)
    if k is None:
        return None
    seen = set()
    inactive = 0
    for _, count, params in blocks:
        size = 0
        for param in params:
            if id(param) not in seen:
                seen.add(id(param))
                size += param.numel()
        inactive += size * max(count - k, 0) // count
    total = sum(p.numel() for p in model.parameters())
    return total - inactive


def lookup_tables(model: nn.Module) -> FrozenSet[int]:
    """The ids of the parameters held only by ``nn.Embedding``/``nn.EmbeddingBag`` modules: tables
    a forward reads the rows it gathers from. A table that is also another module's weight (a
    tied LM head) is read whole by that module, so it is not one."""
    only: Dict[int, bool] = {}
    for module in model.modules():
        lookup = isinstance(module, (nn.Embedding, nn.EmbeddingBag))
        for tensor in module.parameters(recurse=False):
            only[id(tensor)] = only.get(id(tensor), True) and lookup
    return frozenset(key for key, yes in only.items() if yes)


def _unique(tensors: Iterable[Optional[torch.Tensor]]) -> Iterator[torch.Tensor]:
    """Each tensor once, in order (``model.parameters()``'s rule for shared tensors)."""
    seen = set()
    for tensor in tensors:
        if tensor is not None and id(tensor) not in seen:
            seen.add(id(tensor))
            yield tensor
