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
import itertools
from collections.abc import Sequence
from functools import cached_property
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional, Set, Tuple, Union, overload

import torch
from torch import nn

from flopcount.core.inputs import is_uninitialized
from flopcount.core.packed import held_tensors
from flopcount.core.params import counts_no_experts, summary_of
from flopcount.core.results import ModuleInfo
from flopcount.types import ParamSummary

__all__ = ["ModelFacts", "model_facts"]

ScriptObject = torch.ScriptObject
_SPECIAL = (ScriptObject, torch.Tensor)


class ModulePairs(Sequence[Tuple[str, nn.Module]]):
    """``(name, module)`` of each module, in ``named_modules()`` order, held as the one dictionary
    module -> name that the tracers read (:attr:`ModelFacts.names`): a pair is made when one is
    read (iterating makes none that outlives its step). Not a pair per module (issue #32: ~0.7 KiB
    per LLaMA layer), nor a tuple of names and one of modules beside that dictionary (16 B per
    module, 208 B per LLaMA layer, alive through the count: branch countmem3)."""

    __slots__ = ("by_module",)

    def __init__(self, by_module: Dict[nn.Module, str]):
        self.by_module = by_module

    def __len__(self) -> int:
        return len(self.by_module)

    @overload
    def __getitem__(self, i: int) -> Tuple[str, nn.Module]: ...

    @overload
    def __getitem__(self, i: slice) -> Tuple[Tuple[str, nn.Module], ...]: ...

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return tuple(self)[i]
        count = len(self.by_module)
        at = i + count if i < 0 else i
        if not 0 <= at < count:
            raise IndexError("module index out of range")
        return next(itertools.islice(iter(self), at, None))

    def __iter__(self) -> Iterator[Tuple[str, nn.Module]]:
        return zip(self.by_module.values(), self.by_module.keys())

    def __reversed__(self) -> Iterator[Tuple[str, nn.Module]]:
        return zip(reversed(self.by_module.values()), reversed(self.by_module.keys()))


def _class_name(module: nn.Module, script_classes: bool) -> str:
    """The class a module row shows: a TorchScript module's original class where ``script_classes``."""
    if script_classes and isinstance(module, torch.jit.ScriptModule):
        original = getattr(module, "original_name", None)
        if isinstance(original, str) and original:
            return original
    return type(module).__name__


