"""One training step of a (possibly sharded) model, recorded: every local aten op with its
phase, every collective with its process group and tensor bytes, the step's MemTracker
peak, and the bytes of parameters, gradients and optimizer state this rank holds. The step
itself is flopcount.step.runner's, the one estimate_memory runs.

The same function runs in plan()'s fake world (fake tensors, "fake" process group) and
on a real rank (gloo or nccl), which is how the plan is checked against reality.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass
from typing import Any, Callable, Dict, FrozenSet, List, Mapping, Optional, Sequence, Tuple, Union

import torch
from torch import nn

from flopcount.bench.peak import has_frozen
from flopcount.core.inputs import flat_values, output_tensors
from flopcount.planning.world import PlanError, private
from flopcount.step.autocast import amp_device
from flopcount.step.optimizers import OptimizerSpec, build_optimizer, gradless
from flopcount.step.replay import categories, local_shard, record_forward_calls
from flopcount.step.runner import peak_tracker, run_step
from flopcount.tracers._modules import ModuleStack, module_names
from flopcount.tracers._recorder import Recorder, _signature, outputs_of, value_of
from flopcount.tracers._vocabulary import CompositeInterceptor, _autocast_on
from flopcount.types import OpEvent

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
    #: names of the trainable parameters the step gave no gradient (a layer the forward skips,
    #: an unused head) that hold optimizer state: a real run's steady state holds none for them
    gradless: FrozenSet[str] = frozenset()
    #: a floating parameter of the model does not require grad (MFU's model FLOPs: bench.peak.model_flops)
    frozen: bool = False
    #: what the reading's warnings say about the step (transformers' tracing path taken on fakes)
    notes: Tuple[str, ...] = ()


def no_optimizer(optimizer: Any) -> bool:
    """``plan(optimizer=None)`` or ``"none"``: a step without an optimizer."""
    return optimizer is None or (isinstance(optimizer, str) and optimizer.strip().lower() == "none")


def make_optimizer(optimizer: Union[OptimizerSpec, None], model: nn.Module) -> Optional[torch.optim.Optimizer]:
    """The step's optimizer over ``model``'s trainable parameters, from the one factory
    (:func:`flopcount.step.optimizers.build_optimizer`: a name, a class or ``callable(params)``);
    None for ``None`` or ``"none"``."""
    if optimizer is None or no_optimizer(optimizer):
        return None
    return build_optimizer(optimizer, {id(p): p for p in model.parameters()}, list(model.parameters()), "plan")[0]


def _tensor_bytes(value: Any) -> int:
    """Bytes of the tensors in ``value`` (nested lists and tuples walked)."""
    return sum(t.numel() * t.element_size() for t in output_tensors(value))


class _StepRecorder(Recorder):
    """flopcount's dispatch recorder that lets DTensor desugar into local ops first (so
    ops are seen with this rank's shard shapes), skips DTensor's sharding-propagation ops
    (run under a fake mode of its own) and notes each collective with its group."""

    def __init__(self, modules: ModuleStack, groups: Mapping[str, Any], backend: str = "nccl"):
        super().__init__(modules, answer_reads=False)
        self._backend = backend
        from torch.distributed.tensor import DTensor

        self._dtensor = DTensor
        self._groups = groups
        self.collectives: List[Collective] = []
        self.shape_runs: Callable[[], bool] = lambda: False
        #: the memory tracker's timeline, when one is kept (flopcount.step.replay): each event
        #: and collective is stamped with the timeline's length when it was recorded
        self.timeline: Optional[List[Any]] = None
        self.event_stamps: List[int] = []
        self.collective_stamps: List[int] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        if any(issubclass(kind, self._dtensor) for kind in types):
            return NotImplemented
        if self.shape_runs():  # DTensor's shape propagation: not this rank's work
            return func(*args, **(kwargs or {}))
        out = super().__torch_dispatch__(func, types, args, kwargs)
        self._stamp()
        name = _signature(func).name
        kind = COLLECTIVE_KINDS.get(name)
        if kind is not None and not self.muted:
            values = list(args) + list((kwargs or {}).values())
            size = max([_tensor_bytes(v) for v in values] + [_tensor_bytes(out)])
            self.collectives.append(Collective(kind, name, self._group_of(values), self.phase, size))
            if self.timeline is not None:
                self.collective_stamps.append(len(self.timeline))
            if kind == "reduce_scatter" and self._backend == "gloo":
                self._gloo_scratch(values)
        return out

    def record(self, op: str, args: Dict[str, Any], outputs: Tuple[Any, ...]) -> None:
        """A composite's one event (see :class:`_StepInterceptor`), stamped now."""
        super().record(op, args, outputs)
        self._stamp()

    def _stamp(self) -> None:
        """Each event recorded since the last stamp gets the timeline's length now (replay only)."""
        if self.timeline is not None:
            self.event_stamps.extend([len(self.timeline)] * (len(self.events) - len(self.event_stamps)))

    def _gloo_scratch(self, values: Sequence[Any]) -> None:
        """gloo's copy of a reduce-scatter's input, allocated and freed under the memory
        tracker (which sits below this mode) at the moment the collective runs."""
        tensors = [t for t in flat_values(values) if isinstance(t, torch.Tensor)]
        if tensors:
            largest = max(tensors, key=lambda t: t.numel() * t.element_size())
            torch.empty(largest.numel(), dtype=largest.dtype, device=largest.device)  # freed at once: nothing holds it

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


