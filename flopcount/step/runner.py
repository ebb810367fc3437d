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
import weakref
from typing import Any, Callable, Dict, FrozenSet, Iterator, List, Mapping, Optional, Sequence, Tuple

import torch
from torch import nn

from flopcount.core.inputs import flat_values, output_tensors
from flopcount.errors import UsageError
from flopcount.step.loss import LossFn, default_loss
from flopcount.step.replay import snapshot
from flopcount.types import Phase

__all__ = ["autocast_nested", "backward_autocast", "forward_autocast", "peak_tracker", "run_step"]

@functools.cache
def peak_tracker(base: type) -> type:
    """``base`` (torch's ``MemTracker`` or ``FSDPMemTracker``) with its per-op peak update
    replaced by one that records the step's peak (``peak_total``, ``peak_snapshot``: the
    categories per device at that moment, ``peak_where``: the modules running, ``peak_phase``)
    and each running module's own peak (``module_peaks``: from the live bytes at each entry of
    the module, forward and backward, as MemTracker's ``local_peak``), walking only the modules running
    now (torch's walks every module seen so far: minutes on an 80-layer model). Its module
    and optimizer hooks answer only the thread that made it. ``skip``: a predicate; ops made
    while it holds are not this step's work (DTensor's shape propagation in plan's fake
    world) and are run past the tracker. One class per ``base``, made once."""
    fsdp = callable(getattr(base, "track_inputs", None))  # FSDPMemTracker: made with the model and optimizer

    class PeakTracker(base):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            for attr in ("_curr_mem_snap", "_mod_tracker", "_in_opt", "_param_to_grad_hook_handles"):
                if not hasattr(self, attr):
                    raise UsageError(f"torch {torch.__version__}'s {base.__name__} has no {attr}, which flopcount's step needs")
            self._owner = threading.get_ident()
            me = weakref.ref(self)  # not self._entered: the tracker would be in a cycle, kept to the next collection

            def entered() -> None:
                tracker = me()
                if tracker is not None:
                    tracker._entered()

            _own_thread_module_hooks(self._mod_tracker, self._owner, entered)
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
            #: (the timeline's length at its birth, its bytes by (device, category)) of each cast of a
            #: parameter the forward made (autocast's, cached until the forward's autocast ends)
            #: that died as that autocast ended (:meth:`autocast_region`); timeline runs only
            self.released_casts: List[Any] = []
            #: the timeline's length when the forward's autocast ended (None: not yet, or no autocast)
            self.autocast_left: Optional[int] = None
            self._leaving_autocast = False
            self._cast_refs: List[Any] = []  # weak: a cast's death is what is noted

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

        def _entered(self) -> None:
            """A module's forward (or its recompute) was entered: the bytes alive now are alive
            while it runs, so they count towards its own peak (docs/memory.md), as they do in
            MemTracker's, whose per-module peak starts from them. A module whose forward makes no
            tensor (a dropout at p = 0: its only op reads the input's device) is credited
            here, the same in a full trace and in the replay's timeline, whatever ops it runs."""
            if self.skip is None or not self.skip():
                self._update_peak_stats(None)

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

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            if self.skip is not None and self.skip():
                return func(*args, **(kwargs or {}))
            if self.timeline is None:
                return super().__torch_dispatch__(func, types, args, kwargs)
            if self._in_opt:
                if not self._tensor_layers and self.layer_tensors is not None:  # the step's first op
                    self._tensor_layers = self.layer_tensors()
                self._touched = _layer_touched(self._tensor_layers, args, kwargs)
            length, last = len(self.timeline), self._last_record
            if _casts_a_parameter(func, args) and not self._mod_tracker.is_bw and not self._in_opt:
                before = snapshot(self)
                out = super().__torch_dispatch__(func, types, args, kwargs)
                self._watch_cast(out, length, before)
                return out
            out = super().__torch_dispatch__(func, types, args, kwargs)
            if not _has_tensor(out):
                # an op that made no tensor (``prim.device``: run or not by caches warmed by an
                # earlier step) changed no byte: its record would only tell the step's first run apart,
                # and its total is at most its modules' entry's or an earlier op's (:meth:`_entered`)
                del self.timeline[length:]
                self._last_record = last
            return out

        def _watch_cast(self, cast: torch.Tensor, born: int, before: Dict[Any, int]) -> None:
            """``cast`` (a parameter's copy in another dtype, born at record ``born``; the live
            bytes were ``before`` it) noted in :attr:`released_casts` if it dies while the
            forward's autocast ends, which frees its cache (flopcount.step.replay: such a cast
            dies with the last layer's, not with its own layer's stretch)."""
            grown = {key: value - before.get(key, 0) for key, value in snapshot(self).items() if value != before.get(key, 0)}
            me = weakref.ref(self)

            def died(_: Any) -> None:
                tracker = me()
                if tracker is not None and tracker._leaving_autocast:
                    tracker.released_casts.append((born, grown))

            self._cast_refs.append(weakref.ref(cast, died))

        @contextlib.contextmanager
        def autocast_region(self, region: Any) -> Iterator[None]:
            """``region`` (the forward's autocast) entered; when it ends normally, the casts its
            cache frees are noted (:meth:`_watch_cast`) with the timeline's length then."""
            with region:
                yield
                self._leaving_autocast = True
            self._leaving_autocast = False
            if self.timeline is not None:
                self.autocast_left = len(self.timeline)

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


