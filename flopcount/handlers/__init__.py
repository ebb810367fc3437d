"""Built-in cost handlers, grouped by op family; ``build_default_registry`` assembles them.

Conventions (docs/conventions.md): 1 MAC = 2 FLOPs; MACs count contractions only;
bias adds fused into linear/addmm/conv are not counted.
"""

from __future__ import annotations

from ..registry import HandlerRegistry
from . import (
    attention,
    conv,
    fft,
    indexing,
    linalg,
    loss,
    matmul,
    norm,
    pointwise,
    pool,
    quantized,
    reduce,
    rnn,
    sampling,
    zero_cost,
)

__all__ = ["build_default_registry", "FAMILIES"]

FAMILIES = (
    matmul, conv, attention, norm, pointwise, reduce, pool, loss, indexing, rnn, fft, linalg, sampling, quantized,
    zero_cost,
)


def build_default_registry() -> HandlerRegistry:
    """A fresh registry with every built-in handler and the known-zero list."""
    registry = HandlerRegistry()
    for family in FAMILIES:
        family.register(registry)
    return registry
