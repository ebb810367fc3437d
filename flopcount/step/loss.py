"""The one default loss of a training step, shared by every reading that runs a backward.

Rule: when the model returns a loss (an output with a ``loss`` attribute or key holding a
tensor that requires grad: a Hugging Face ``ModelOutput`` of a model called with ``labels``,
a ``{"loss": ...}`` dict), the backward differentiates that loss only; otherwise it
differentiates the sum of every floating (or complex) output that requires grad. A
``loss_fn`` given by the caller replaces the rule. ``count_flops(backward=True)``,
``estimate_memory``, ``plan``, ``profile`` and the trainer callbacks all use it
(docs/conventions.md, "The default loss").
"""

from __future__ import annotations

from typing import Any, Callable, List, Mapping, Optional, Sequence

import torch

from flopcount.core.inputs import output_tensors
from flopcount.errors import UsageError
from flopcount.types import dtype_name

__all__ = ["backward_roots", "default_loss", "differentiable", "needs_backward", "unique_tensors"]

LossFn = Callable[[Any], Any]


def needs_backward(backward: bool, loss_fn: Optional[LossFn], optimizer: Any = None) -> None:
    """A ``loss_fn`` or an ``optimizer`` given without ``backward=True`` is a :class:`UsageError`:
    each acts on the backward pass."""
    if loss_fn is not None and not backward:
        raise UsageError("loss_fn is only used with backward=True")
    if optimizer is not None and not backward:
        raise UsageError("optimizer= needs backward=True: the step updates parameters from their gradients")


def differentiable(tensors: List[torch.Tensor]) -> List[torch.Tensor]:
    """The tensors a backward can start from or reach: floating or complex, requiring grad."""
    return [t for t in tensors if t.requires_grad and (t.is_floating_point() or t.is_complex())]


def unique_tensors(tensors: Sequence[torch.Tensor]) -> List[torch.Tensor]:
    """``tensors`` in order, each object once (a parameter also passed as an input, a tied weight)."""
    return list({id(tensor): tensor for tensor in tensors}.values())


def backward_roots(outputs: Any, loss_fn: Optional[LossFn] = None) -> List[torch.Tensor]:
    """The tensors whose sum the step differentiates: ``loss_fn(outputs)``'s, else the
    returned loss (``outputs.loss`` or ``outputs["loss"]``, if it requires grad), else every
    differentiable output (possibly none: the caller says why)."""
    if loss_fn is not None:
        roots = output_tensors(loss_fn(outputs))
        if not roots:
            raise UsageError("loss_fn must return a tensor (or tensors) to differentiate")
        return differentiable(roots)
    loss = None if isinstance(outputs, torch.Tensor) else outputs.get("loss") if isinstance(outputs, Mapping) else getattr(outputs, "loss", None)
    return [loss] if isinstance(loss, torch.Tensor) and loss.requires_grad else differentiable(output_tensors(outputs))


def nothing_to_differentiate(outputs: Any, roots: Sequence[torch.Tensor], leaves: Sequence[torch.Tensor]) -> Optional[str]:
    """Why a backward pass has nothing to do, or None: no parameter or input requires grad
    (no ``leaves``), or the forward returned no floating tensor that depends on one (no ``roots``)."""
    if not leaves:
        return "backward=True but nothing requires grad: no parameter or input has requires_grad=True"
    if roots:
        return None
    if outputs is None:
        returned = "None"
    elif isinstance(outputs, torch.Tensor):
        returned = f"a tensor of {dtype_name(outputs.dtype)}"
    else:
        returned = f"a {type(outputs).__name__}"
    return (f"backward=True but the forward returned {returned}, no floating tensor that depends on a parameter "
            "or input: nothing to differentiate (in Python, loss_fn= says what the loss is)")


def default_loss(outputs: Any) -> torch.Tensor:
    """The default loss as one tensor to call ``backward()`` on: the returned loss (summed if
    it is not a scalar), else the sum of every differentiable output."""
    roots = backward_roots(outputs)
    if not roots:
        raise UsageError("none of the model's outputs requires grad: nothing to differentiate (pass loss_fn=)")
    total = roots[0] if roots[0].numel() == 1 and len(roots) == 1 else roots[0].sum()
    for extra in roots[1:]:
        total = total + extra.sum()
    return total