_aten = torch.ops.aten
#: the aten operator a dtype cast (``tensor.to(dtype)``, autocast's) runs (a dispatcher key, as the
#: handler tables name operators; compared by identity: ``str(func)`` on every op cost ~0.3 us)
_DTYPE_COPY = _aten._to_copy.default


def _casts_a_parameter(func: Any, args: Sequence[Any]) -> bool:
    """Whether ``func`` copies a leaf tensor that requires grad (a parameter) to another dtype:
    the cast autocast makes of a weight, and keeps in its cache while it is on."""
    if func is not _DTYPE_COPY or not args:
        return False
    source = args[0]
    return isinstance(source, torch.Tensor) and source.is_leaf and source.requires_grad


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


def _gradless_call(args: Tuple[Any, ...]) -> Tuple[Any, ...]:
    """ModTracker's hook arguments (the module, its input, and its output for the post-hook) for a
    call made with grad mode off. Where a tensor among them requires grad (a parameter, or a view
    of one made under ``no_grad``, handed to a submodule), the input and output are given as flat
    tuples of their tensors with those detached: the same storages, so MemTracker books the same
    bytes, but no gradient hook is registered on them. No backward runs through such a call; and
    ModTracker's ``register_multi_grad_hook`` on a view made under ``no_grad`` raised "Expected
    gradient function to be set", so estimate_memory's inference step failed on such a model
    (DBRX's experts: torch's MemTracker alone fails there as well)."""
    module, *parts = args
    found = [output_tensors(part) for part in parts]
    if not any(t.requires_grad for tensors in found for t in tensors):
        return args
    return (module, *(tuple(t.detach() if t.requires_grad else t for t in tensors) for tensors in found))


def _own_thread_module_hooks(mod_tracker: Any, owner: int, entered: Callable[[], None]) -> None:
    """ModTracker registers its forward hooks process-wide (``register_module_forward_*_hook``
    of its ``_fw_pre_hook``/``_fw_post_hook``, looked up when it is entered): wrapped here so
    that another thread's modules neither enter this step's bookkeeping nor run its code
    (which raised inside that thread: issue #29 item 17). After the pre-hook (the module now
    among the running ones) ``entered`` is called: the module's peak starts there. Its backward
    is entered when the first gradient of its outputs arrives: ModTracker's post-hook registers
    a multi-grad hook (``mode="any"``) on them that adds the module to the running ones, and
    this one's, registered on the same tensors after it (so run after it), calls ``entered``:
    torch's public ``register_multi_grad_hook``, no private method of ModTracker's replaced."""
    from torch.autograd.graph import register_multi_grad_hook

    def enter_backward(grads: Any) -> None:
        entered()

    for name in ("_fw_pre_hook", "_fw_post_hook"):
        hook = getattr(mod_tracker, name, None)
        if hook is None:
            raise UsageError(f"torch {torch.__version__}'s ModTracker has no {name}, which flopcount's step needs")

        def only_owner(*args: Any, _hook: Any = hook, _pre: bool = name == "_fw_pre_hook", **kwargs: Any) -> Any:
            if threading.get_ident() != owner:
                return None
            if not torch.is_grad_enabled():
                args = _gradless_call(args)
            in_forward = not mod_tracker.is_bw
            out = _hook(*args, **kwargs)
            if _pre:
                entered()
            elif in_forward:  # ModTracker hooks the outputs' gradients only in the forward
                tensors = [t for t in output_tensors(args[2]) if t.requires_grad]
                if tensors:
                    register_multi_grad_hook(tensors, enter_backward, mode="any")
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


def backward_autocast(amp: Optional[torch.dtype], device_type: str) -> Any:
    """The step's backward and optimizer step context under ``amp``: the caller's autocast
    switched off on ``device_type`` (the AMP recipe runs them outside it), and nothing when
    the caller has none. A disabled autocast still counts as one: an autocast entered inside it
    (a checkpoint's recompute, a ``custom_bwd`` backward) is nested, and leaving it keeps the
    weight casts it cached until the disabled one ends, after the backward, where the recipe's
    bare ``loss.backward()`` frees them as each recompute ends (a checkpointed 3-block MLP's
    bf16 step: 198,528 B too many). Called before the forward's autocast is entered."""
    if amp is None or not autocast_nested():
        return contextlib.nullcontext()
    return torch.autocast(device_type, enabled=False)


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
    outside = backward_autocast(amp, device_type)
    inside = forward_autocast(amp, device_type)
    if tracker is not None and amp is not None:
        inside = tracker.autocast_region(inside)
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
