"""Borrowing the model and inputs for a timed run: the device to run on, moving there and
back without changing anything the caller owns, binding the call, autocast, sync, RSS."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from itertools import chain
from typing import Any, Callable, Iterator, Mapping, Optional

import torch
from torch import nn

from flopcount.core.inputs import PreparedCall, is_dataless, is_uninitialized, prepare_call, with_input_hint
from flopcount.core.state import left_as_found, preserved_inputs, preserved_rng
from flopcount.errors import FlopcountError, TraceError, UsageError
from flopcount.tracers._containers import compiled_parts
from flopcount.tracers._modules import failing_module, forward_error, module_names
from flopcount.tracers._state import preserved_model_state
from flopcount.tracers._twin import private_twin
from flopcount.tracers.fake.copies import shared_tensor_copy


def resolve_device(model: nn.Module, call: PreparedCall, device: Any) -> torch.device:
    """The device to run on: ``device`` when given (CUDA must exist), otherwise the
    device of the model's first parameter/buffer, else of the first input tensor, else CPU."""
    if device is not None:
        try:
            dev = torch.device(device)
        except (RuntimeError, TypeError) as exc:
            raise UsageError(f"not a device: {device!r}") from exc
        if dev.type == "cuda":
            if not torch.cuda.is_available():
                raise UsageError(f"device={device!r} was asked for but CUDA is not available (torch {torch.__version__})")
            if dev.index is None:
                dev = torch.device("cuda", torch.cuda.current_device())
        if dev.type not in ("cpu", "cuda"):
            raise UsageError(f"benchmark supports cpu and cuda devices, got {dev.type!r}")
        return dev
    first = next(chain(model.parameters(), model.buffers(), call.tensors), None)
    return torch.device("cpu") if first is None else first.device


def refuse_data_less(model: nn.Module, call: PreparedCall, who: str) -> None:
    """A model or input on the meta device (or a fake tensor) has no data: timing it would
    report a latency that was never measured, so it is a UsageError."""
    for name, tensor in chain(model.named_parameters(), model.named_buffers()):
        if is_dataless(tensor):
            kind = "on the meta device" if tensor.device.type == "meta" else "made of fake tensors"
            raise UsageError(
                f"{who}: the model is {kind} ({name} has no data), so there is nothing to time; "
                "build it on cpu or cuda (count_flops counts such models without timing)"
            )
    for tensor in call.tensors:
        if is_dataless(tensor):
            raise UsageError(f"{who}: an input tensor {tuple(tensor.shape)} is on the meta device or fake (no data); pass real tensors")


@dataclass(frozen=True)
class RealRun:
    """A model's call readied for real runs (benchmark, module_latency, profile): the caller's
    inputs walked once (``call``), the device to run on, and the call with its tensors there (``run``)."""

    call: PreparedCall
    device: torch.device
    run: PreparedCall
    #: the function the caller called (``"benchmark"``), named by a failing forward's line
    who: str = "benchmark"

    @contextlib.contextmanager
    def borrow(self, model: nn.Module) -> Iterator[nn.Module]:
        """``model`` on the device (:func:`borrowed_model`); the inputs, torch's RNG (when this is
        the process's only Python thread: ``core.state.preserved_rng``) and the globals and class
        data the forwards write (``core.state.left_as_found``: the twin shares the caller's classes)
        are left as found too. A forward failing in the block is the TraceError ``count_flops``
        raises (:func:`forward_failed`)."""
        with preserved_rng(), preserved_inputs(list(self.call.tensors)), left_as_found(model.modules()), \
                borrowed_model(model, self.device) as on_device, forward_failed(on_device, model, self.call, self.who):
            yield on_device


@contextlib.contextmanager
def forward_failed(running: nn.Module, model: nn.Module, call: PreparedCall, who: str) -> Iterator[None]:
    """A failure of ``running``'s forward (``model``'s twin or ``model``) inside the block, raised
    as count_flops raises it: a TraceError naming the module that failed (read off the
    traceback: the timed calls run without hooks), ``who`` and the inputs, with the hint for
    inputs given in the wrong form (:func:`~flopcount.core.inputs.with_input_hint`). An exception
    no module's code raised (ours, or a UsageError) goes on as it is."""
    try:
        yield
    except TraceError as exc:  # a traced step of the reading (profile's join step)
        hinted = with_input_hint(exc, call, model.forward, who)
        if hinted is exc:
            raise
        raise hinted from exc
    except FlopcountError:
        raise
    except Exception as exc:
        where = failing_module(exc, module_names(running))
        if where is None:
            raise
        raise with_input_hint(forward_error(exc, where, call.description, who), call, model.forward, who) from exc


