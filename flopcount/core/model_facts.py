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
from typing import Dict, List, Mapping, Optional, Tuple

import torch
from torch import nn

from flopcount.core.inputs import is_uninitialized
from flopcount.core.packed import packed_objects
from flopcount.core.params import summary_of
from flopcount.core.results import ModuleInfo
from flopcount.types import ParamSummary

__all__ = ["ModelFacts", "model_facts"]


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

    @cached_property
    def names(self) -> Mapping[nn.Module, str]:
        """Each module's canonical name (module trackers look modules up by object)."""
        return {module: name for name, module in self.modules}

    @cached_property
    def summary(self) -> ParamSummary:
        """The parameter summary (:func:`flopcount.summarize_parameters`), read once."""
        return summary_of(self.model, self.modules)

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
    counted: set = set()
    lazy = False
    for name, module in model.named_modules(remove_duplicate=False):
        _count_owned(name, module, owned, counted)  # under every name: each parent counts its children
        known = every.get(id(module))
        if known is not None:
            known.append(name)
            continue
        every[id(module)] = [name]
        modules.append((name, module))
        for table, found in ((module._parameters, parameters), (module._buffers, buffers)):
            for tensor in table.values():
                if tensor is not None:
                    found.setdefault(id(tensor), tensor)
                    lazy = lazy or is_uninitialized(tensor)
    first_packed = next(packed_objects(model, modules), None)
    aliases = {found[0]: tuple(found) for found in every.values() if len(found) > 1}
    return ModelFacts(
        model,
        tuple(modules),
        aliases,
        owned,
        tuple(parameters.values()),
        tuple(buffers.values()),
        lazy,
        None if first_packed is None else first_packed[0],
    )


def _count_owned(name: str, module: nn.Module, owned: Dict[str, int], counted: set) -> None:
    """Add ``module``'s own parameters to ``owned`` under ``name`` and each of its prefixes,
    a tensor once per module (tied weights); lazy parameters (size unknown) are left out."""
    parts = name.split(".") if name else []
    for tensor in module._parameters.values():
        if tensor is None or is_uninitialized(tensor):
            continue
        for end in range(len(parts) + 1):
            key = (".".join(parts[:end]), id(tensor))
            if key not in counted:
                counted.add(key)
                owned[key[0]] = owned.get(key[0], 0) + tensor.numel()

