"""The count behind the trainer callbacks: one fake count per distinct batch shape, then a
dictionary lookup per step.

A *signature* is what a count depends on: the shape and dtype of every tensor in the
call, and the value of every flag-like argument (bool, str, None). Numbers are treated as
data (``num_items_in_batch`` changes every step and changes no FLOPs). A training
signature is counted with ``count_flops(..., backward=True)`` on fake copies; the
optimizer step is counted once per optimizer (its cost does not depend on the batch).

The count runs on a *twin* of the model (:func:`hookless_twin`): the same module tree
sharing the same parameters and buffers, without the user's forward and backward hooks, so
counting never calls them (neither on fake copies nor in a real fallback run).
"""

from __future__ import annotations

import copy
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Dict, Hashable, List, Mapping, Optional, Sequence, Tuple

import torch
from torch import nn

from flopcount.bench.peak import has_frozen
from flopcount.core.analysis import uncompiled
from flopcount.core.hooks import call_hook_dicts
from flopcount.counting.count import count_flops
from flopcount.errors import FlopcountWarning

Signature = Tuple[Hashable, ...]
LossFn = Callable[[Any], Any]

__all__ = ["PassCost", "Signature", "StepCounter", "batch_signature", "hookless_twin"]

_FLAGS = (bool, str, type(None))


def hookless_twin(model: nn.Module) -> nn.Module:
    """A shallow copy of ``model``'s module tree without per-module forward/backward hooks:
    each module copied once (a module reached under two names stays one module), sharing
    the original's parameters, buffers and every other attribute; the original is not
    touched. Process-wide hooks (``register_module_forward_hook``) and hooks on parameters
    still apply: they are not the model's."""
    twins: Dict[int, nn.Module] = {}

    def twin(module: nn.Module) -> nn.Module:
        found = twins.get(id(module))
        if found is not None:
            return found
        clone = copy.copy(module)  # nn.Module.__setstate__: a new object over a copy of __dict__
        twins[id(module)] = clone
        state = vars(clone)
        state["_parameters"] = dict(module._parameters)
        state["_buffers"] = dict(module._buffers)
        for name, hooks in call_hook_dicts(clone).items():  # the dictionaries a forward or backward calls
            state[name] = type(hooks)()
        state["_modules"] = {name: None if child is None else twin(child) for name, child in module._modules.items()}
        return clone

    return twin(model)


def batch_signature(args: Sequence[Any], kwargs: Mapping[str, Any]) -> Signature:
    """Shapes and dtypes of the tensors in a call, the values of its flags, the types of
    anything else: equal signatures give equal counts."""
    parts: List[Hashable] = []
    _walk(args, parts)
    for key in kwargs:
        parts.append(key)
        _walk(kwargs[key], parts)
    return tuple(parts)


def _walk(value: Any, parts: List[Hashable]) -> None:
    if isinstance(value, torch.Tensor):
        parts.append((tuple(value.shape), value.dtype))
    elif isinstance(value, _FLAGS):
        parts.append(value)
    elif isinstance(value, Mapping):
        parts.append(len(value))
        for key in value:
            parts.append(key)
            _walk(value[key], parts)
    elif isinstance(value, (list, tuple)):
        parts.append(len(value))
        for item in value:
            _walk(item, parts)
    else:
        parts.append(type(value).__name__)


@dataclass(frozen=True)
class PassCost:
    """FLOPs of one micro-batch: its forward and the backward of its loss."""

    forward: int
    backward: int
    forward_macs: int
    #: a floating parameter of the model did not require grad (MFU's model FLOPs: bench.peak.model_flops)
    frozen: bool = False

    @property
    def flops(self) -> int:
        return self.forward + self.backward


class StepCounter:
    """Caches of counts by signature: training passes, evaluation forwards, optimizer steps.

    ``loss_fn`` picks the loss out of the model's outputs for the backward (None: the
    step's default loss, :mod:`flopcount.step.loss`, the one ``count_flops``, ``plan`` and
    ``estimate_memory`` use: the loss the model returns, else the sum of its outputs). A count that
    fails is remembered as ``None`` (never retried for that signature) and reported once
    with a :class:`FlopcountWarning`; the training run itself is never interrupted.
    Counts run on :func:`hookless_twin` of the model, so the user's hooks (and the
    callbacks' own recorders) are not replayed; ``busy`` is True while a count runs, for
    process-wide recorders.
    """

    def __init__(self, loss_fn: Optional[LossFn] = None):
        self.loss_fn = loss_fn
        self.train: Dict[Signature, Optional[PassCost]] = {}
        self.eval: Dict[Signature, Optional[int]] = {}
        self.optimizer: Dict[int, Optional[int]] = {}
        self.failures: List[str] = []
        self.busy = False

    def count_train(
        self, sig: Signature, model: nn.Module, args: Sequence[Any], kwargs: Mapping[str, Any], optimizer: Any = None
    ) -> Optional[PassCost]:
        """The forward + backward cost of ``sig`` (counted now if new); the optimizer's
        step is counted in the same run the first time ``optimizer`` is seen."""
        if sig in self.train and (optimizer is None or id(optimizer) in self.optimizer):
            return self.train[sig]
        with_optimizer = optimizer is not None and id(optimizer) not in self.optimizer
        options = {"backward": True, "loss_fn": self.loss_fn, "optimizer": optimizer if with_optimizer else None}
        result = self._count(model, args, kwargs, options, "training step")  # None: it failed
        phases = {} if result is None else result.by_phase()
        cost = None if result is None else PassCost(phases.get("forward", 0), phases.get("backward", 0),
                                                    result.by_phase("macs").get("forward", 0), has_frozen(model))
        self.train[sig] = cost
        if with_optimizer:
            self.optimizer[id(optimizer)] = None if result is None else phases.get("optimizer", 0)
        return cost

    def count_eval(self, sig: Signature, model: nn.Module, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Optional[int]:
        """Forward FLOPs of an evaluation call with signature ``sig`` (counted now if new)."""
        if sig not in self.eval:
            result = self._count(model, args, kwargs, {}, "evaluation forward")
            self.eval[sig] = None if result is None else result.flops
        return self.eval[sig]

    def optimizer_flops(self, optimizer: Any) -> Optional[int]:
        """The optimizer step's FLOPs, once counted (``None`` before, or if it failed)."""
        return self.optimizer.get(id(optimizer)) if optimizer is not None else 0

    def _count(self, model: nn.Module, args: Sequence[Any], kwargs: Mapping[str, Any], options: Dict[str, Any], what: str) -> Any:
        self.busy = True
        try:
            return count_flops(hookless_twin(uncompiled(model)), tuple(args), kwargs=dict(kwargs), **options)
        except Exception as exc:  # a failed count must never stop training
            reason = f"flopcount could not count this {what}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            self.failures.append(reason)
            warnings.warn(reason + "; its FLOPs are not logged", FlopcountWarning, stacklevel=3)
            return None
        finally:
            self.busy = False
