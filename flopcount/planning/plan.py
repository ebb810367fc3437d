"""``flopcount.plan``: one rank's FLOPs, memory and communication for one training step
under FSDP2 and tensor parallelism, planned on torch's own distributed engine in one
process: a ``"fake"`` world of ``fsdp x tp`` ranks, ``fully_shard`` and
``parallelize_module`` applied to a model built on the meta device, and the step run on
fake tensors (nothing allocated, nothing sent) while flopcount's dispatch recorder and
torch's MemTracker watch rank 0. See docs/parallel.md.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any, Callable, Dict, FrozenSet, List, Mapping, Optional, Set, Tuple, Union

import torch
from torch import nn

from flopcount.bench.peak import model_flops
from flopcount.core.analysis import cost_events
from flopcount.core.collection import PausedCollections
from flopcount.core.deprecation import modeled_part
from flopcount.core.dtypes import optional_dtype
from flopcount.core.inputs import as_call_args, describe_inputs, flatten_tensors
from flopcount.core.ledger import TOTAL_FIELDS, Ledger
from flopcount.core.registry import HandlerRegistry
from flopcount.core.state import FoundState, forward_globals, left_as_found, preserved_random_modules, preserved_rng
from flopcount.devices import column_of, find_part, is_this_machine, known_names, op_time, part_hint, part_roofs
from flopcount.errors import FlopcountWarning, TraceError, UsageError, int_at_least
from flopcount.handlers import default_registry
from flopcount.planning.result import CommRow, LinkSpec, PlanResult, StepTimeBounds, links_by_dim, ring_factor
from flopcount.planning.step import (
    BACKENDS,
    COLLECTIVE_KINDS,
    Collective,
    StepRecord,
    make_optimizer,
    no_optimizer,
    record_step,
)
from flopcount.planning.world import (
    PlanError,
    check_mixed_precision,
    fake_world,
    mesh_groups,
    parallelize,
    split_refusal,
    takes_llama_split,
    transformer_blocks,
)
from flopcount.step.loss import default_loss
from flopcount.step.optimizers import UNTRACKED_SPARSE, check_spec, sparse_gradient, warm_up
from flopcount.step.parent_walk import globals_state, model_state, parent_proven
from flopcount.step.replay import Replay, Stack, Template, categories, find_stack, truncated
from flopcount.tracers import trace
from flopcount.tracers._modules import failing_module, forward_error, module_names
from flopcount.tracers._reuse import reuse_enabled
from flopcount.tracers.fake.copies import quiet_fake_logs
from flopcount.tracers.fake.hf_tracing import real_branches
from flopcount.tracers.fake.meta_kernels import refused_by_real_kernel
from flopcount.types import Cost, OpEvent, TensorMeta, dtype_name

__all__ = ["plan", "PlanResult"]

#: MemTracker / FSDPMemTracker category -> PlanResult.memory key
_MEMORY_KEYS = {
    "Sharded Param": "sharded_params",
    "Unsharded Param": "unsharded_params",
    "Parameter": "sharded_params",
    "Sharded Grad": "gradients",
    "Unsharded Grad": "unsharded_gradients",
    "Gradient": "gradients",
    "OptState": "optimizer_state",
    "Optstate": "optimizer_state",
    "Activation": "activations",
    "Temp": "temporaries",
    "All Gather": "all_gather_buffers",
    "Reduce Scatter": "reduce_scatter_buffers",
    "Buffer": "buffers",
    "Inputs": "inputs",
    "Other": "inputs",
}


#: the modeled part of ``plan(on=)`` when none is named
_DEFAULT_PART = "h100"
_UNSET: Any = object()


def _skipped(op: str) -> bool:
    """Ops booked as communication or bookkeeping rather than FLOPs."""
    return op in COLLECTIVE_KINDS or op.startswith(("c10d::", "_c10d_functional::", "fsdp::", "profiler::"))


def plan(
    build: Callable[[], nn.Module],
    inputs: Any = (),
    kwargs: Optional[Mapping[str, Any]] = None,
    *,
    fsdp: int = 1,
    tp: int = 1,
    optimizer: Union[str, Callable[[Any], Any], None] = "adamw",
    loss_fn: Optional[Callable[[Any], Any]] = None,
    on: Optional[str] = _DEFAULT_PART,
    link: LinkSpec = None,
    tp_plan: Optional[Mapping[str, Any]] = None,
    mixed_precision: Union[None, str, torch.dtype] = None,
    registry: Optional[HandlerRegistry] = None,
    backend: str = "nccl",
    autocast: Union[None, str, torch.dtype] = None,
    device: Any = _UNSET,
) -> PlanResult:
    """Per-rank cost of one training step (forward, backward, ``optimizer.step()``) of the
    model ``build()`` returns, sharded over ``fsdp x tp`` ranks.

    ``build`` is called on the meta device inside a fake world (so a 70B model allocates
    nothing); ``inputs``/``kwargs`` are one rank's micro-batch (only shapes and dtypes are
    used). FSDP2 wraps each repeated block and the root; ``tp > 1`` applies ``tp_plan``
    (``{module path: ParallelStyle}``, wildcards allowed) or the built-in Megatron plan.
    ``on``: the modeled GPU of the step-time roofline (None: no times; ``device=`` is its
    deprecated 0.2 name: a plan always runs on the meta device); ``link``: a link
    name (see ``flopcount.planning.result.LINKS``), bytes/s, or ``{"dp": ..., "tp": ...}``.
    ``mixed_precision`` (e.g. "bfloat16"): FSDP2 computes in that dtype and reduces
    gradients in float32 while parameters and optimizer state keep the model's dtype.
    ``backend``: the process-group backend whose collective buffers the peak includes:
    "nccl" (in place, the default) or "gloo" (its reduce-scatter holds a copy of its input).
    ``autocast`` (e.g. "bfloat16"): the forward and loss run under ``torch.autocast`` and the
    backward and optimizer step outside it (the AMP recipe, as ``estimate_memory(autocast=)``;
    torch's CPU autocast op list, the one the fake world runs). The step (loss rule, outputs
    released, steady-state optimizer) is ``estimate_memory``'s: a one-rank plan's peak is its peak.
    A default process group already initialised is left alone: plan() raises instead.
    Threads: the fake world is the process's default process group while it lasts, so plans
    run one at a time (a second thread's plan waits); a plan inside a plan is a UsageError.
    Measures nothing and writes no file. A stack of identical layers is planned cut to 3 and 4
    layers and the rest replayed, exactly, where the 4-layer run checks out and the forward around
    the layers is proven to treat every middle layer alike (flopcount.step.replay and parent_walk;
    not with a ``tp_plan`` of yours; ``FLOPCOUNT_REUSE=0`` traces every layer).
    """
    # device= is on='s 0.2 name; None means "no step times" for both, so "not given" is a marker
    on_given = _UNSET if on == _DEFAULT_PART else on
    on = modeled_part(on_given, device, "plan", default=_DEFAULT_PART, unset=_UNSET)
    fsdp = int_at_least(fsdp, 1, "fsdp")
    tp = int_at_least(tp, 1, "tp")
    if not callable(build) or isinstance(build, nn.Module):
        raise UsageError(f"build must be a callable returning the model (e.g. a lambda), got {type(build).__name__}")
    if not no_optimizer(optimizer):  # said now, not after the model is built and traced
        check_spec(optimizer, "plan")
    gpu = gpu_key(on)
    compute = optional_dtype(mixed_precision, "plan: mixed_precision", "floating")
    check_mixed_precision(compute, fsdp)  # said now, not after the model is built and traced
    amp = optional_dtype(autocast, "plan: autocast", "floating")
    if backend not in BACKENDS:
        raise UsageError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if registry is not None and not isinstance(registry, HandlerRegistry):
        raise UsageError(f"registry must be a flopcount HandlerRegistry, got {type(registry).__name__}")
    costs = registry if registry is not None else default_registry()
    args, kw = as_call_args(() if inputs is None else inputs, kwargs)
    # the automatic collector paused over the fake steps (as estimate_memory): a collection in
    # the middle of a step frees garbage cycles at a moment set by the process's history
    # the globals and class data the forwards of each model built write: set back (core/state.left_as_found)
    with preserved_rng(), preserved_random_modules(), left_as_found() as found, quiet_fake_logs(), \
            fake_world(fsdp, tp) as mesh, PausedCollections():
        build = _noted(build, found)
        groups = mesh_groups(mesh)
        dims = tuple(name for name, _ in groups.values())
        links = links_by_dim(link, dims)

        def planned(stateless: FrozenSet[str], split: int = tp, split_plan: Any = tp_plan) -> Tuple[str, int, StepRecord, str]:
            """Rank 0's step with tensor parallelism ``split`` (the plan's, or 1 for the check
            below): its layers replayed where they can be, else traced in full."""
            layered = _layered_step(
                build, mesh, fsdp, split, split_plan, compute, args, kw, optimizer, loss_fn, groups, backend, amp,
                costs, stateless,
            )
            if layered is not None:
                return layered
            model = _built(build)
            builtin_llama = split > 1 and split_plan is None and takes_llama_split(model)
            prefix, wrapped = parallelize(model, mesh, fsdp, split, split_plan, compute)
            try:
                record, dtype = _fake_step(model, args, kw, optimizer, loss_fn, groups, backend, amp, stateless=stateless)
            except TraceError as exc:
                cause = exc.__cause__
                if not builtin_llama or cause is None:
                    raise
                refusal = split_refusal(cause, model, prefix, split, runs_unsplit=lambda: runs_with_tp1(stateless))
                if refusal is None:
                    raise
                raise refusal from exc
            return prefix, wrapped, record, dtype

        def runs_with_tp1(stateless: FrozenSet[str]) -> bool:
            """Whether the step runs with the model built again, FSDP as asked, no tensor
            parallelism (:func:`planned` with tp=1: a 14-layer StableLM's check traces 3 + 4
            layers, not 14). Any failure: False (the step's own error then stands)."""
            try:
                planned(stateless, split=1, split_plan=None)
            except Exception:
                return False
            return True

        prefix, wrapped, record, dtype = planned(frozenset())
        if record.gradless:  # parameters the step gives no gradient: planned again without their optimizer state
            prefix, wrapped, record, dtype = planned(record.gradless)
    if compute is not None or amp is not None:
        dtype = dtype_name(compute or amp)
    costed = cost_events(tuple(e for e in record.events if not _skipped(e.call.op)), costs)
    flops, macs, by_operator, unsupported = _book(costed)
    comm = _comm_rows(record.collectives, groups, links)
    tokens = _tokens(args, kw)
    # one rank communicates nothing: its step time is known without a link
    bounds = _bounds(costed, comm, gpu, dtype, bool(links) or not dims)
    notes = _notes(unsupported, bool(links) or not dims, gpu) + record.notes
    with preserved_rng():
        model_flops, why = _model_flops(build, args, kw, tp, flops, loss_fn, costs, record.frozen)
    if why:
        notes += (why,)
    bounds = _utilisation(bounds, model_flops, sum(flops.values()))
    if unsupported:
        warnings.warn(f"plan: {notes[0]}; see PlanResult.unsupported or register a handler", FlopcountWarning, stacklevel=2)
    memory: Dict[str, int] = {}
    for key, value in record.memory_peak.items():
        if key != "Total":
            name = _MEMORY_KEYS.get(key, key)
            memory[name] = memory.get(name, 0) + value
    return PlanResult(
        fsdp=fsdp, tp=tp, on=gpu or "", dtype=dtype, backend=backend, flops=flops, macs=macs,
        peak_bytes=record.memory_peak.get("Total", sum(memory.values())), memory=memory,
        state_bytes=dict(record.state_bytes), comm=comm, step_time=bounds, blocks=prefix, wrapped_blocks=wrapped,
        tokens=tokens, unsupported=unsupported, by_operator=by_operator, notes=notes, model_flops=model_flops,
        inputs=describe_inputs(args, kw),
    )


def gpu_key(device: Optional[str]) -> Optional[str]:
    """The part a GPU name names (flopcount.devices, exactly or by a documented alias; None
    for None); UsageError listing the parts when unknown."""
    if device is None:
        return None
    if is_this_machine(str(device)):
        raise UsageError("plan: on='this machine' has no link between ranks to time the collectives on: name a part "
                         "(h100, a100...), or leave on out for no step times")
    part = find_part(str(device))
    if part is None:  # the words count and serve use (not their 'this machine')
        raise UsageError(f"unknown part {device!r}; known parts: {known_names()} (aliases in docs/devices.md), "
                         f"or on left out for no step times{part_hint(str(device))}")
    return part.name


def _noted(build: Callable[[], nn.Module], found: FoundState) -> Callable[[], nn.Module]:
    """``build``, whose model's classes ``found`` reads as each is built (before its forwards run)."""

    def built() -> nn.Module:
        model = build()
        if isinstance(model, nn.Module):
            found.add(model.modules())
        return model

    return built


def _built(build: Callable[[], nn.Module]) -> nn.Module:
    try:
        with torch.device("meta"):
            model = build()
    except Exception as exc:
        raise TraceError(f"build() failed on the meta device: {type(exc).__name__}: {exc}") from exc
    if not isinstance(model, nn.Module):
        raise UsageError(f"build() must return a torch.nn.Module, got {type(model).__name__}")
    if next(model.parameters(), None) is None:
        raise UsageError(
            f"plan: {type(model).__name__} has no parameters, so a training step has nothing to shard or update; "
            "plan a model with parameters (estimate_memory and count_flops take any model)"
        )
    found = sparse_gradient(model, "plan", UNTRACKED_SPARSE + "plan it with sparse=False (a dense gradient of the whole table)")
    if found is not None:  # MemTracker reads every tensor's storage, which a sparse gradient has not
        raise TraceError(found[1], module_path=found[0])
    return model.train()


def _layered_step(
    build: Callable[[], nn.Module], mesh: Any, fsdp: int, tp: int, tp_plan: Optional[Mapping[str, Any]],
    compute: Optional[torch.dtype], args: Tuple[Any, ...], kw: Mapping[str, Any], optimizer: Any, loss_fn: Any,
    groups: Mapping[str, Any], backend: str, amp: Optional[torch.dtype], registry: HandlerRegistry,
    stateless: FrozenSet[str] = frozenset(),
) -> Optional[Tuple[str, int, StepRecord, str]]:
    """:func:`_cut_steps`, and None (trace the whole model) where the cut runs wrote a global the
    model's forwards name (a call counter: the cut runs cannot show what the whole would do at
    layer 6); such a global, and the class data the forwards write, is set back to what the runs
    found (:class:`~flopcount.core.state.FoundState`), so the full trace starts there."""
    if not reuse_enabled() or tp_plan is not None:
        return None
    first = _built(build)
    bound = forward_globals(first.modules())
    before = globals_state(bound)
    found = FoundState()
    found.add(first.modules())
    made = _cut_steps(first, build, mesh, fsdp, tp, compute, args, kw, optimizer, loss_fn, groups, backend, amp, registry,
                      stateless)
    if globals_state(bound) != before:
        found.set_back()
        return None
    return made


def _cut_steps(
    first: nn.Module, build: Callable[[], nn.Module], mesh: Any, fsdp: int, tp: int, compute: Optional[torch.dtype],
    args: Tuple[Any, ...], kw: Mapping[str, Any], optimizer: Any, loss_fn: Any, groups: Mapping[str, Any], backend: str,
    amp: Optional[torch.dtype], registry: HandlerRegistry, stateless: FrozenSet[str],
) -> Optional[Tuple[str, int, StepRecord, str]]:
    """Rank 0's step with its repeated layers replayed (flopcount.step.replay, as
    estimate_memory): the model built, cut to 3 units of the stack's period (the template) and
    to 4 (the check), each sharded and stepped; where the check's timeline, op events and
    collectives are the template's stretched to 4 units, the whole model's are the template's
    stretched to all of them, and its state bytes and wrapped blocks the template's plus one
    unit's per unit more. None (trace the whole model) where that does not apply or the check differs.
    ``first``: the model built for the template (the check builds its own)."""
    runs = []
    periods: Set[Tuple[int, int]] = set()
    for units in (Template.UNITS, Template.UNITS + 1):
        model = first if units == Template.UNITS else _built(build)
        stack = find_stack(model)
        if stack is None:
            return None
        periods.add((stack.period, stack.head))
        path = next(name for name, module in model.named_modules() if module is stack.layers)
        if transformer_blocks(model)[0] != path:  # FSDP wraps another list's blocks: not this one's
            return None
        if len(periods) > 1:  # the check's build found another unit (or head) than the template's
            return None
        if units == Template.UNITS and not _parent_walked(model, stack, args, kw, amp):
            return None  # the parent's forward may treat some middle unit otherwise: traced in full
        keep = stack.kept(units)
        replay = Replay([], stack, keep)
        try:
            with truncated(stack, keep):
                prefix, wrapped = parallelize(model, mesh, fsdp, tp, None, compute)  # no tp_plan of the caller's here
                record, dtype = _fake_step(model, args, kw, optimizer, loss_fn, groups, backend, amp, replay, stateless)
        except Exception:  # the cut model cannot run as the whole: the whole is traced
            return None
        list_name = replay.tracker._mod_tracker.get_known_fqn(stack.layers) if replay.tracker is not None else None
        if list_name is None:
            return None
        runs.append((prefix, wrapped, record, dtype, replay, list_name))
    (prefix, wrapped3, record3, dtype, replay3, name), (_, wrapped4, record4, _, replay4, _) = runs
    template = Template.of(replay3.timeline, name + ".", period=replay3.stack.period, head=replay3.stack.head)
    if template is None or not template.checked(replay4.timeline):
        return None
    rec3, rec4 = replay3.recorder, replay4.recorder
    # the op events the reading books: those with a cost or without a handler (a view costs
    # nothing, and FSDP's lazy init makes some per layer outside the layers' stretches)
    stamps3, events3 = _booked(rec3.event_stamps, rec3.events, registry)
    _, events4 = _booked(rec4.event_stamps, rec4.events, registry)
    keys3 = [_event_key(e) for e in events3]
    if template.spread(Template.UNITS + 1, stamps3, keys3) != [_event_key(e) for e in events4]:
        return None
    if template.spread(Template.UNITS + 1, rec3.collective_stamps, rec3.collectives) != rec4.collectives:
        return None
    units = replay3.stack.units
    extra = units - Template.UNITS
    figures = template.figures(units)
    # MemTracker's snapshot holds every category of a device, zeros included
    peak = {**dict.fromkeys(record3.memory_peak, 0), **categories(figures.peak_snapshot)}
    state = {k: v + extra * (record4.state_bytes[k] - v) for k, v in record3.state_bytes.items()}
    record = StepRecord(
        tuple(template.spread(units, stamps3, events3)),
        tuple(template.spread(units, rec3.collective_stamps, rec3.collectives)),
        peak, state, {}, record3.gradless | record4.gradless, notes=record3.notes, frozen=record3.frozen or record4.frozen,
    )
    return prefix, wrapped3 + extra * (wrapped4 - wrapped3), record, dtype


def _parent_walked(model: nn.Module, stack: Stack, args: Tuple[Any, ...], kw: Mapping[str, Any], amp: Optional[torch.dtype]) -> bool:
    """Whether the built model's forward treats every middle layer alike (flopcount.step.parent_walk),
    walked on the meta device (the model as built, unsharded: the parent's code, not the shards,
    is what the walk proves), and left the model's state as it found it (the cut runs follow).
    transformers' "is tracing" probe is answered as :func:`_fake_step` answers it (the caller's
    small inputs followed), so that the walk takes the branches the step takes: the real
    forward's, not the one transformers keeps for ``torch.compile`` (a materialised mask, K and V
    repeated: multi-head latent attention whose config has fewer key/value heads than query heads
    repeats its already expanded K and V there and fails)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    tensors, rebuild = flatten_tensors((args, dict(kw)))
    before = model_state(model)
    # fake tensors on the meta device (the parameters made fake as ops meet them): what a
    # forward may not read on fakes it skips on these too (transformers' mask checks)
    with FakeTensorMode(allow_non_fake_inputs=True):
        fakes = _empty_like(tensors, "meta")
        meta_args, meta_kw = rebuild(fakes)
        # the walk's notes are not the step's: the step's own run gives them
        with real_branches(model.modules(), fakes, tensors):
            proven = parent_proven(stack, model, meta_args, meta_kw, True, amp, "cpu")
    return proven and model_state(model) == before


def _empty_like(tensors: List[torch.Tensor], device: str) -> List[torch.Tensor]:
    """An empty tensor of each one's metadata on ``device`` (under a fake mode: a fake); one
    tensor passed twice (ids as labels) is one, as in estimate_memory."""
    made = {id(t): torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=device).requires_grad_(t.requires_grad)
            for t in {id(t): t for t in tensors}.values()}
    return [made[id(t)] for t in tensors]


def _booked(stamps: List[int], events: List[OpEvent], registry: HandlerRegistry) -> Tuple[List[int], List[OpEvent]]:
    """The events (and their stamps) whose cost is not zero or that no handler prices."""
    kept = [(s, e) for s, e in zip(stamps, events) if not _skipped(e.call.op)]
    costed = cost_events(tuple(e for _, e in kept), registry)
    chosen = [(s, e) for (s, e), (_, cost) in zip(kept, costed) if cost is None or cost != Cost()]
    return [s for s, _ in chosen], [e for _, e in chosen]


def _event_key(event: OpEvent) -> Tuple[Any, ...]:
    """What an op event's cost and booking read (its module aside): op, phase, arguments, outputs."""
    return (event.call.op, event.phase, tuple((k, _plain(v)) for k, v in event.call.args.items()),
            tuple(_plain(v) for v in event.call.outputs))


def _plain(value: Any) -> Any:
    if isinstance(value, (tuple, list)):
        return tuple(_plain(v) for v in value)
    if value is None or isinstance(value, (TensorMeta, int, float, str, torch.dtype, torch.device, torch.layout)):
        return value
    return type(value).__name__  # a process group, a profiler record: no cost reads it


def _fake_step(
    model: nn.Module, args: Tuple[Any, ...], kw: Mapping[str, Any], optimizer: Any, loss_fn: Any,
    groups: Mapping[str, Any], backend: str = "nccl", amp: Optional[torch.dtype] = None,
    replay: Optional[Replay] = None, stateless: FrozenSet[str] = frozenset(),
) -> Tuple[StepRecord, str]:
    """Materialise the sharded model as fake tensors on cpu, then run and record one step.
    ``stateless``: names of parameters the warm-up gives no optimizer state (the step gives
    them no gradient: :attr:`StepRecord.gradless`)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    tensors, rebuild = flatten_tensors((args, dict(kw)))
    with FakeTensorMode(allow_non_fake_inputs=True):
        ties = _tied_parameters(model)
        model.to_empty(device="cpu")  # gives each module a tensor of its own: tied weights are tied again
        for module, name, owner, owner_name in ties:
            module._parameters[name] = owner._parameters[owner_name]
        fakes = _empty_like(tensors, "cpu")
        call_args, call_kw = rebuild(fakes)
        opt = make_optimizer(optimizer, model)
        if replay is not None:
            replay.optimizer = opt
        if opt is not None:
            # the steady state: every step after the first starts with the optimizer state
            # allocated, so it is there through the forward and backward (the first step's
            # peak is lower by up to the state's size; a plan sizes every step)
            # (a parameter the step gives no gradient gets none in a real run: the optimizer
            # skips it, so its state is never made; it sits out the warm-up)
            warm_up(opt, "plan", reuse=True, model=model, stateless=stateless)  # fake tensors: one step per kind
        try:
            # transformers' "is tracing" probe answered as a real run answers it (hf_tracing.py)
            with real_branches(model.modules(), fakes, tensors) as branches:
                record = record_step(
                    model, opt, call_args, call_kw, loss_fn, groups, backend=backend, amp=amp, replay=replay, seeds=(fakes, tensors),
                )
        except (UsageError, PlanError):  # PlanError: a private torch piece is missing, named as is
            raise
        except Exception as exc:
            refused = refused_by_real_kernel(exc)
            if refused is not None:  # the real forward fails there too (an index past its table): said as count says it
                where = failing_module(exc, module_names(model)) or ""
                raise forward_error(refused, where, describe_inputs(args, kw), "plan, rank 0") from refused
            raise TraceError(f"the planned training step failed on rank 0: {type(exc).__name__}: {exc}") from exc
    floating = [p.dtype for p in model.parameters() if p.is_floating_point()]
    dtype = dtype_name(floating[0]) if floating else "float32"
    return (dataclasses.replace(record, notes=branches.notes) if branches.notes else record), dtype


def _tied_parameters(model: nn.Module) -> List[Tuple[nn.Module, str, nn.Module, str]]:
    """(module, name, owner, owner's name) for each parameter slot holding a parameter first
    met in another slot (tied weights: GPT-2's ``lm_head.weight`` is ``wte.weight``)."""
    owners: Dict[int, Tuple[nn.Module, str]] = {}
    ties = []
    for module in model.modules():
        for name, param in module._parameters.items():
            if param is None:
                continue
            if id(param) in owners:
                ties.append((module, name, *owners[id(param)]))
            else:
                owners[id(param)] = (module, name)
    return ties


def _book(costed: List[Tuple[OpEvent, Optional[Cost]]]) -> Tuple[Dict[str, int], Dict[str, int], Dict[str, int], Dict[str, int]]:
    """FLOPs and MACs by phase, FLOPs by operator, and calls of ops without a handler,
    booked by flopcount's one ledger."""
    ledger = Ledger().book_all(costed)
    macs_at, flops_at = TOTAL_FIELDS.index("macs"), TOTAL_FIELDS.index("flops")
    phases = ("forward", "backward", "optimizer")
    flops = {phase: ledger.phases.get(phase, [0] * len(TOTAL_FIELDS))[flops_at] for phase in phases}
    macs = {phase: ledger.phases.get(phase, [0] * len(TOTAL_FIELDS))[macs_at] for phase in phases}
    by_operator = {op: sums[flops_at] for op, sums in ledger.operators.items() if sums[flops_at]}
    ordered = dict(sorted(by_operator.items(), key=lambda kv: -kv[1]))
    return flops, macs, ordered, {op: int(entry[0]) for op, entry in ledger.unsupported.items()}


def _comm_rows(
    collectives: Tuple[Collective, ...], groups: Mapping[str, Tuple[str, int]], links: Mapping[str, Tuple[str, float]]
) -> Tuple[CommRow, ...]:
    rows: Dict[Tuple[str, str], Dict[str, Any]] = {}
    for c in collectives:
        dim, size = groups.get(c.group, ("?", 1))
        row = rows.setdefault((c.kind, dim), {"size": size, "calls": 0, "bytes": 0, "wire": 0.0, "phases": {}})
        row["calls"] += 1
        row["bytes"] += c.tensor_bytes
        row["wire"] += c.tensor_bytes * ring_factor(c.kind, size)
        row["phases"][c.phase] = row["phases"].get(c.phase, 0) + 1
    out = []
    for (kind, dim), row in sorted(rows.items()):
        wire = int(round(row["wire"]))
        seconds = wire / links[dim][1] if dim in links else None
        out.append(CommRow(kind, dim, row["size"], row["calls"], row["bytes"], wire, seconds, row["phases"]))
    return tuple(out)


def _tokens(args: Tuple[Any, ...], kw: Mapping[str, Any]) -> int:
    """Tokens in the micro-batch: the elements of the first integer input (token ids)."""
    tensors, _ = flatten_tensors((args, dict(kw)))
    return next((t.numel() for t in tensors if not t.is_floating_point() and t.dtype != torch.bool), 0)


def _bounds(
    costed: List[Tuple[OpEvent, Optional[Cost]]], comm: Tuple[CommRow, ...], gpu: Optional[str], dtype: str, have_links: bool,
) -> Optional[StepTimeBounds]:
    """The roofline of the rank's ops, the communication time, and the step times they bound."""
    part = None if gpu is None else find_part(gpu)
    if part is None:
        return None
    # the modeled part's own math modes (torch's defaults: fp32 convolutions in TF32, matmuls
    # not), never the host's flags
    roofs = part_roofs(part)
    column = column_of(dtype)
    # bytes: flopcount.core.traffic's convention (views and allocations move none)
    compute = sum((op_time(roofs, cost.flops, cost.bytes, column, event.call.op).seconds for event, cost in costed if cost is not None), 0.0)
    comm_s = sum(r.seconds or 0.0 for r in comm) if have_links else None
    no_overlap = overlap = None
    if comm_s is not None:
        no_overlap, overlap = compute + comm_s, max(compute, comm_s)
    return StepTimeBounds(roofs.peak(column, "matmul"), roofs.bandwidth, compute, comm_s, no_overlap, overlap)


def _utilisation(bounds: Optional[StepTimeBounds], model_flops: Optional[int], hardware_flops: int) -> Optional[StepTimeBounds]:
    """MFU and HFU at each step time: model FLOPs (:func:`_model_flops`) and hardware FLOPs
    (every FLOP the rank ran: forward, backward with any recomputation, optimizer step) over
    (step time x peak FLOP/s)."""
    if bounds is None:
        return None

    def rate(flops: Optional[int], seconds: Optional[float]) -> Optional[float]:
        return flops / (seconds * bounds.peak_flops) if flops is not None and seconds else None

    return dataclasses.replace(
        bounds,
        mfu_no_overlap=rate(model_flops, bounds.no_overlap_s), mfu_overlap=rate(model_flops, bounds.overlap_s),
        hfu_no_overlap=rate(hardware_flops, bounds.no_overlap_s), hfu_overlap=rate(hardware_flops, bounds.overlap_s),
    )


def _model_flops(
    build: Callable[[], nn.Module], args: Tuple[Any, ...], kw: Mapping[str, Any], tp: int,
    flops: Mapping[str, int], loss_fn: Optional[Callable[[Any], Any]], registry: HandlerRegistry, frozen: bool = False,
) -> Tuple[Optional[int], str]:
    """One rank's model FLOPs: 3 x the forward FLOPs (loss included) of the model as written,
    unsharded, on the rank's micro-batch, divided by ``tp`` (the ranks sharing that micro-batch),
    and with ``frozen`` parameters (some do not require grad) at most the rank's hardware FLOPs
    (:func:`flopcount.bench.peak.model_flops`: a frozen backbone's step does less than 3 x its forward).

    3 x forward is PaLM's convention (6N + 12·L·H·Q·T per token: a matmul's backward is twice
    its forward; attention's QK^T and AV at the full Lq x Lk product, no causal halving): no
    activation recomputation, no fused-attention backward's extra QK^T (2.5x, not 2x, its
    forward), no work replicated on TP ranks. Without TP the rank's own forward is that
    forward (FSDP changes no op's FLOPs); with TP the unsharded model is counted again, on
    the meta device, by the default count (fake copies, repeated blocks reused). ``(None, why)`` when that trace fails."""
    if tp == 1:
        return model_flops(flops.get("forward", 0), sum(flops.values()), frozen), ""
    tensors, rebuild = flatten_tensors((args, dict(kw)))
    metas = [torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta") for t in tensors]
    meta_args, meta_kw = rebuild(metas)
    try:
        model = _built(build)
        # the default count: fake copies with repeated blocks reused (the dispatch tracer on
        # meta ran every layer: ~8 % of a 70B plan), the same events
        run = trace(_WithLoss(model, loss_fn or default_loss), tuple(meta_args), meta_kw)
    except Exception as exc:  # the plan stands without an MFU
        return None, f"MFU not computed: the unsharded forward failed on the meta device ({type(exc).__name__}: {exc})"
    forward = sum(cost.flops for event, cost in cost_events(run.events, registry) if cost is not None and not _skipped(event.call.op))
    return model_flops(forward, tp * sum(flops.values()), frozen) // tp, ""


class _WithLoss(nn.Module):
    """The model and its loss as one forward (the planned step's forward phase), with grad
    enabled as in a training step: the loss needs outputs that require grad, and a model
    may branch on grad mode."""

    def __init__(self, model: nn.Module, loss_fn: Callable[[Any], Any]):
        super().__init__()
        self.model = model
        self.loss_fn = loss_fn

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        with torch.enable_grad():
            return self.loss_fn(self.model(*args, **kwargs))


def _notes(unsupported: Mapping[str, int], times_known: bool, gpu: Optional[str]) -> Tuple[str, ...]:
    notes = []
    if unsupported:
        listing = ", ".join(f"{op} x{n}" for op, n in sorted(unsupported.items()))
        notes.append(f"ops without a handler were not counted: {listing}")
    if gpu is not None and not times_known:
        part = find_part(gpu)
        offered = f"; {part.name}'s: {', '.join(part.links)}" if part is not None and part.links else ""
        notes.append("no link given: communication time, MFU and HFU not estimated (pass link=, on the command line "
                     f"--link{offered})")
    return tuple(notes)
