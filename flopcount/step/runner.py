"""One training step, run the same way by every reading that runs one (``estimate_memory``,
``plan``): the forward (under ``torch.autocast`` when asked), the default loss
(:mod:`flopcount.step.loss`), the model's outputs released, the backward (autocast off),
the optimizer step; watched by the one MemTracker subclass (:func:`peak_tracker`).

``count_flops(backward=True)`` runs its backward inside the dispatch tracer
(``autograd.grad``, so the caller's ``.grad`` is never written) from the same loss rule;
its optimizer comes from the same factory (:mod:`flopcount.step.optimizers`).
"""

from __future__ import annotations

import contextlib
import functools
import threading
from typing import Any, Callable, Dict, FrozenSet, List, Mapping, Optional, Sequence

import torch
from torch import nn

from flopcount.core.inputs import flat_values, output_tensors
from flopcount.errors import UsageError
from flopcount.step.loss import LossFn, default_loss
from flopcount.step.replay import snapshot
from flopcount.types import Phase

__all__ = ["autocast_nested", "forward_autocast", "peak_tracker", "run_step"]


@functools.cache
def peak_tracker(base: type) -> type:
    """``base`` (torch's ``MemTracker`` or ``FSDPMemTracker``) with its per-op peak update
    replaced by one that records the step's peak (``peak_total``, ``peak_snapshot``: the
    categories per device at that moment, ``peak_where``: the modules running, ``peak_phase``)
    and each running module's own peak (``module_peaks``), walking only the modules running
    now (torch's walks every module seen so far: minutes on an 80-layer model). Its module
    and optimizer hooks answer only the thread that made it. ``skip``: a predicate; ops made
    while it holds are not this step's work (DTensor's shape propagation in plan's fake
    world) and are run past the tracker. One class per ``base`` (made once). Its per-op method
    is torch's, inlined (:func:`_lean_dispatch`) for every op but the few torch special-cases."""
    fsdp = callable(getattr(base, "track_inputs", None))  # FSDPMemTracker: made with the model and optimizer
    lean = _lean_dispatch(base)

    class PeakTracker(base):
        @classmethod
        def _should_skip_dynamo(cls) -> bool:
            return False  # no dynamo-disabling wrapper around the per-op method (as the recorder's)

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            for attr in ("_curr_mem_snap", "_mod_tracker", "_in_opt", "_param_to_grad_hook_handles"):
                if not hasattr(self, attr):
                    raise UsageError(f"torch {torch.__version__}'s {base.__name__} has no {attr}, which flopcount's step needs")
            self._owner = threading.get_ident()
            _own_thread_module_hooks(self._mod_tracker, self._owner, self._forward_call)
            self.peak_total = -1
            self.peak_snapshot: Dict[Any, Dict[Any, int]] = {}
            self.peak_where: FrozenSet[str] = frozenset()
            self.peak_phase: Phase = "forward"
            self.module_peaks: Dict[str, int] = {}
            self.skip: Optional[Callable[[], bool]] = None
            #: the step's timeline (flopcount.step.replay), when a list: one record per op
            self.timeline: Optional[List[Any]] = None
            #: called at the optimizer step's first op: id(tensor) -> the layer it belongs to
            self.layer_tensors: Optional[Callable[[], Dict[int, Any]]] = None
            self._tensor_layers: Dict[int, Any] = {}
            self._touched: Optional[int] = None
            self._last_record: Any = None
            self._lean = lean
            self._entries = 0
            self._entry_mode: Any = None
            self._refs: Any = None  # the categories' enum (torch's own class), read off the live snapshot
            #: the outermost module whose forward runs inside the backward (a checkpoint's recompute)
            self._recompute: Optional[nn.Module] = None

        def watch(self, model: nn.Module, optimizer: Any, inputs: Sequence[torch.Tensor]) -> None:
            """Count ``model``'s parameters and buffers, ``optimizer``'s state and ``inputs``
            from the start (FSDPMemTracker was given the model and optimizer when made)."""
            if fsdp:
                self.track_inputs(tuple(inputs))
                return
            self.track_external(model, *([optimizer] if optimizer is not None else []), *inputs)
            # MemTracker hooks every parameter of a module it enters, which raises on frozen ones
            for param in model.parameters():
                if not param.requires_grad:
                    self._param_to_grad_hook_handles[param] = (_NoHook(), _NoHook())

        def _update_peak_stats(self, peak_state: Any) -> None:
            snap = self._curr_mem_snap
            total = sum(dev.get("Total", 0) for dev in snap.values())
            parents = self._mod_tracker.parents
            peaks = self.module_peaks
            for name in parents:
                if peaks.get(name, -1) < total:
                    peaks[name] = total
            phase: Phase = "optimizer" if self._in_opt else "backward" if self._mod_tracker.is_bw else "forward"
            if total > self.peak_total:
                self.peak_total = total
                self.peak_snapshot = {dev: dict(values) for dev, values in snap.items()}
                self.peak_where = frozenset(parents)
                self.peak_phase = phase
            if self.timeline is not None:
                record = ("op", snapshot(self), frozenset(parents), phase, self._touched)
                # the same bytes, modules, phase and layer as the last op's (a view: FSDP's lazy
                # init makes some per layer before the forward) adds nothing to any figure
                if record != self._last_record:
                    self.timeline.append(record)
                    self._last_record = record

        def __enter__(self) -> Any:
            first = self._entries == 0
            if first:  # the fake mode the step runs in, as torch's __enter__ records it
                self._entry_mode = lean.active_fake_mode() if lean is not None else None
            self._entries += 1
            entered = super().__enter__()
            if first:  # torch books tensors under its enum's members (the snapshot's keys but "Total")
                kinds = {type(key) for snap in self._curr_mem_snap.values() for key in snap if type(key) is not str}
                self._refs = kinds.pop() if len(kinds) == 1 else None  # none tracked yet: torch's method
            return entered

        def __exit__(self, *args: Any) -> Any:
            self._entries -= 1
            return super().__exit__(*args)

        def _forward_call(self, module: nn.Module, entering: bool) -> None:
            """A module's forward starting or ending (ModTracker's hooks, this thread's): one
            inside the backward is a recompute (activation checkpointing), whose ops torch's
            method books as activations (its ``_in_ac``, set for a module inside this span)."""
            if not self._mod_tracker.is_bw:
                return
            if entering:
                if self._recompute is None:
                    self._recompute = module
            elif self._recompute is module:
                self._recompute = None

        def _tracked(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
            if self._lean is None or self._refs is None or self._recompute is not None or self._lean.special(func):
                return super().__torch_dispatch__(func, types, args, kwargs)
            return self._lean(self, func, types, args, kwargs)

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            if self.skip is not None and self.skip():
                return func(*args, **(kwargs or {}))
            if self.timeline is None:
                return self._tracked(func, types, args, kwargs)
            if self._in_opt:
                if not self._tensor_layers and self.layer_tensors is not None:  # the step's first op
                    self._tensor_layers = self.layer_tensors()
                self._touched = _layer_touched(self._tensor_layers, args, kwargs)
            length, last = len(self.timeline), self._last_record
            out = self._tracked(func, types, args, kwargs)
            if not _has_tensor(out):
                # an op that made no tensor (``prim.device``: run or not by caches warmed by an
                # earlier step) changed no byte: its record would only tell the step's first run apart
                del self.timeline[length:]
                self._last_record = last
            return out

        def _register_global_optimizer_hook(self) -> None:
            """MemTracker's process-wide optimizer-step hooks, answering only the owning
            thread (another thread's ``optimizer.step()`` is not this step's)."""
            from torch.distributed._tools.mem_tracker import MemTracker
            from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

            owner, tracker = self._owner, self

            def pre(optimizer: Any, args: Any, kwargs: Any) -> None:
                if threading.get_ident() == owner:
                    tracker._in_opt = True

            def post(optimizer: Any, args: Any, kwargs: Any) -> None:
                if threading.get_ident() == owner:
                    # its state, in the optimizer category: MemTracker's public track_external (what
                    # torch's own hook does privately; FSDPMemTracker's override is a no-op)
                    MemTracker.track_external(tracker, optimizer)
                    tracker._in_opt = False

            self._optimizer_hook_handles = (register_optimizer_step_pre_hook(pre), register_optimizer_step_post_hook(post))

    PeakTracker.__name__ = PeakTracker.__qualname__ = f"Peak{base.__name__}"
    return PeakTracker


class _LeanDispatch:
    """torch's ``MemTracker.__torch_dispatch__`` (``FSDPMemTracker``'s is the same for every op
    but its collectives) without its per-op overheads: the output's tensors found by a plain
    walk of tensors, tuples and lists rather than pytree's (within one op the order of the
    tracked tensors changes no byte: the peak update follows them all), no dynamo wrapper. The
    ops torch's method treats specially (``wait_tensor``, FSDP's all-gather and reduce-scatter)
    and the ops of a recompute in the backward go to torch's method itself. Same tensors
    tracked, same category, same peak updates: ``tests/test_tracker_lean.py`` runs steps
    through both and compares every figure."""

    #: ops (by name, any overload) the trackers' own method treats specially
    SPECIAL = frozenset({"_c10d_functional::wait_tensor", "c10d::_allgather_base_", "c10d::_reduce_scatter_base_"})

    def __init__(self, dtensor: type, active_fake_mode: Callable[[], Any]) -> None:
        self.dtensor = dtensor
        self.active_fake_mode = active_fake_mode
        self._special: Dict[Any, bool] = {}

    def special(self, func: Any) -> bool:
        """Whether torch's own method must run ``func`` (known per op overload after its first call)."""
        known = self._special.get(func)
        if known is None:
            name = getattr(func, "name", None)
            known = self._special[func] = not callable(name) or str(name()).split(".")[0] in self.SPECIAL
        return known

    def __call__(self, tracker: Any, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        dtensor = self.dtensor
        for kind in types:
            if kind == dtensor:
                return NotImplemented  # DTensor desugars into local ops first, as in torch's
        res = func(*args, **(kwargs or {}))
        if self.active_fake_mode() is tracker._entry_mode:
            refs = tracker._refs
            if tracker._in_opt:
                reftype = refs.OPT
            elif tracker._mod_tracker.is_bw:  # not in a recompute: those ops go to torch's method
                reftype = refs.TEMP
            else:
                reftype = refs.ACT
            found: List[torch.Tensor] = []
            if not _plain_tensors(res, found):
                found = output_tensors(res)
            for tensor in found:
                tracker._track(reftype, tensor)
            tracker._update_peak_stats(None)  # PeakTracker's own: it reads no peak state
        return res


#: leaves an op's output may hold besides tensors
_LEAVES = (bool, int, float, complex, str, torch.dtype, torch.device, torch.layout, torch.memory_format)


def _plain_tensors(value: Any, found: List[torch.Tensor]) -> bool:
    """Append the tensors of ``value`` (a tensor; tuples and lists, depth first) to ``found``;
    False where it holds anything else (then walked by :func:`output_tensors`)."""
    if isinstance(value, torch.Tensor):
        found.append(value)
        return True
    kind = type(value)
    if kind is tuple or kind is list:
        return all(_plain_tensors(item, found) for item in value)
    return value is None or kind in _LEAVES


def _lean_dispatch(base: type) -> Optional[_LeanDispatch]:
    """The inlined per-op method, or None (torch's own then runs every op) where a piece it
    reads is missing from this torch (checked again per tracker: :meth:`PeakTracker._tracked`)."""
    if not callable(getattr(base, "_track", None)):
        return None
    try:
        from torch._guards import active_fake_mode
        from torch.distributed.tensor import DTensor
    except (ImportError, RuntimeError):
        return None
    return _LeanDispatch(DTensor, active_fake_mode)


def _has_tensor(value: Any) -> bool:
    return any(isinstance(v, torch.Tensor) for v in flat_values((value,)))


def _layer_touched(layers: Mapping[int, Any], args: Any, kwargs: Any) -> Optional[int]:
    """The layer of the first tensor among an op's arguments (lists included) that belongs to
    one (``layers``: ``id(tensor) -> (layer, tensor)``, the tensor held so its id stays its own)."""
    for item in flat_values((*args, *(kwargs or {}).values())):
        if isinstance(item, torch.Tensor):
            found = layers.get(id(item))
            if found is not None and found[1] is item:
                return int(found[0])
    return None


class _NoHook:
    def remove(self) -> None:
        pass


def _own_thread_module_hooks(mod_tracker: Any, owner: int, on_call: Callable[[nn.Module, bool], None]) -> None:
    """ModTracker registers its forward hooks process-wide (``register_module_forward_*_hook``
    of its ``_fw_pre_hook``/``_fw_post_hook``, looked up when it is entered): wrapped here so
    that another thread's modules neither enter this step's bookkeeping nor run its code
    (which raised inside that thread: issue #29 item 17). ``on_call(module, entering)`` is
    told before the pre-hook and after the post-hook (the tracker's own hooks run inside them)."""
    for name in ("_fw_pre_hook", "_fw_post_hook"):
        hook = getattr(mod_tracker, name, None)
        if hook is None:
            raise UsageError(f"torch {torch.__version__}'s ModTracker has no {name}, which flopcount's step needs")

        def only_owner(module: nn.Module, *args: Any, _hook: Any = hook, _pre: bool = name == "_fw_pre_hook", **kwargs: Any) -> Any:
            if threading.get_ident() != owner:
                return None
            if _pre:
                on_call(module, True)
            out = _hook(module, *args, **kwargs)
            if not _pre:
                on_call(module, False)
            return out

        setattr(mod_tracker, name, only_owner)


def autocast_nested() -> bool:
    """Whether this thread is already inside a ``torch.autocast`` (the caller's): the
    autocast weight-cast cache is then the caller's too (one per thread), and exiting an
    inner autocast neither clears it nor may we (issue #27 item 5)."""
    depth = torch.autocast_increment_nesting()
    torch.autocast_decrement_nesting()
    return depth > 1


def forward_autocast(amp: Optional[torch.dtype], device_type: str) -> Any:
    """The step's forward autocast to ``amp`` on ``device_type``, with the caller's autocast
    cache left alone (:func:`autocast_nested`); a null context without ``amp``."""
    return contextlib.nullcontext() if amp is None else torch.autocast(device_type, dtype=amp, cache_enabled=not autocast_nested())


def run_step(
    model: nn.Module,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    *,
    backward: bool = True,
    optimizer: Optional[torch.optim.Optimizer] = None,
    loss_fn: Optional[LossFn] = None,
    amp: Optional[torch.dtype] = None,
    device_type: str = "cpu",
    tracker: Any = None,
    on_phase: Optional[Callable[[Phase], None]] = None,
) -> None:
    """One step of ``model(*args, **kwargs)``: forward (``backward=False``: under
    ``torch.no_grad()``, and nothing else), ``loss_fn(outputs)`` or the default loss, the
    outputs released (as ``loss = loss_fn(model(x))`` does), ``loss.backward()``,
    ``optimizer.step()``. With ``amp`` the forward and loss run under
    ``torch.autocast(device_type, amp)`` and the backward and step with autocast off,
    whatever the caller's (the AMP recipe); the forward's cached weight casts die with it,
    and the caller's own autocast cache is left alone (inside the caller's autocast the
    forward runs with the cache off). ``tracker``: an entered :func:`peak_tracker`, whose
    peak starts with what is alive now; ``on_phase`` is told "backward" and "optimizer"."""
    if tracker is not None:
        tracker._update_peak_stats(None)  # the step starts with parameters, state and inputs alive
    inside = forward_autocast(amp, device_type)
    outside: Any = contextlib.nullcontext() if amp is None else torch.autocast(device_type, enabled=False)
    with torch.set_grad_enabled(backward):
        with inside:
            outputs = model(*args, **kwargs)
            if not backward:
                return
            loss = (loss_fn or default_loss)(outputs)
            del outputs
        if on_phase is not None:
            on_phase("backward")
        with outside:
            loss.backward()
        del loss
    if optimizer is not None:
        if on_phase is not None:
            on_phase("optimizer")
        with outside:
            optimizer.step()
