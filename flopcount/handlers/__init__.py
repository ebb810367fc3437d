"""Built-in cost handlers, grouped by op family; ``build_default_registry`` assembles them.

Conventions (docs/conventions.md): 1 MAC = 2 FLOPs; MACs count contractions only;
bias adds fused into linear/addmm/conv are not counted.
"""

from __future__ import annotations

from typing import Callable, Iterable, Optional, Union

from flopcount.core.registry import HandlerRegistry
from flopcount.handlers import (
    attention,
    conv,
    fft,
    indexing,
    linalg,
    loss,
    matmul,
    norm,
    optim,
    pointwise,
    pool,
    quantized,
    reduce,
    rnn,
    sampling,
    vision_ops,
    zero_cost,
)
from flopcount.types import Handler

__all__ = ["FAMILIES", "build_default_registry", "default_registry", "register_handler"]

FAMILIES = (
    matmul, conv, attention, norm, pointwise, reduce, pool, loss, indexing, rnn, fft, linalg, sampling, quantized,
    vision_ops, optim, zero_cost,
)


def build_default_registry() -> HandlerRegistry:
    """A fresh registry with every built-in handler and the known-zero list."""
    registry = HandlerRegistry()
    for family in FAMILIES:
        family.register(registry)
    return registry


_DEFAULT: Optional[HandlerRegistry] = None


def default_registry() -> HandlerRegistry:
    """The process-wide registry with every built-in handler (built on first use)."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = build_default_registry()
    return _DEFAULT


def register_handler(
    op: Union[str, Iterable[str]], handler: Optional[Handler] = None, *, replace: bool = False
) -> Union[Handler, Callable[[Handler], Handler]]:
    """Add a handler for a custom op to the default registry (also usable as a decorator).

    Example::

        @flopcount.register_handler("mylib::fused_gelu_linear")
        def _(call):
            x, w = call.tensor("input"), call.tensor("weight")
            return flopcount.Cost.from_macs(x.numel // x.shape[-1] * w.shape[0] * w.shape[1])
    """
    return default_registry().register(op, handler, replace=replace)
