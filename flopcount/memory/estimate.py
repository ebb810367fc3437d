"""Peak memory of one inference or training step, estimated on fake tensors ("will it fit?").

A fake twin of the model, made by the tracers' ``fake_copies`` (the same module tree;
parameters, buffers and inputs as FakeTensors with the original shapes, strides,
storages and dtypes, meta mapped to cpu) runs the step under ``FakeTensorMode`` inside torch's
``torch.distributed._tools.mem_tracker.MemTracker``. Nothing is computed or
allocated, and the user's model, inputs and optimizer are never touched. A step that reads
tensor values (``nonzero``, ``.item()``) cannot run on fake tensors: one real step is then
measured by the same tracker on a deep copy of the model and inputs, and said in warnings.

Bytes are tensor storage bytes, as MemTracker counts them (rounded up to 512 bytes
on CUDA). Allocator caching, the CUDA context, workspaces and fragmentation are not
counted: see docs/memory.md.
"""

from __future__ import annotations

import contextlib
import copy
import json
import threading
import warnings
from dataclasses import asdict, dataclass
from typing import Any, Dict, FrozenSet, List, Literal, Mapping, Optional, Tuple, Union

import torch
from torch import nn

from flopcount.core.diagnostics import from_texts
from flopcount.core.inputs import is_dataless, output_tensors, prepare_call
from flopcount.core.model_facts import model_facts
from flopcount.core.rendering import render
from flopcount.errors import FlopcountError, FlopcountWarning, TraceError, UsageError
from flopcount.step.autocast import ambient_autocast_note, amp_device
from flopcount.step.optimizers import OptimizerSpec, build_optimizer, check_spec, warm_up
from flopcount.tracers._modules import ModuleStack
from flopcount.tracers.fake.copies import FakeRunError, fake_copies
from flopcount.types import Diagnostic, Phase

Mode = Literal["inference", "forward+backward", "training step"]

#: MemTracker's category names -> MemoryBreakdown fields ("Other" holds the inputs we register)
_CATEGORIES = {
    "Parameter": "parameters",
    "Buffer": "buffers",
    "Gradient": "gradients",
    "Optstate": "optimizer_state",
    "Activation": "activations",
    "Temp": "temporaries",
    "Other": "inputs",
}


@dataclass(frozen=True)
class MemoryBreakdown:
    """Live tensor bytes by what they hold. ``activations``: tensors made by the forward
    (in training mostly those saved for backward); ``temporaries``: tensors made by the
    backward (gradients of activations); ``inputs``: the example inputs."""

    parameters: int = 0
    buffers: int = 0
    gradients: int = 0
    optimizer_state: int = 0
    activations: int = 0
    temporaries: int = 0
    inputs: int = 0

    @property
    def total(self) -> int:
        return sum(asdict(self).values())


@dataclass(frozen=True)
class ModuleMemory:
    """One module of the model. ``activation_bytes``: bytes its forward made that were
    still alive when it returned (output plus what it saved for backward), summed over
    calls; ``peak_bytes``: the highest total while it ran, forward or backward (0: never ran)."""

    name: str
    type_name: str
    depth: int
    calls: int
    activation_bytes: int
    peak_bytes: int


@dataclass(frozen=True)
class MemoryEstimate:
    """Estimated peak memory of one step; ``at_peak`` sums to ``peak_bytes``."""

    peak_bytes: int
    at_peak: MemoryBreakdown
    peak_module: str
    peak_phase: Phase
    mode: Mode
    optimizer: Optional[str]
    params: int
    device: str
    dtype: Optional[str]
    input_description: str
    modules: Tuple[ModuleMemory, ...] = ()
    warnings: Tuple[str, ...] = ()

    def diagnostics(self) -> Tuple[Diagnostic, ...]:
        """The estimate's warnings as typed records ("warning"), each once."""
        return from_texts((), self.warnings)

    def module(self, name: str) -> ModuleMemory:
        for info in self.modules:
            if info.name == name:
                return info
        raise KeyError(f"no module named {name!r} in this estimate")

    def activation_bytes(self) -> Dict[str, int]:
        """``{module name: activation bytes}`` for modules that ran, in model order."""
        return {m.name: m.activation_bytes for m in self.modules if m.calls}

    def table(self, max_depth: Optional[int] = 1, fmt: str = "simple") -> str:
        return render(self, "table", max_depth=max_depth, fmt=fmt)

    def to_dict(self) -> Dict[str, Any]:
        return render(self, "dict")

    def to_json(self, indent: Optional[int] = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)