@dataclasses.dataclass(frozen=True, eq=False)
class ModelFacts:
    """The facts of one model, as :func:`model_facts` reads them.

    ``modules``: ``(name, module)`` in ``named_modules()`` order, each module once under
    its canonical (first) name; ``names`` maps each module back to it. ``aliases``:
    canonical name -> every name of a module reachable under several. ``owned`` (read after
    the trace): name -> parameters of the module and its children, each tensor once. ``parameters`` and
    ``buffers``: each tensor once, in ``model.parameters()`` / ``buffers()`` order.
    ``lazy``: a lazy module is not materialised yet. ``packed``: the name of the first
    module holding packed quantized weights, or None."""

    model: nn.Module
    modules: Sequence[Tuple[str, nn.Module]]
    aliases: Mapping[str, Tuple[str, ...]]
    #: each module's own parameter elements, in ``modules`` order (equal sizes one int object),
    #: rolled up into ``owned`` when first read; or, for a model with ties or a module under
    #: several names, ``owned`` itself (each tensor once per name)
    sizes: Union[Tuple[int, ...], Mapping[str, int]]
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
    #: the indices in ``modules`` of the modules that may hold routed experts
    #: (:func:`flopcount.core.params.routed_experts` looks at these only)
    experts: Tuple[int, ...] = ()

    @cached_property
    def owned(self) -> Mapping[str, int]:
        """Name -> parameter elements of the module and its children, each tensor once; lazy
        parameters left out. Without ties or aliases (``sizes`` per module) each module's own
        sizes are summed up the tree, children before parents (``modules`` is in pre-order)."""
        sizes = self.sizes
        if not isinstance(sizes, tuple):
            return sizes
        totals: Dict[str, int] = {}
        for (name, _), size in zip(reversed(self.modules), reversed(sizes)):
            total = totals.pop(name, 0) + size
            if total:
                totals[name] = total
                if name:
                    parent = name.rpartition(".")[0]
                    totals[parent] = totals.get(parent, 0) + total
        # equal totals one int object (a deep model's layers hold the same: ~0.3 KiB per LLaMA layer)
        same: Dict[int, int] = {}
        return {name: same.setdefault(totals[name], totals[name]) for name, _ in self.modules if name in totals}

    @cached_property
    def names(self) -> Mapping[nn.Module, str]:
        """Each module's canonical name (module trackers look modules up by object)."""
        if isinstance(self.modules, ModulePairs):
            return self.modules.by_module  # the same dictionary: ``modules`` is read through it
        return {module: name for name, module in self.modules}

    @cached_property
    def summary(self) -> ParamSummary:
        """The parameter summary (:func:`flopcount.summarize_parameters`), read once."""
        wanted = set(self.experts)  # indices in walk order: one pass (indexing ModulePairs walks it)
        return summary_of(
            self.model, self.modules, parameters=self.parameters, buffers=self.buffers, packed=self.packed_objects,
            experts=[pair for index, pair in enumerate(self.modules) if index in wanted],
        )

    def module_infos(self, calls: Mapping[str, int], *, script_classes: bool = False) -> List[ModuleInfo]:
        """Each module with its type, depth, ``calls`` (from a trace) and parameters.

        ``script_classes``: the trace booked a TorchScript program's ops per layer (read from its
        graph), so its modules are named by their original class (TorchScript's ``original_name``:
        ``Linear``, not ``RecursiveScriptModule``); otherwise a TorchScript module keeps the class
        it has in Python, which tells the diff its submodules ran unseen (diffs/compute.py)."""
        owned, get = self.owned, calls.get
        infos = []
        for name, module in self.modules:
            depth = name.count(".") + 1 if name else 0
            infos.append(ModuleInfo(name, _class_name(module, script_classes), depth, get(name, 0), owned.get(name, 0)))
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
    # id(module) -> its first name, or (a module met under several names) the list of them: no list
    # per module while the walk lasts (issue #32: ~0.9 KiB per LLaMA layer at the facts' peak)
    every: Dict[int, Union[str, List[str]]] = {}
    # each module once, under its first name (``modules``), in walk order; None when two of them
    # compare equal (``modules`` is then a tuple of pairs)
    by_module: Optional[Dict[nn.Module, str]] = {}
    distinct = 0  # modules met so far, each once
    parameters: Dict[int, torch.Tensor] = {}
    buffers: Dict[int, torch.Tensor] = {}
    sizes: List[int] = []  # each module's own parameter elements, in ``modules`` order
    interned: Dict[int, int] = {}  # size -> one int object for every module of that size
    met = 0  # parameter entries met (a tie: fewer distinct tensors)
    packed: List[Tuple[str, nn.Module, Any]] = []
    seen_packed: Set[int] = set()
    plain: Set[type] = set()  # types of attribute values that are neither ScriptObjects nor tensors
    attributes: List[Tuple[str, torch.Tensor]] = []
    experts: List[int] = []
    quiet: Dict[type, bool] = {}  # class -> it answers neither expert-count name (params.counts_no_experts)
    lazy = False
    # every name of the walk, kept for the exact ``owned`` (ties, aliases): two lists of references,
    # not the walk's pair per module
    walked_names: List[str] = []
    walked: List[nn.Module] = []
    for name, module in model.named_modules(remove_duplicate=False):
        walked_names.append(name)
        walked.append(module)
        known = every.get(id(module))
        if known is not None:
            if isinstance(known, str):
                every[id(module)] = [known, name]
            else:
                known.append(name)
            continue
        every[id(module)] = name
        if by_module is not None:
            if module in by_module:  # another module equal to this one (a class comparing by value)
                by_module = None
            else:
                by_module[module] = name
        state = vars(module)
        try:
            own, own_buffers = state["_parameters"], state["_buffers"]
        except KeyError:  # a torch.jit.trace-d module keeps them behind properties, not in its __dict__
            own, own_buffers = module._parameters, module._buffers
        size = 0
        for tensor in own.values():
            if tensor is not None:
                met += 1
                parameters.setdefault(id(tensor), tensor)
                if is_uninitialized(tensor):
                    lazy = True
                else:
                    size += tensor.numel()
        sizes.append(interned.setdefault(size, size))
        for tensor in own_buffers.values():
            if tensor is not None:
                buffers.setdefault(id(tensor), tensor)
                lazy = lazy or is_uninitialized(tensor)
        if not counts_no_experts(module, quiet) or (isinstance(module, nn.ModuleList) and name.rpartition(".")[2].endswith("experts")):
            experts.append(distinct)
        distinct += 1
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
    aliases = {found[0]: tuple(found) for found in every.values() if isinstance(found, list)}
    # a tie or a module under several names: each name counts a tensor once (the exact walk)
    owned: Union[Tuple[int, ...], Mapping[str, int]] = (
        _owned(zip(walked_names, walked)) if aliases or met > len(parameters) else tuple(sizes)
    )
    modules: Sequence[Tuple[str, nn.Module]]
    if by_module is not None:
        modules = ModulePairs(by_module)
    else:
        first: Dict[int, Tuple[str, nn.Module]] = {}
        for name, module in zip(walked_names, walked):
            first.setdefault(id(module), (name, module))
        modules = tuple(first.values())
    return ModelFacts(
        model,
        modules,
        aliases,
        owned,
        tuple(parameters.values()),
        tuple(buffers.values()),
        lazy,
        packed[0][0] if packed else None,
        tuple(packed),
        tuple(attributes),
        tuple(experts),
    )


def _owned(walked: Iterable[Tuple[str, nn.Module]]) -> Dict[str, int]:
    """:attr:`ModelFacts.owned` of a model with ties or a module under several names: every
    name of every module (``walked``: ``named_modules(remove_duplicate=False)``) with the
    parameters of its subtree, a tensor once per name."""
    owned: Dict[str, int] = {}
    counted: Dict[int, Any] = {}
    chains: Dict[str, List[str]] = {"": [""]}  # a module's name -> it and its prefixes ("" first)
    for name, module in walked:
        chain = chains.get(name)
        if chain is None:  # its parent came first (named_modules' order)
            chain = chains[name] = chains[name.rpartition(".")[0]] + [name]
        own = module._parameters
        if own:
            _count_owned(chain, own, owned, counted)  # under every name: each parent counts its children
    return owned


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
