"""Static sizes for the few torch functions that cannot be traced with jit's traced sizes.

While jit traces, ``tensor.size()`` gives 0-d tensors (so the graph can replay other
shapes). ``F.max_unpool1d/2d/3d`` compute their default output size from those and pass
it to ``torch._check_value``, which refuses a tensor condition: tracing any ``MaxUnpool``
fails inside torch. :class:`StaticUnpoolSizes`, a pass-through TorchFunctionMode used
only by the jit tracer, computes that default size from the input's static shape
(torch's formula: ``(in - 1) * stride + kernel - 2 * padding`` per pooled dim) and hands
it over as ``output_size``; the trace is the same graph with the size as a constant.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

__all__ = ["StaticUnpoolSizes"]

_UNPOOL: Dict[Callable[..., Any], int] = {F.max_unpool1d: 1, F.max_unpool2d: 2, F.max_unpool3d: 3}
_SIGNATURES = {func: inspect.signature(func) for func in _UNPOOL}


def _expand(value: Any, dims: int) -> Tuple[int, ...]:
    if isinstance(value, int):
        return (value,) * dims
    values = tuple(int(v) for v in value)
    return values * dims if len(values) == 1 else values


def _static_shape(tensor: torch.Tensor) -> Optional[Tuple[int, ...]]:
    """The tensor's sizes as ints, read with tracing paused (so no size op is recorded);
    None if this torch lacks the private switch."""
    get, put = getattr(torch._C, "_get_tracing_state", None), getattr(torch._C, "_set_tracing_state", None)
    if get is None or put is None:
        return None
    state = get()
    put(None)
    try:
        return tuple(int(s) for s in tensor.shape)
    finally:
        put(state)


def default_unpool_size(
    shape: Sequence[int], dims: int, kernel_size: Any, stride: Any, padding: Any
) -> Optional[Tuple[int, ...]]:
    """The output size ``F.max_unpool{dims}d`` takes when none is given (None when the
    arguments do not describe ``dims`` pooled dimensions: torch then reports the error)."""
    kernel = _expand(kernel_size, dims)
    strides = kernel if stride is None else _expand(stride, dims)
    pads = _expand(padding, dims)
    if not (len(kernel) == len(strides) == len(pads) == dims) or len(shape) < dims:
        return None
    spatial = shape[len(shape) - dims :]
    return tuple((n - 1) * s + k - 2 * p for n, s, k, p in zip(spatial, strides, kernel, pads))


class StaticUnpoolSizes(TorchFunctionMode):
    """Passes every call through; a ``F.max_unpool*d`` call without ``output_size`` made
    while jit traces gets its default output size as ints."""

    def __torch_function__(self, func: Any, types: Any, args: Tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        dims = _UNPOOL.get(func)
        if dims is None or not torch.jit.is_tracing():
            return func(*args, **kwargs)
        try:
            bound = _SIGNATURES[func].bind(*args, **kwargs)
        except TypeError:
            return func(*args, **kwargs)
        bound.apply_defaults()
        given = bound.arguments
        x = given["input"]
        if given["output_size"] is not None or not isinstance(x, torch.Tensor):
            return func(*args, **kwargs)
        shape = _static_shape(x)
        size = None if shape is None else default_unpool_size(shape, dims, given["kernel_size"], given["stride"], given["padding"])
        if size is None:
            return func(*args, **kwargs)
        given["output_size"] = list(size)
        return func(*bound.args, **bound.kwargs)
