"""What a count needs to know about the model, read once per call and handed down:
module names (canonical and aliases), the parameters each module holds, the tensors it
owns, whether lazy or packed-quantized modules are present, and the parameter summary.

One walk of the module tree (``named_modules(remove_duplicate=False)``) gives the
names, aliases, state tensors and per-module parameter counts; the summary is read on
first use (``summarize_parameters``). Tracers that run a copy of the model (fake twins)
map these names onto the copy rather than walking it again.
"""

from __future__ import annotations

import dataclasses
from functools import cached_property
from typing import Any, Dict, List, Mapping, Optional, Set, Tuple

import torch
from torch import nn

from flopcount.core.inputs import is_uninitialized
from flopcount.core.packed import held_tensors
from flopcount.core.params import summary_of
from flopcount.core.results import ModuleInfo
from flopcount.types import ParamSummary

__all__ = ["ModelFacts", "model_facts"]

ScriptObject = torch.ScriptObject
_SPECIAL = (ScriptObject, torch.Tensor)


@dataclasses.dataclass(frozen=True, eq=False)
class ModelFacts:
    """The facts of one model, as :func:`model_facts` reads them.

    ``modules``: ``(name, module)`` in ``named_modules()`` order, each module once under
    its canonical (first) name; ``names`` maps each module back to it. ``aliases``:
    canonical name -> every name of a module reachable under several. ``owned``: name ->
    parameters of the module and its children, each tensor once. ``parameters`` and
    ``buffers``: each tensor once, in ``model.parameters()`` / ``buffers()`` order.
    ``lazy``: a lazy module is not materialised yet. ``packed``: the name of the first
    module holding packed quantized weights, or None."""

    model: nn.Module
    modules: Tuple[Tuple[str, nn.Module], ...]
    aliases: Mapping[str, Tuple[str, ...]]
    owned: Mapping[str, int]
    parameters: Tuple[torch.Tensor, ...]
    buffers: Tuple[torch.Tensor, ...]
    lazy: bool
    packed: Optional[str]
    #: (module name, module, packed ScriptObject) for each packed-params object, as
    #: :func:`flopcount.core.packed.packed_objects` lists them
    packed_objects: Tuple[Tuple[str, nn.Module, Any], ...] = ()
    #: (label, tensor) for each tensor a module keeps as a plain attribute (rotary caches,
    #: masks), in ``modules`` order: what a fake copy fakes besides parameters and buffers
    tensor_attributes: Tuple[Tuple[str, torch.Tensor], ...] = ()

    @cached_property
    def names(self) -> Mapping[nn.Module, str]:
        """Each module's canonical name (module trackers look modules up by object)."""
        return {module: name for name, module in self.modules}

    @cached_property
    def summary(self) -> ParamSummary:
        """The parameter summary (:func:`flopcount.summarize_parameters`), read once."""
        return summary_of(
            self.model, self.modules, parameters=self.parameters, buffers=self.buffers, packed=self.packed_objects
        )

    def module_infos(self, calls: Mapping[str, int]) -> List[ModuleInfo]:
        """Each module with its type, depth, ``calls`` (from a trace) and parameters."""
        infos = []
        for name, module in self.modules:
            depth = 0 if not name else name.count(".") + 1
            infos.append(ModuleInfo(name, type(module).__name__, depth, calls.get(name, 0), self.owned.get(name, 0)))
        return infos

    def names_on(self, twins: Mapping[int, object]) -> Dict[nn.Module, str]:
        """The canonical names on a copy of the tree, ``twins`` mapping ``id(original)`` to
        its copy (a copier's memo); a module without a twin keeps its own object."""
        found: Dict[nn.Module, str] = {}
        for name, module in self.modules:
            twin = twins.get(id(module), module)
            if isinstance(twin, nn.Module):
                found.setdefault(twin, name)
        return found


def model_facts(model: nn.Module) -> ModelFacts:
    """Read :class:`ModelFacts` from ``model`` in one walk of its module tree."""
    every: Dict[int, List[str]] = {}
    modules: List[Tuple[str, nn.Module]] = []
    parameters: Dict[int, torch.Tensor] = {}
    buffers: Dict[int, torch.Tensor] = {}
    owned: Dict[str, int] = {}
    counted: Dict[int, Any] = {}
    chains: Dict[str, List[str]] = {"": [""]}  # a module's name -> it and its prefixes ("" first)
    packed: List[Tuple[str, nn.Module, Any]] = []
    seen_packed: Set[int] = set()
    plain: Set[type] = set()  # types of attribute values that are neither ScriptObjects nor tensors
    attributes: List[Tuple[str, torch.Tensor]] = []
    lazy = False
    for name, module in model.named_modules(remove_duplicate=False):
        state = vars(module)
        own = state["_parameters"]
        chain = chains.get(name)
        if chain is None:  # its parent came first (named_modules' order)
            chain = chains[name] = chains[name.rpartition(".")[0]] + [name]
        if own:
            _count_owned(chain, own, owned, counted)  # under every name: each parent counts its children
        known = every.get(id(module))
        if known is not None:
            known.append(name)
            continue
        every[id(module)] = [name]
        modules.append((name, module))
        for table, found in ((own, parameters), (state["_buffers"], buffers)):
            for tensor in table.values():
                if tensor is not None:
                    found.setdefault(id(tensor), tensor)
                    lazy = lazy or is_uninitialized(tensor)
        # packed quantized weights (core.packed.packed_objects) and tensors kept as plain
        # attributes, in the same walk: the types a module's attributes hold, each type tested
        # once (an isinstance per attribute cost more than the rest of the walk)
        kinds = set(map(type, state.values()))
        kinds -= plain
        if not kinds:
            continue
        if not any(issubclass(kind, _SPECIAL) for kind in kinds):
            plain |= kinds
            continue
        for key, value in state.items():
            if isinstance(value, ScriptObject) and id(value) not in seen_packed and held_tensors(module, value):
                seen_packed.add(id(value))
                packed.append((name, module, value))
            elif isinstance(value, torch.Tensor):
                attributes.append((f"tensor attribute {key} of module '{name}'", value))
    aliases = {found[0]: tuple(found) for found in every.values() if len(found) > 1}
    return ModelFacts(
        model,
        tuple(modules),
        aliases,
        owned,
        tuple(parameters.values()),
        tuple(buffers.values()),
        lazy,
        packed[0][0] if packed else None,
        tuple(packed),
        tuple(attributes),
    )


def _count_owned(
    chain: List[str], own: Mapping[str, Optional[torch.Tensor]], owned: Dict[str, int], counted: Dict[int, Any]
) -> None:
    """Add a module's own parameters (``own``) to ``owned`` under each name of ``chain`` (its
    name and every prefix of it), a tensor once per name (tied weights); lazy parameters (size
    unknown) are left out. ``counted``: id(tensor) -> the chain it was first counted under, or
    (met again: a tie, or a module under several names) the set of names it was counted under."""
    for tensor in own.values():
        if tensor is None or is_uninitialized(tensor):
            continue
        earlier = counted.get(id(tensor))
        if earlier is None:  # the common case: first met, so counted under no name yet
            counted[id(tensor)] = chain
            size = tensor.numel()
            for name in chain:
                owned[name] = owned.get(name, 0) + size
            continue
        if type(earlier) is list:
            earlier = counted[id(tensor)] = set(earlier)
        size = -1
        for name in chain:
            if name not in earlier:
                earlier.add(name)
                if size < 0:
                    size = tensor.numel()
                owned[name] = owned.get(name, 0) + size