# --------------------------------------------------------------------------- torch's tools


def _memtracker_class() -> type:
    try:
        from torch.distributed._tools.mem_tracker import MemTracker
    except Exception as exc:  # ImportError, or a RuntimeError on builds without torch.distributed
        raise UsageError(
            f"estimate_memory needs torch.distributed._tools.mem_tracker.MemTracker (torch >= 2.5 built with "
            f"distributed support); torch {torch.__version__} here has none ({type(exc).__name__}: {exc})"
        ) from exc
    if not hasattr(MemTracker, "_update_peak_stats") or not hasattr(MemTracker, "track_external"):
        raise UsageError(f"estimate_memory: torch {torch.__version__}'s MemTracker lacks the hooks flopcount uses")
    return MemTracker


def _peak_tracker() -> Any:
    """A MemTracker that also records where the step peaks and each module's own peak.

    It replaces MemTracker's per-op peak update, which walks every module seen so far
    (quadratic in depth on a 70B model), by a walk over the modules running now."""

    class PeakTracker(_memtracker_class()):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            for attr in ("_curr_mem_snap", "_mod_tracker", "_in_opt"):
                if not hasattr(self, attr):
                    raise UsageError(f"estimate_memory: torch {torch.__version__}'s MemTracker has no {attr}")
            self._owner = threading.get_ident()
            _own_thread_module_hooks(self._mod_tracker, self._owner)
            self.peak_total = -1
            self.peak_snapshot: Dict[Any, Dict[Any, int]] = {}
            self.peak_where: FrozenSet[str] = frozenset()
            self.peak_phase: Phase = "forward"
            self.module_peaks: Dict[str, int] = {}

        def _update_peak_stats(self, peak_state: Any) -> None:
            snap = self._curr_mem_snap
            total = sum(dev.get("Total", 0) for dev in snap.values())
            parents = self._mod_tracker.parents
            peaks = self.module_peaks
            for name in parents:
                if peaks.get(name, -1) < total:
                    peaks[name] = total
            if total > self.peak_total:
                self.peak_total = total
                self.peak_snapshot = {dev: dict(values) for dev, values in snap.items()}
                self.peak_where = frozenset(parents)
                self.peak_phase = "optimizer" if self._in_opt else "backward" if self._mod_tracker.is_bw else "forward"

        def _register_global_optimizer_hook(self) -> None:
            """MemTracker's process-wide optimizer-step hooks, answering only the estimating
            thread (another thread's ``optimizer.step()`` is not this step's)."""
            from torch.distributed._tools.mem_tracker import _MemRefType
            from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

            owner, tracker = self._owner, self

            def pre(optimizer: Any, args: Any, kwargs: Any) -> None:
                if threading.get_ident() == owner:
                    tracker._in_opt = True

            def post(optimizer: Any, args: Any, kwargs: Any) -> None:
                if threading.get_ident() == owner:
                    tracker._track_optimizer_states(_MemRefType.OPT, optimizer)
                    tracker._in_opt = False

            self._optimizer_hook_handles = (register_optimizer_step_pre_hook(pre), register_optimizer_step_post_hook(post))

    return PeakTracker()


def _own_thread_module_hooks(mod_tracker: Any, owner: int) -> None:
    """ModTracker registers its forward hooks process-wide (``register_module_forward_*_hook``
    of its ``_fw_pre_hook``/``_fw_post_hook``, looked up when it is entered): wrapped here so
    that another thread's modules neither enter this estimate's bookkeeping nor run its code
    (which raised inside that thread: issue #29 item 17)."""
    for name in ("_fw_pre_hook", "_fw_post_hook"):
        hook = getattr(mod_tracker, name, None)
        if hook is None:
            raise UsageError(f"estimate_memory: torch {torch.__version__}'s ModTracker has no {name}")

        def only_owner(*args: Any, _hook: Any = hook, **kwargs: Any) -> Any:
            if threading.get_ident() != owner:
                return None
            return _hook(*args, **kwargs)

        setattr(mod_tracker, name, only_owner)


#: MemTracker also patches ``torch.UntypedStorage.resize_`` process-wide and puts back what it
#: found when it was built: two estimates at once would put back each other's patch. Estimates
#: therefore run one at a time (another thread's estimate waits); counts do not wait for them.
_ESTIMATE_LOCK = threading.Lock()


