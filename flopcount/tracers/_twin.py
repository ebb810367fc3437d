"""A private twin of the caller's model for the real-run tracers (dispatch and jit on real
tensors), issue #29 item 20.

A real run writes to the module objects it runs: the forward's ``self.x = ...``, train-mode
BatchNorm statistics, flags, hook dictionaries; the tracers then set all of it back. When
another thread is training the same model at that moment, those writes (and the restore)
land under that thread's autograd graph and crash it or corrupt its step. So the real run
uses a twin: every module is a new object of the same class, with its own attribute, hook,
parameter, buffer and submodule dictionaries (lists, tuples and dicts in attributes copied
too; bound methods and ``functools.partial`` objects whose target is one of the model's
modules rebound to its twin, as accelerate's hooks are; a hook handle a module keeps points
at the twin's hook dictionary), while every tensor is shared (no
memory is copied; the tracers run on copies of the buffers, ``preserved_model_state(...,
own_buffers=True)``, so the caller's buffer tensors are never written). Lazy modules get fresh
uninitialised parameters: the caller's stay lazy. Other objects (configs, tokenizers, locks)
are shared, not copied, except what a library's hook wrapper installed as an instance-level
``forward`` holds (diffusers' ``enable_cache``: a partial of a closure over the hook and its
state): that is the twin's own, by the rule the fake copy uses (``TreeCopier.own_forward`` and
``hook_part``; :meth:`_Copier.hook_tensor` for its tensors), so the run writes the twin's hook
state, never the caller's (issue #27 item 5).

Parameters are shared objects (not new ones): an optimizer the caller passes for the step's
count names them, and a forward-only run never writes them (``torch.no_grad()``); what the
real run still writes through them (the rows ``Embedding(max_norm=...)`` renormalises, a
forward that writes its own weights) is the caller's, as in the caller's own forward.

A model whose modules the twin cannot stand for is run as it is (:func:`private_twin` returns
None): TorchScript modules (their C++ object is shared state), ``torch.distributed``
wrappers (DDP, FSDP: their reducer or flat parameters are tied to the original modules). A
``torch.compile``d part is twinned uncompiled: the wrapper's twin calls its child's twin
eagerly and ``Module.compile()``'s compiled call is the twin's own call
(``TreeCopier.own_method``), as the fake copy runs them."""

from __future__ import annotations

import dataclasses
import functools
import types
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from flopcount.core.inputs import is_uninitialized
from flopcount.core.model_facts import ModelFacts
from flopcount.tracers._containers import TreeCopier, fresh_uninitialized

__all__ = ["private_twin"]

#: modules whose state is bound to the original objects: DDP/FSDP (reducer, flat parameters); a
#: torch.compile wrapper's twin runs the module it wraps eagerly (``_containers.EagerWrapper``)
_AS_IS = ("torch.distributed",)


def _twinnable(modules: List[nn.Module]) -> bool:
    return not any(
        isinstance(module, torch.jit.ScriptModule)
        or any(getattr(kind, "__module__", "").startswith(_AS_IS) for kind in type(module).__mro__)
        for module in modules
    )


def private_twin(model: nn.Module, facts: Optional[ModelFacts] = None) -> Optional[Tuple[nn.Module, Optional[ModelFacts]]]:
    """The twin of ``model`` described above and, given ``model``'s facts, the same facts
    read on the twin (no second walk of the tree); None when the model is run as it is."""
    modules = [module for _, module in facts.modules] if facts is not None else list(model.modules())
    if not _twinnable(modules):
        return None
    memo: Dict[int, Any] = {}
    for module in modules:
        for tensor in list(module._parameters.values()) + list(module._buffers.values()):
            if tensor is not None and id(tensor) not in memo:
                memo[id(tensor)] = fresh_uninitialized(tensor) if is_uninitialized(tensor) else tensor
    try:
        twin = _Copier(memo).module(model)
    except Exception:  # an attribute the copier cannot rebuild: the model is run as it is
        return None
    if facts is None:
        return twin, None
    twin_facts = dataclasses.replace(
        facts,
        model=twin,
        modules=tuple((name, memo.get(id(module), module)) for name, module in facts.modules),
        parameters=tuple(memo.get(id(t), t) for t in facts.parameters),
        buffers=tuple(memo.get(id(t), t) for t in facts.buffers),
    )
    return twin, twin_facts


class _Copier(TreeCopier):
    """The twin: tensors shared (they come in ``memo``, or are shared when met in a container);
    other objects shared, but sets copied and what points at a module of the tree rebound to
    its twin (bound methods, ``functools.partial`` objects, hook handles), and a hook wrapper's
    objects the twin's own (:meth:`TreeCopier.own_forward`)."""

    def tensor(self, value: torch.Tensor) -> Any:
        return value  # a tensor attribute: shared, as before (the run's own writes to it are the forward's)

    def other(self, value: Any) -> Any:
        kind = type(value)
        if kind is set:
            return set(value)
        if kind is RemovableHandle:
            # a module keeps the handle of a hook it will remove itself (a lazy module's
            # initialising hook): the twin's handle must remove the twin's hook, not the caller's
            state = value.__getstate__()
            mapped: Any = tuple(
                self.value(item) if isinstance(item, dict) else tuple(self.value(d) for d in item) if isinstance(item, tuple) else item
                for item in state
            )
            handle = object.__new__(RemovableHandle)
            handle.__setstate__(mapped)
            self.memo[id(value)] = handle
            return handle
        if isinstance(value, types.MethodType) and isinstance(value.__self__, nn.Module):
            return types.MethodType(value.__func__, self.value(value.__self__))
        if kind is functools.partial:
            return self.own_forward(value)  # the hook wrapper's rule (_containers.TreeCopier)
        return value

    def hook_tensor(self, value: torch.Tensor) -> Any:
        """A tensor a hook's objects hold that is not a parameter or buffer of the model (those
        are shared: they come in ``memo``), its cached output: a copy, as the run's buffers are
        (``preserved_model_state(own_buffers=True)``), since a hook may update its cache in place
        and the caller's tensor must not be written. It costs the memory of those tensors (a
        cache of activations), not of the model."""
        made = value.detach().clone()
        if value.requires_grad:
            made.requires_grad_()
        self.memo[id(value)] = made
        return made
