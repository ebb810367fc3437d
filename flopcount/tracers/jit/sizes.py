"""Static sizes for the few torch functions that cannot be traced with jit's traced sizes.

While jit traces, ``tensor.size()`` gives 0-d tensors (so the graph can replay other
shapes). ``F.max_unpool1d/2d/3d`` compute their default output size from those and pass
it to ``torch._check_value``, which refuses a tensor condition: tracing any ``MaxUnpool``
fails inside torch. :class:`StaticUnpoolSizes`, a pass-through TorchFunctionMode, computes
that default size from the input's static shape (torch's formula:
``(in - 1) * stride + kernel - 2 * padding`` per pooled dim) and hands it over as
``output_size``; the trace is the same graph with the size as a constant.

:func:`static_unpool_sizes` enters that mode only while an ``nn.MaxUnpool*d`` module runs:
an active TorchFunctionMode makes torch's ``has_torch_function`` checks true, which would
turn off the fused eval paths of ``nn.MultiheadAttention`` and the Transformer layers
that jit records everywhere else. A direct ``F.max_unpool*d`` call outside such a module
still fails under jit (with flopcount's error naming the module); ``tracer="auto"``
counts it.
"""

from __future__ import annotations

import contextlib
import inspect
import warnings
from types import FunctionType
from typing import Any, Callable, Dict, Iterator, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from flopcount.core.diagnostics import first_line, module_place
from flopcount.core.hooks import around_modules
from flopcount.core.rebound import called_function
from flopcount.tracers.jit.functions import frames

__all__ = ["StaticUnpoolSizes", "meta_kernel_failure", "static_unpool_sizes", "unpool_failure"]

_UNPOOL_MODULES = (nn.MaxUnpool1d, nn.MaxUnpool2d, nn.MaxUnpool3d)

_UNPOOL: Dict[Callable[..., Any], int] = {F.max_unpool1d: 1, F.max_unpool2d: 2, F.max_unpool3d: 3}
_SIGNATURES = {func: inspect.signature(func) for func in _UNPOOL}
_UNPOOL_NAMES = frozenset(func.__name__ for func in _UNPOOL)


def _expand(value: Any, dims: int) -> Tuple[int, ...]:
    if isinstance(value, int):
        return (value,) * dims
    values = tuple(int(v) for v in value)
    return values * dims if len(values) == 1 else values


def _static_shape(tensor: torch.Tensor) -> Tuple[int, ...]:
    """The tensor's sizes as ints. While jit traces, turning its traced sizes into ints makes
    them constants of the graph (what the default output size is) and warns that the trace may
    not generalise: that warning is about flopcount's read, not the model's, so it is silenced
    here (torch's public ``TracerWarning``); the graph and the count are those of a read with
    tracing paused (it was read so, through torch's private tracing-state switch, until
    2026-11-27)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        return tuple(int(s) for s in tensor.shape)


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

    def __init__(self) -> None:
        super().__init__()
        self._called: Dict[Any, Any] = {}  # core/rebound.py: a Python function handed -> what it calls

    def __torch_function__(self, func: Any, types: Any, args: Tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if type(func) is FunctionType:  # or a wrapper the caller bound under a torch function's name
            func = called_function(func, self._called)
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
        size = default_unpool_size(_static_shape(x), dims, given["kernel_size"], given["stride"], given["padding"])
        if size is None:
            return func(*args, **kwargs)
        given["output_size"] = list(size)
        return func(*bound.args, **bound.kwargs)


@contextlib.contextmanager
def static_unpool_sizes(model: nn.Module) -> Iterator[None]:
    """While active, each ``nn.MaxUnpool*d`` forward runs inside :class:`StaticUnpoolSizes`
    (process-wide module hooks, removed on exit; nothing is added to the model). A model
    without such a module costs nothing."""
    if not any(isinstance(m, _UNPOOL_MODULES) for m in model.modules()):
        yield
        return

    def enter(module: nn.Module) -> Callable[[], None]:
        mode = StaticUnpoolSizes()
        mode.__enter__()
        return lambda: mode.__exit__(None, None, None)

    with around_modules(_UNPOOL_MODULES, enter):  # the entering thread's stack only
        yield


def _refused_output_size(exc: BaseException) -> Tuple[bool, Any]:
    """(True, the call's ``output_size``) when ``exc`` rose inside torch's Python code below a
    public ``F.max_unpool*d`` frame (its output-size computation and check: the kernel itself
    is C++, no frame), read from the traceback's frames and that frame's arguments rather than
    by the name of torch's private helper; (False, None) otherwise."""
    tb = exc.__traceback__
    while tb is not None:
        code, inner = tb.tb_frame.f_code, tb.tb_next
        if (
            code.co_name in _UNPOOL_NAMES and code.co_filename == F.__file__
            and inner is not None and inner.tb_frame.f_code.co_filename == F.__file__
        ):
            return True, tb.tb_frame.f_locals.get("output_size")
        tb = inner
    return False, None


def unpool_failure(exc: BaseException, where: str) -> Optional[str]:
    """The one-sentence reason when ``exc`` is torch's unpool size check refusing jit's
    traced sizes (a direct ``F.max_unpool*d`` call: without ``output_size``, or with one
    computed from traced sizes), else None."""
    refused, output_size = _refused_output_size(exc) if isinstance(exc, TypeError) else (False, None)
    if not refused:
        return None
    if output_size is not None:
        return (
            f"torch.jit cannot trace F.max_unpool*d in {module_place(where)}: its output_size holds traced sizes (read from "
            "a tensor's shape while jit traces), which torch's own size check refuses; pass plain ints, or use tracer='auto' "
            "or 'dispatch'"
        )
    return (
        f"torch.jit cannot trace F.max_unpool*d without output_size in {module_place(where)}: torch's own size check refuses "
        "the sizes jit traces (nn.MaxUnpool modules are handled); pass output_size, or use tracer='auto' or 'dispatch'"
    )


_META_KERNELS = "_meta_registrations.py"


def meta_kernel_failure(exc: BaseException, where: str) -> Optional[str]:
    """The one-sentence reason when ``exc`` is a meta kernel of torch refusing jit's traced sizes
    (a convolution's shape check on meta tensors: ``torch._check`` is handed a 0-d tensor where it
    wants a bool, "cond must be a bool"), else None. Real tensors run the real kernels, which do
    not test sizes in Python."""
    kernels = [name for file, name in frames(exc) if file.endswith(_META_KERNELS)]
    if not isinstance(exc, TypeError) or not kernels:
        return None
    return (
        f"the jit tracer cannot trace {module_place(where)} on meta tensors: torch's meta kernel {kernels[0]} checks the sizes "
        f"in Python, and jit traces sizes as tensors it cannot test ({first_line(exc)}); use tracer='dispatch' or 'auto' "
        "for a meta model, or real tensors"
    )