def _loss_of(output: Any) -> torch.Tensor:
    """What backward starts from: ``output.loss`` when the model computed one (Hugging
    Face with labels), else the sum of every output that requires grad."""
    loss = None if isinstance(output, torch.Tensor) else getattr(output, "loss", None)
    if isinstance(loss, torch.Tensor) and loss.requires_grad:
        return loss.sum() if loss.numel() != 1 else loss
    tensors = [t for t in output_tensors(output) if t.requires_grad]
    if not tensors:
        raise UsageError("estimate_memory(backward=True): none of the model's outputs requires grad")
    total = tensors[0].sum()
    for tensor in tensors[1:]:
        total = total + tensor.sum()
    return total


def _bytes_of(snapshot: Mapping[Any, Mapping[Any, int]], category: str) -> int:
    return sum(v for values in snapshot.values() for k, v in values.items() if getattr(k, "value", k) == category)


# --------------------------------------------------------------------------- the estimate


def estimate_memory(
    model: nn.Module,
    inputs: Any,
    kwargs: Optional[Mapping[str, Any]] = None,
    *,
    backward: bool = False,
    optimizer: Optional[OptimizerSpec] = None,
    dtype: Union[None, str, torch.dtype] = None,
    autocast: Union[None, str, torch.dtype] = None,
) -> MemoryEstimate:
    """Peak tensor memory of one step of ``model(*inputs, **kwargs)`` on fake tensors.

    ``backward=False``: inference under ``torch.no_grad()``. ``backward=True``: forward
    then backward from ``output.loss`` (if the model returns one) or the sum of its
    outputs, the other outputs released first. ``optimizer`` ("sgd", "sgd-momentum",
    "adam", "adamw" or an instance, needs ``backward``) adds its step, in the steady
    state: its state exists from the start (allocated by an earlier step), gradients do
    not (``zero_grad(set_to_none=True)``). ``dtype`` casts floating parameters, buffers and
    inputs. ``autocast`` (e.g. ``torch.bfloat16``) runs the forward and the loss under
    ``torch.autocast`` and the backward and step outside it, as the AMP recipe does.
    A tie the model declares but no longer has (``model.to("meta")`` unties) is restored on
    the fake copy, with a warning. Works on cpu, cuda and meta models (meta is estimated as cpu).
    A step that reads tensor values is measured once for real on a copy (said in warnings;
    refused on meta)."""
    if not isinstance(model, nn.Module):
        raise UsageError(f"estimate_memory: model must be a torch.nn.Module, got {type(model).__name__}")
    if optimizer is not None and not backward:
        raise UsageError("estimate_memory: an optimizer step needs backward=True")
    if optimizer is not None:
        check_spec(optimizer, "estimate_memory")
    cast = _dtype(dtype, "dtype")
    amp = _dtype(autocast, "autocast")
    call = prepare_call(inputs, kwargs)
    description = call.description
    with _ESTIMATE_LOCK:
        return _estimate(model, call, description, backward, optimizer, cast, amp)


def _estimate(
    model: nn.Module, call: Any, description: str, backward: bool, optimizer: Optional[OptimizerSpec],
    cast: Optional[torch.dtype], amp: Optional[torch.dtype],
) -> MemoryEstimate:
    tracker = _peak_tracker()
    facts = model_facts(model)
    try:
        copied = fake_copies(model, list(call.tensors), call.rebuild, dtype=cast, storages=True, retie=True, modules=facts.modules)
    except UsageError as exc:
        raise UsageError(f"estimate_memory: {exc}") from exc
    except FakeRunError as exc:
        raise UsageError(f"estimate_memory: {exc.reason}") from exc
    twin, mode, (fake_args, fake_kw) = copied.model, copied.mode, copied.call
    notes = copied.notes + ambient_autocast_note(amp)
    opt, opt_name = (None, None)
    if optimizer is not None:
        trainable = [p for p in twin.parameters() if p.requires_grad]
        opt, opt_name = build_optimizer(optimizer, copied.twins, trainable, "estimate_memory")
    names = facts.names_on(copied.copies)
    try:
        _tracked_step(tracker, twin, opt, fake_args, fake_kw, backward, amp, names, description, mode)
    except _NeedsData as needs:
        real = _real_step_fallback(model, call, facts, optimizer, backward, cast, amp, description, needs)
        tracker, twin, names = real.tracker, real.model, real.names
        notes = copied.notes + ambient_autocast_note(amp) + [real.note]
    return _collect(tracker, twin, names, backward, opt_name, cast, description, notes)


class _NeedsData(Exception):
    """The fake step read tensor values (``nonzero``, ``.item()``): only a real step can run it."""

    def __init__(self, error: TraceError):
        super().__init__(str(error))
        self.error = error


