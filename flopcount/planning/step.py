"""One training step of a (possibly sharded) model, recorded: every local aten op with its
phase, every collective with its process group and tensor bytes, torch's MemTracker
peak, and the bytes of parameters, gradients and optimizer state this rank holds.

The same function runs in plan()'s fake world (fake tensors, "fake" process group) and
on a real rank (gloo or nccl), which is how the plan is checked against reality.
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import torch
from torch import nn

from flopcount.core.inputs import output_tensors
from flopcount.errors import UsageError
from flopcount.planning.world import PlanError, private
from flopcount.tracers._modules import ModuleStack, module_names
from flopcount.tracers._recorder import Recorder, _signature
from flopcount.types import OpEvent

OPTIMIZERS = ("adamw", "adam", "sgd", "sgd-momentum", "none")

#: process-group backends a plan models. Their collectives differ in the tensors they hold in
#: torch's allocator: NCCL reduces in place on the caller's buffers (its own staging buffers are
#: outside torch's allocator); gloo's ``_reduce_scatter_base_`` copies its whole input into a new
#: buffer, reduces that and copies this rank's chunk out, so for the collective's duration the
#: input is held twice (seen live: tests/plan/test_plan_mixed_precision.py). gloo's all-gather
#: and all-reduce work in place.
BACKENDS = ("nccl", "gloo")

#: collective kind of each c10d / functional-collective op (canonical op name)
COLLECTIVE_KINDS: Dict[str, str] = {
    "c10d::_allgather_base_": "all_gather",
    "c10d::allgather_": "all_gather",
    "c10d::allgather_into_tensor_coalesced_": "all_gather",
    "c10d::_reduce_scatter_base_": "reduce_scatter",
    "c10d::reduce_scatter_": "reduce_scatter",
    "c10d::reduce_scatter_tensor_coalesced_": "reduce_scatter",
    "c10d::allreduce_": "all_reduce",
    "c10d::allreduce_coalesced_": "all_reduce",
    "c10d::alltoall_": "all_to_all",
    "c10d::alltoall_base_": "all_to_all",
    "c10d::broadcast_": "broadcast",
    "_c10d_functional::all_gather_into_tensor": "all_gather",
    "_c10d_functional::all_gather_into_tensor_coalesced": "all_gather",
    "_c10d_functional::reduce_scatter_tensor": "reduce_scatter",
    "_c10d_functional::reduce_scatter_tensor_coalesced": "reduce_scatter",
    "_c10d_functional::all_reduce": "all_reduce",
    "_c10d_functional::all_reduce_": "all_reduce",
    "_c10d_functional::all_reduce_coalesced": "all_reduce",
    "_c10d_functional::all_to_all_single": "all_to_all",
    "_c10d_functional::broadcast": "broadcast",
}


@dataclass(frozen=True)
class Collective:
    """One collective call: its kind, op, process group name, phase and the bytes of the
    full (unsharded) buffer it moves: all-gather output, reduce-scatter input, all-reduce tensor."""

    kind: str
    op: str
    group: str
    phase: str
    tensor_bytes: int


@dataclass(frozen=True)
class StepRecord:
    """What one step of rank 0 did. ``memory_peak``: MemTracker's categories at the peak
    (``"Total"`` included); ``state_bytes``: parameters / gradients / optimizer_state held."""

    events: Tuple[OpEvent, ...]
    collectives: Tuple[Collective, ...]
    memory_peak: Mapping[str, int]
    state_bytes: Mapping[str, int]
    module_calls: Mapping[str, int]


def make_optimizer(optimizer: Union[str, Callable[[Any], Any], None], model: nn.Module) -> Optional[torch.optim.Optimizer]:
    """An optimizer over ``model``'s trainable parameters: a name (single-tensor kernels,
    ``foreach=False``, the same on every device) or ``callable(params) -> Optimizer``."""
    params = [p for p in model.parameters() if p.requires_grad]
    if callable(optimizer):
        made = optimizer(params)
        if not isinstance(made, torch.optim.Optimizer):
            raise UsageError(f"optimizer callable returned {type(made).__name__}, not a torch.optim.Optimizer")
        return made
    key = "none" if optimizer is None else str(optimizer).strip().lower()
    if key == "adamw":
        return torch.optim.AdamW(params, lr=1e-4, foreach=False)
    if key == "adam":
        return torch.optim.Adam(params, lr=1e-4, foreach=False)
    if key == "sgd":
        return torch.optim.SGD(params, lr=1e-3, foreach=False)
    if key == "sgd-momentum":
        return torch.optim.SGD(params, lr=1e-3, momentum=0.9, foreach=False)
    if key == "none":
        return None
    raise UsageError(f"unknown optimizer {optimizer!r} (known: {', '.join(OPTIMIZERS)}, or a callable params -> Optimizer)")


def _tensor_bytes(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(_tensor_bytes(v) for v in value)
    return 0


class _StepRecorder(Recorder):
    """flopcount's dispatch recorder that lets DTensor desugar into local ops first (so
    ops are seen with this rank's shard shapes), skips DTensor's sharding-propagation ops
    (run under a fake mode of its own) and notes each collective with its group."""

    def __init__(self, modules: ModuleStack, groups: Mapping[str, Any], backend: str = "nccl"):
        super().__init__(modules, answer_reads=False)
        self._backend = backend
        from torch.distributed.tensor import DTensor

        self._dtensor = DTensor
        self._active_fake_mode = private("active_fake_mode")
        self._entry_mode: Any = None
        self._groups = groups
        self.collectives: List[Collective] = []
        self.tracker: Any = None
        self._current_mode = private("_get_current_dispatch_mode")
        self._pop_mode = private("_pop_mode_temporarily")
        # DTensor derives output shapes by running the op on global-shape fakes under the
        # ambient fake mode (ours, in plan()'s fake world): those runs are not this rank's work
        propagator = private("ShardingPropagator")
        method = getattr(propagator, "_propagate_tensor_meta_non_cached", None)
        if method is None:
            raise PlanError("flopcount.plan needs torch's private ShardingPropagator._propagate_tensor_meta_non_cached")
        self._propagation_code = method.__code__

    def __enter__(self) -> Any:
        self._entry_mode = self._active_fake_mode()
        return super().__enter__()

    def __torch_dispatch__(self, func: Any, types: Any, args: Tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        dtensor = self._dtensor
        for kind in types:
            if issubclass(kind, dtensor):
                return NotImplemented
        if self._propagating():
            return self._unwatched(func, args, kwargs or {})
        if self._active_fake_mode() is not self._entry_mode:  # DTensor's own fake shape runs
            return func(*args, **(kwargs or {}))
        out = super().__torch_dispatch__(func, types, args, kwargs)
        name = _signature(func).name
        kind = COLLECTIVE_KINDS.get(name)
        if kind is not None and not self.muted:
            values = list(args) + list((kwargs or {}).values())
            size = max([_tensor_bytes(v) for v in values] + [_tensor_bytes(out)])
            self.collectives.append(Collective(kind, name, self._group_of(values), self.phase, size))
            if kind == "reduce_scatter" and self._backend == "gloo" and self.tracker is not None:
                self._gloo_scratch(values)
        return out

    def _gloo_scratch(self, values: Sequence[Any]) -> None:
        """gloo's copy of a reduce-scatter's input, allocated and freed under the memory
        tracker (which sits below this mode) at the moment the collective runs."""
        tensors = [v for v in values if isinstance(v, torch.Tensor)]
        tensors += [t for v in values if isinstance(v, (list, tuple)) for t in v if isinstance(t, torch.Tensor)]
        if tensors:
            largest = max(tensors, key=lambda t: t.numel() * t.element_size())
            scratch = torch.empty(largest.numel(), dtype=largest.dtype, device=largest.device)
            del scratch

    def _unwatched(self, func: Any, args: Tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
        """Run a shape-propagation op past our memory tracker too: on a real rank DTensor runs
        it in a fake mode of its own, which MemTracker ignores; in the fake world it shares ours."""
        if self.tracker is not None and self._current_mode() is self.tracker:
            with self._pop_mode():
                return func(*args, **kwargs)
        return func(*args, **kwargs)

    def _propagating(self) -> bool:
        frame = sys._getframe(2)
        code = self._propagation_code
        for _ in range(8):
            if frame is None:
                return False
            if frame.f_code is code:
                return True
            frame = frame.f_back  # type: ignore[assignment]
        return False

    def _group_of(self, values: Sequence[Any]) -> str:
        import torch.distributed as dist

        for value in values:
            if isinstance(value, str) and value in self._groups:
                return value
            if isinstance(value, torch.ScriptObject):
                try:
                    return str(dist.ProcessGroup.unbox(value).group_name)
                except Exception:  # not a process group
                    continue
        return ""


def default_loss(outputs: Any) -> torch.Tensor:
    """The sum of every floating output that requires grad (HF ModelOutput: its logits)."""
    roots = [t for t in output_tensors(outputs) if t.requires_grad and t.is_floating_point()]
    if not roots:
        raise UsageError("no floating output requires grad: nothing to differentiate (pass loss_fn=)")
    loss = roots[0].sum()
    for extra in roots[1:]:
        loss = loss + extra.sum()
    return loss


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return getattr(tensor, "_local_tensor", tensor)


def state_bytes(model: nn.Module, optimizer: Optional[torch.optim.Optimizer]) -> Dict[str, int]:
    """Bytes of this rank's parameter shards, gradient shards and optimizer state."""
    params = list(model.parameters())
    grads = [p.grad for p in params if p.grad is not None]
    states: List[torch.Tensor] = []
    if optimizer is not None:
        for state in optimizer.state.values():
            states.extend(v for v in state.values() if isinstance(v, torch.Tensor))
    return {
        "parameters": sum(_tensor_bytes(_local(p)) for p in params),
        "gradients": sum(_tensor_bytes(_local(g)) for g in grads),
        "optimizer_state": sum(_tensor_bytes(_local(s)) for s in states),
    }