def real_run(model: nn.Module, inputs: Any, kwargs: Optional[Mapping[str, Any]], device: Any, who: str) -> RealRun:
    """How every real run starts: the inputs prepared once, a model or input without data refused
    (:func:`refuse_data_less`, naming ``who``), the device resolved, the inputs moved there."""
    call = prepare_call(inputs, kwargs)
    refuse_data_less(model, call, who)
    dev = resolve_device(model, call, device)
    return RealRun(call, dev, move_inputs(call, dev), who)


def _same_device(a: torch.device, b: torch.device) -> bool:
    return a.type == b.type and (a.type == "cpu" or a.index == b.index)


@contextlib.contextmanager
def borrowed_model(model: nn.Module, device: torch.device) -> Iterator[nn.Module]:
    """Yields ``model`` on ``device``; afterwards the model is exactly as found.

    What runs is the model's private twin (``tracers/_twin.private_twin``, as the real-run
    tracers run it): its own module objects, attribute and hook dictionaries and hook
    wrappers' state, every tensor shared. So a forward's ``self.calls += 1`` or a library's
    stateful hook (diffusers' cache hooks, which skip work by iteration) advances the twin,
    and the caller's model starts its next call where it was (issue #27 item 5). A model the
    twin cannot stand for (TorchScript, DDP/FSDP) runs as it is, and so does one with
    ``torch.compile``d parts (the twin would run them eagerly; what is timed is the compiled code).
    The run is under the tracers' state guard (``tracers/_state.preserved_model_state``:
    the shared buffers, such as BatchNorm's running statistics, bit for bit, flags, grads;
    the RNG is left to the caller's ``core.state.preserved_rng``).
    A model elsewhere is moved for the run and then given back its original tensors
    (the same parameter storages, gradients and buffer objects, not copies). A model with a
    lazy module not yet materialised runs as a copy sharing every initialised tensor: the
    first call materialises the copy's module, not the caller's."""
    tensors = list(chain(model.parameters(), model.buffers()))
    if any(is_uninitialized(t) for t in tensors):
        model = shared_tensor_copy(model)
        tensors = list(chain(model.parameters(), model.buffers()))
    elif not compiled_parts(model.modules()):  # a compiled model is timed as it is: its compiled code
        twin = private_twin(model)
        if twin is not None:
            model, _ = twin
    needs_move = any(not _same_device(t.device, device) for t in tensors)
    if not needs_move:
        # the tracers' one state guard: buffers bit for bit, flags, grads, hooks
        # the RNG is the caller's preserved_rng's (core/state.py): set back only when no other
        # thread could be rewound by it (issue #29 item 18)
        with preserved_model_state(model, restore_attributes=False, restore_rng=False):
            yield model
        return
    params = [(p, p.data, None if p.grad is None else p.grad.data) for p in model.parameters()]
    slots = [(m, dict(m._parameters), dict(m._buffers)) for m in model.modules()]
    try:
        model.to(device)
        yield model
    finally:
        for module, original_params, original_buffers in slots:
            # .to() may replace Parameter objects (overwrite_module_params_on_conversion)
            module._parameters.clear()
            module._parameters.update(original_params)
            module._buffers.clear()
            module._buffers.update(original_buffers)
        for p, data, grad in params:
            p.data = data
            if grad is not None and p.grad is not None:
                p.grad.data = grad


def move_inputs(call: PreparedCall, device: torch.device) -> PreparedCall:
    """``call`` with every tensor on ``device`` (the same call when all are there
    already; the caller's objects are never modified)."""
    if all(_same_device(t.device, device) for t in call.tensors):
        return call
    return call.with_tensors([t.to(device) for t in call.tensors])


def bind_call(fn: Callable[..., Any], call: PreparedCall) -> Callable[[], Any]:
    """A zero-argument callable for ``fn`` with the call's arguments, built once so the
    timed loop does no argument packing."""
    args, kw = call.args, call.kwargs
    if kw:
        return lambda: fn(*args, **kw)
    if len(args) == 1:
        (only,) = args
        return lambda: fn(only)
    return lambda: fn(*args)


def autocast_context(device: torch.device, dtype: Optional[torch.dtype]) -> Any:
    """``torch.autocast`` in ``dtype`` (read by ``parse_dtype(..., "autocast")``); float32 or None: none."""
    if dtype is None or dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def rss_bytes() -> Optional[int]:
    """Resident set size of this process (Linux ``/proc/self/statm``), or None."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, AttributeError):
        return None