class _StepInterceptor(CompositeInterceptor):
    """count_flops' composite vocabulary on the step (one vocabulary of cost across readings,
    issue #27): a composite call (``F.linear``, ``F.scaled_dot_product_attention``, ...) is one
    event priced by its handler, the aten ops it runs muted, as the dispatch tracer books it.
    A call on DTensors passes straight through (DTensor desugars it into this rank's local ops,
    which the recorder books with the shard shapes), and so does DTensor's shape propagation.
    Under ``autocast=`` too: autocast casts below the torch-function level, so only the aten ops
    show the dtypes the kernels read (and the casts); count_flops has no autocast to agree with."""

    def __init__(self, recorder: _StepRecorder):
        super().__init__(recorder, value_of, outputs_of)
        self._step = recorder

    def __torch_function__(self, func: Any, types: Any, args: Tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if self._table.get(func) is None or self._step.shape_runs() or _autocast_on():
            return func(*args, **kwargs)
        if any(isinstance(value, self._step._dtensor) for value in flat_values((*args, *kwargs.values()))):
            return func(*args, **kwargs)
        return super().__torch_function__(func, types, args, kwargs)


def state_bytes(model: nn.Module, optimizer: Optional[torch.optim.Optimizer]) -> Dict[str, int]:
    """Bytes of this rank's parameter shards, gradient shards and optimizer state."""
    params = list(model.parameters())
    grads = [p.grad for p in params if p.grad is not None]
    held = optimizer.state.values() if optimizer is not None else ()
    states = [v for state in held for v in state.values() if isinstance(v, torch.Tensor)]
    return {
        "parameters": sum(_tensor_bytes(local_shard(p)) for p in params),
        "gradients": sum(_tensor_bytes(local_shard(g)) for g in grads),
        "optimizer_state": sum(_tensor_bytes(local_shard(s)) for s in states),
    }


class ShapeRuns:
    """Whether the op now dispatched is DTensor's sharding propagation rather than this rank's
    work. DTensor learns an op's global output shape by running it on global-shape fakes
    inside ``with detect_fake_mode() or FakeTensorMode():``. On a real rank that is a fake
    mode of its own, told apart as torch's MemTracker does: the active fake mode is not the
    one there was when the step began. In plan's fake world it is the step's own mode,
    entered once more: its ``enter_stack`` is deeper than when the step began (an O(1) look
    per op; no frame is walked, and no method name of DTensor's is relied on)."""

    def __init__(self) -> None:
        self._active = private("active_fake_mode")
        self._entry = self._active()
        if self._entry is not None and not isinstance(getattr(self._entry, "enter_stack", None), list):
            raise PlanError("flopcount.plan needs torch's private FakeTensorMode.enter_stack (a list)")
        self._depth = _depth(self._entry)

    def __call__(self) -> bool:
        mode = self._active()
        return mode is not self._entry or (mode is not None and _depth(mode) > self._depth)


def _depth(mode: Any) -> int:
    return 0 if mode is None else len(mode.enter_stack)


def _memory_tracker(model: nn.Module, optimizer: Optional[torch.optim.Optimizer]) -> Any:
    """The step's one MemTracker subclass (flopcount.step.runner) over torch's
    FSDPMemTracker for an FSDP2 model, else over MemTracker."""
    from torch.distributed.fsdp import FSDPModule

    if isinstance(model, FSDPModule):
        return _skipping_tolerated(peak_tracker(private("FSDPMemTracker")))(model, optimizer)
    return peak_tracker(private("MemTracker"))()


@functools.cache
def _skipping_tolerated(base: type) -> type:
    """``base`` (over torch's FSDPMemTracker) that lets an FSDP2 module the forward never
    called (a skipped layer, an unused head wrapped on its own) go through backward as FSDP2
    does. torch's tracker wraps each parameter group's ``post_backward`` (FSDP2 calls it for
    every group at the end of backward, run or not) and reads ``memory_tracking[module]`` and
    each parameter's unsharded copy there; a module that never ran forward has neither (FSDP2
    itself checks for the copy and skips the group: no gradient, no reduce-scatter), and
    torch's wrapper raised ``AttributeError: 'FSDPParam' object has no attribute
    '_unsharded_param'``. For such a module FSDP2's own ``post_backward`` is called, unwatched:
    it allocates nothing, so there is nothing to watch."""

    class SkipTolerant(base):
        def _fsdp_param_group_post_backward(self, fsdp_mod: nn.Module, orig: Callable[..., Any]) -> Callable[..., Any]:
            watched = super()._fsdp_param_group_post_backward(fsdp_mod, orig)

            @functools.wraps(orig)
            def post_backward(*args: Any, **kwargs: Any) -> Any:
                if fsdp_mod not in self.memory_tracking:  # its forward never ran in this step
                    return orig(*args, **kwargs)
                return watched(*args, **kwargs)

            return post_backward

    return SkipTolerant


def record_step(
    model: nn.Module,
    optimizer: Optional[torch.optim.Optimizer],
    args: Tuple[Any, ...],
    kwargs: Mapping[str, Any],
    loss_fn: Optional[Callable[[Any], Any]] = None,
    groups: Optional[Mapping[str, Any]] = None,
    backend: str = "nccl",
    amp: Optional[torch.dtype] = None,
    replay: Optional[Any] = None,
    seeds: Tuple[Sequence[Any], Sequence[Any]] = ((), ()),
) -> StepRecord:
    """Run one training step (:func:`flopcount.step.runner.run_step`: forward, the loss,
    the outputs released, backward, ``optimizer.step()``), recording everything.
    ``backend="gloo"`` in a fake world: each reduce-scatter also holds gloo's copy of its
    input while it runs (see :data:`BACKENDS`); on a real rank leave it "nccl" (the real
    backend's buffers are seen as they are). ``amp``: the forward under ``torch.autocast``.
    ``seeds``: (fakes, reals), each fake input standing for the caller's tensor at its place (the
    index checks read the caller's token ids: fake/indices.py)."""
    flat = [t for t in list(args) + list(kwargs.values()) if isinstance(t, torch.Tensor)]
    modules = ModuleStack(module_names(model))
    recorder = _StepRecorder(modules, groups or {}, backend)
    recorder.indices.seed(*seeds)
    tracker = _memory_tracker(model, optimizer)
    recorder.shape_runs = tracker.skip = ShapeRuns()
    tracker.watch(model, optimizer, flat)
    hooks: Any = contextlib.nullcontext()
    if replay is not None:  # a cut model's run kept as a timeline (plan's reuse)
        tracker.timeline = recorder.timeline = replay.timeline
        tracker.layer_tensors = replay.layer_tensors
        hooks = record_forward_calls(model, tracker, replay.timeline)

    interceptor = _StepInterceptor(recorder)
    with hooks, tracker, modules, interceptor, recorder:
        run_step(
            model, args, kwargs, optimizer=optimizer, loss_fn=loss_fn, amp=amp,
            device_type=amp_device(model, args, kwargs), tracker=tracker, on_phase=lambda phase: setattr(recorder, "phase", phase),
        )
    if replay is not None:
        replay.recorder, replay.tracker = recorder, tracker
    return StepRecord(
        tuple(recorder.events), tuple(recorder.collectives), categories(tracker.peak_snapshot), state_bytes(model, optimizer),
        dict(modules.calls),
        gradless(model, optimizer), frozen=has_frozen(model),
    )