def _peak_only(base: Any) -> Any:
    """torch's tracker class without its per-module peak bookkeeping, which walks every
    module ever seen on every op (ops x modules: minutes for an 80-layer model); the
    global peak, all plan() reads, is kept exactly as torch keeps it."""
    if not callable(getattr(base, "_update_peak_stats", None)):
        raise PlanError(f"flopcount.plan needs torch's private {base.__name__}._update_peak_stats")

    class PeakOnly(base):
        def _update_peak_stats(self, peak_state: Any) -> None:
            for device, snapshot in self._curr_mem_snap.items():
                if self._peak_mem.get(device, 0) < snapshot["Total"]:
                    self._peak_mem[device] = snapshot["Total"]
                    self._peak_mem_snap[device] = dict(snapshot)

    return PeakOnly


def _memory_tracker(
    model: nn.Module, optimizer: Optional[torch.optim.Optimizer], inputs: Sequence[torch.Tensor], peak_only: bool
) -> Any:
    from torch.distributed.fsdp import FSDPModule

    if isinstance(model, FSDPModule):
        base = private("FSDPMemTracker")
        tracker = (_peak_only(base) if peak_only else base)(model, optimizer)
        tracker.track_inputs(tuple(inputs))
        return tracker
    base = private("MemTracker")
    tracker = (_peak_only(base) if peak_only else base)()
    tracker.track_external(model, *([optimizer] if optimizer is not None else []), *inputs)
    return tracker