def _tracked_step(
    tracker: Any,
    twin: nn.Module,
    opt: Any,
    args: Tuple[Any, ...],
    kwargs: Dict[str, Any],
    backward: bool,
    amp: Optional[torch.dtype],
    names: Mapping[nn.Module, str],
    description: str,
    mode: Any,
) -> None:
    """One step of ``twin`` inside ``tracker`` (under ``mode``: the fake mode, or nothing for a
    real step); a failure names the module it happened in; warnings' formatter kept. Fake
    tensors draw no random number, so a fake step leaves the process's RNG alone (setting it
    back would rewind another thread's draws, issue #29 item 18); a real step (the fallback)
    draws from it, and it is put back."""
    real = isinstance(mode, contextlib.nullcontext)
    rng = torch.get_rng_state() if real else None
    formatwarning = warnings.formatwarning  # ModTracker may replace it process-wide
    try:
        with mode:
            if opt is not None:
                warm_up(opt, "estimate_memory")
            tracker.track_external(twin, opt, output_tensors((args, kwargs)))
            _skip_grad_hooks(tracker, twin)
            with tracker, ModuleStack(names) as stack:
                tracker._update_peak_stats(None)  # the step starts with parameters, state and inputs alive
                try:
                    _run_step(twin, args, kwargs, backward, opt, amp_device(twin, args, kwargs), amp)
                except FlopcountError:
                    raise
                except Exception as exc:
                    error = _step_error(exc, stack.current, description)
                    if _reads_data(exc):
                        raise _NeedsData(error) from exc
                    raise error from exc
    finally:
        warnings.formatwarning = formatwarning
        if rng is not None:
            torch.set_rng_state(rng)


def _reads_data(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) is fake tensors' "this needs a value" error."""
    seen: set = set()
    current: Optional[BaseException] = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        name = type(current).__name__
        if "DataDependent" in name or "DynamicOutputShape" in name:
            return True
        current = current.__cause__ or current.__context__
    return False


@dataclass
class _RealStep:
    tracker: Any
    model: nn.Module
    names: Dict[nn.Module, str]
    note: str


def _real_step_fallback(
    model: nn.Module,
    call: Any,
    facts: Any,
    optimizer: Optional[OptimizerSpec],
    backward: bool,
    cast: Optional[torch.dtype],
    amp: Optional[torch.dtype],
    description: str,
    needs: _NeedsData,
) -> _RealStep:
    """The step that read tensor values run for real, as count_flops falls back to one real
    run: on a deep copy of the model and inputs (the caller's are never touched), measured
    by the same MemTracker. Refused on meta or fake weights and inputs (no values to read)."""
    dataless = [t for t in (*call.tensors, *facts.parameters, *facts.buffers) if isinstance(t, torch.Tensor) and is_dataless(t)]
    if dataless:
        raise TraceError(
            f"{needs.error}; on meta/fake tensors there are no values to run it with, so no real step can stand in: "
            "estimate with real weights and inputs (the step is then measured once for real)",
            module_path=needs.error.module_path,
            input_shapes=needs.error.input_shapes,
        ) from needs.error.__cause__
    memo: Dict[int, Any] = {}
    copy_model, copy_tensors = copy.deepcopy((model, list(call.tensors)), memo)
    twins = {id(p): memo[id(p)] for p in model.parameters() if id(p) in memo}
    if cast is not None:
        copy_model.to(cast)
        copy_tensors = [t.to(cast) if t.is_floating_point() else t for t in copy_tensors]
    args, kwargs = call.rebuild(copy_tensors)
    opt = None
    if optimizer is not None:
        trainable = [p for p in copy_model.parameters() if p.requires_grad]
        opt, _ = build_optimizer(optimizer, twins, trainable, "estimate_memory")
    names = facts.names_on(memo)
    tracker = _peak_tracker()
    _tracked_step(tracker, copy_model, opt, args, kwargs, backward, amp, names, description, contextlib.nullcontext())
    first = (str(needs.error).splitlines() or [""])[0]
    return _RealStep(
        tracker,
        copy_model,
        names,
        f"estimate_memory measured one real step (MemTracker, on a copy of the model and inputs) because the step "
        f"reads tensor values that fake tensors do not have ({first.split(': ', 1)[-1]}); the peak is for these "
        f"input values: a data-dependent size (nonzero, masks) can differ on other data",
    )


class _NoHook:
    def remove(self) -> None:
        pass