def run_step(
    model: nn.Module,
    optimizer: Optional[torch.optim.Optimizer],
    args: Tuple[Any, ...],
    kwargs: Mapping[str, Any],
    loss_fn: Optional[Callable[[Any], Any]] = None,
    groups: Optional[Mapping[str, Any]] = None,
    track_memory: bool = True,
    peak_only: bool = True,
    backend: str = "nccl",
) -> StepRecord:
    """Run forward, backward and ``optimizer.step()`` once, recording everything (the model's
    outputs are released once the loss is made, before the backward).
    ``peak_only=False`` keeps torch's tracker exactly as it is (per-module stats too).
    ``backend="gloo"`` in a fake world: each reduce-scatter also holds gloo's copy of its
    input while it runs (see :data:`BACKENDS`); on a real rank leave it "nccl" (the real
    backend's buffers are seen as they are)."""
    flat = [t for t in list(args) + list(kwargs.values()) if isinstance(t, torch.Tensor)]
    modules = ModuleStack(module_names(model))
    recorder = _StepRecorder(modules, groups or {}, backend)
    tracker = _memory_tracker(model, optimizer, flat, peak_only) if track_memory else contextlib.nullcontext()
    recorder.tracker = tracker if track_memory else None
    with tracker, modules, recorder:
        outputs = model(*args, **kwargs)
        loss = (loss_fn or default_loss)(outputs)
        # released before backward, as in ``loss = loss_fn(model(x)); loss.backward()`` and as
        # estimate_memory does: kept, they would hold the outputs' bytes through the backward
        del outputs
        recorder.phase = "backward"
        loss.backward()
        del loss
        if optimizer is not None:
            recorder.phase = "optimizer"
            optimizer.step()
    peak: Dict[str, int] = {}
    if track_memory:
        for snapshot in tracker.get_tracker_snapshot("peak").values():  # type: ignore[union-attr]
            for key, value in snapshot.items():
                name = str(getattr(key, "value", key))  # a _RefType enum member, or "Total"
                peak[name] = peak.get(name, 0) + int(value)
    return StepRecord(
        tuple(recorder.events), tuple(recorder.collectives), peak, state_bytes(model, optimizer), dict(modules.calls)
    )