def _skip_grad_hooks(tracker: Any, model: nn.Module) -> None:
    """MemTracker registers a gradient hook on every parameter of a module it enters, which
    raises on frozen ones; mark those as already hooked so it leaves them alone."""
    for param in model.parameters():
        if not param.requires_grad:
            tracker._param_to_grad_hook_handles[param] = (_NoHook(), _NoHook())


def _dtype(dtype: Union[None, str, torch.dtype], what: str) -> Optional[torch.dtype]:
    if dtype is None:
        return None
    value = getattr(torch, dtype.strip().replace("torch.", ""), None) if isinstance(dtype, str) else dtype
    if not isinstance(value, torch.dtype) or not value.is_floating_point:
        raise UsageError(f"estimate_memory: {what} must be a floating torch.dtype such as torch.bfloat16, got {dtype!r}")
    return value


def _run_step(
    model: nn.Module,
    args: Tuple[Any, ...],
    kwargs: Dict[str, Any],
    backward: bool,
    opt: Any,
    device_type: str,
    amp: Optional[torch.dtype],
) -> None:
    """Forward (and loss), backward, step; with ``amp`` the forward and loss under autocast and
    the rest with autocast off, whatever the caller's (the AMP recipe)."""
    inside = torch.autocast(device_type, dtype=amp) if amp is not None else contextlib.nullcontext()
    outside = torch.autocast(device_type, enabled=False) if amp is not None else contextlib.nullcontext()
    with torch.set_grad_enabled(backward):
        with inside:
            output = model(*args, **kwargs)
            if not backward:
                return
            loss = _loss_of(output)
            del output
        if amp is not None:  # the low-precision weight copies die with the forward's autocast, as in the
            torch.clear_autocast_cache()  # recipe, even when the caller's own autocast is still open
        with outside:
            loss.backward()
        del loss
    if opt is not None:
        with outside:
            opt.step()


def _step_error(exc: Exception, where: str, description: str) -> TraceError:
    place = f"module '{where}'" if where else "the root module"
    first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    hint = ""
    if "DataDependent" in type(exc).__name__ or "DynamicOutputShape" in type(exc).__name__:
        hint = " (fake tensors have no values: the step reads tensor data, e.g. .item() or nonzero())"
    return TraceError(
        f"estimate_memory: the step failed in {place} with inputs {description}: "
        f"{type(exc).__name__}: {first_line}{hint}",
        module_path=where,
        input_shapes=description,
    )


def _collect(
    tracker: Any,
    twin: nn.Module,
    names: Mapping[nn.Module, str],
    backward: bool,
    opt_name: Optional[str],
    cast: Optional[torch.dtype],
    description: str,
    notes: List[str],
) -> MemoryEstimate:
    snapshot = tracker.peak_snapshot
    at_peak = MemoryBreakdown(**{field: _bytes_of(snapshot, category) for category, field in _CATEGORIES.items()})
    known = {tracker._mod_tracker.get_known_fqn(module): name for module, name in names.items()}
    running = [fqn for fqn in tracker.peak_where if fqn in known]
    peak_module = known[max(running, key=lambda fqn: (fqn.count("."), fqn))] if running else ""
    modules = []
    for module, name in names.items():
        stats = tracker.memory_tracking.get(module)
        states = {} if stats is None else {getattr(k, "value", k): v for k, v in stats.snapshots.items()}
        before, after = states.get("Pre-Forward", []), states.get("Post-Forward", [])
        retained = sum(max(0, _bytes_of(b, "Activation") - _bytes_of(a, "Activation")) for a, b in zip(before, after))
        fqn = tracker._mod_tracker.get_known_fqn(module)
        modules.append(
            ModuleMemory(
                name,
                type(module).__name__,
                name.count(".") + 1 if name else 0,
                len(before),
                retained,
                tracker.module_peaks.get(fqn, 0) if fqn is not None else 0,
            )
        )
    devices = sorted({str(device) for device in snapshot})
    if len(devices) > 1:
        notes.append(f"the step used several devices ({', '.join(devices)}); peak_bytes is their sum")
    for note in notes:
        warnings.warn(note, FlopcountWarning, stacklevel=3)
    return MemoryEstimate(
        peak_bytes=at_peak.total,
        at_peak=at_peak,
        peak_module=peak_module,
        peak_phase=tracker.peak_phase,
        mode="training step" if opt_name else "forward+backward" if backward else "inference",
        optimizer=opt_name,
        params=sum(p.numel() for p in twin.parameters()),
        device=", ".join(devices) or "cpu",
        dtype=None if cast is None else str(cast).replace("torch.", ""),
        input_description=description,
        modules=tuple(modules),
        warnings=tuple(notes),
    )
