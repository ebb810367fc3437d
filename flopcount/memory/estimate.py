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
import dataclasses
import json
import threading
import warnings
from dataclasses import asdict, dataclass
from typing import Any, Dict, FrozenSet, List, Literal, Mapping, Optional, Set, Tuple, Union

import torch
from torch import nn

from flopcount.core.collection import PausedCollections
from flopcount.core.diagnostics import FromWarnings, first_line, module_place
from flopcount.core.dtypes import optional_dtype
from flopcount.core.inputs import (
    PreparedCall,
    is_dataless,
    output_tensors,
    prepare_call,
    require_module,
    with_input_hint,
)
from flopcount.core.model_facts import model_facts
from flopcount.core.rendering import render
from flopcount.core.state import FoundState, left_as_found, preserved_random_modules, preserved_rng
from flopcount.errors import FlopcountError, FlopcountWarning, TraceError, UsageError
from flopcount.step.autocast import ambient_autocast_note, amp_device
from flopcount.step.loss import LossFn
from flopcount.step.optimizers import (
    UNTRACKED_SPARSE,
    OptimizerSpec,
    build_optimizer,
    check_spec,
    gradless,
    per_parameter,
    sparse_gradient,
    warm_up,
)
from flopcount.step.parent_walk import model_state, parent_proven
from flopcount.step.replay import (
    Figures,
    Stack,
    Template,
    categories,
    find_stack,
    layer_names,
    layer_tensors,
    record_forward_calls,
    truncated,
)
from flopcount.step.runner import peak_tracker, run_step
from flopcount.tracers._containers import deep_copied
from flopcount.tracers._modules import ModuleStack
from flopcount.tracers._reuse import reuse_enabled
from flopcount.tracers.dispatch import _in_chain
from flopcount.tracers.fake.copies import FakeRunError, fake_copies, quiet_fake_logs
from flopcount.tracers.fake.hf_tracing import real_branches, seed_running, uses_transformers
from flopcount.tracers.fake.indices import IndexChecks
from flopcount.tracers.fake.meta_kernels import KernelStandIns, refused_by_real_kernel
from flopcount.types import Phase, dtype_name

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
class MemoryEstimate(FromWarnings):
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


def _peak_tracker() -> Any:
    """The step's one MemTracker subclass (flopcount.step.runner.peak_tracker), made now."""
    try:
        from torch.distributed._tools.mem_tracker import MemTracker
    except Exception as exc:  # ImportError, or a RuntimeError on builds without torch.distributed
        raise UsageError(
            f"estimate_memory needs torch.distributed._tools.mem_tracker.MemTracker (torch >= 2.5 built with "
            f"distributed support); torch {torch.__version__} here has none ({type(exc).__name__}: {exc})"
        ) from exc
    if not hasattr(MemTracker, "_update_peak_stats") or not hasattr(MemTracker, "track_external"):
        raise UsageError(f"estimate_memory: torch {torch.__version__}'s MemTracker lacks the hooks flopcount uses")
    return peak_tracker(MemTracker)()


#: MemTracker also patches ``torch.UntypedStorage.resize_`` process-wide and puts back what it
#: found when it was built: two estimates at once would put back each other's patch. Estimates
#: therefore run one at a time (another thread's estimate waits); counts do not wait for them.
_ESTIMATE_LOCK = threading.Lock()


# --------------------------------------------------------------------------- the estimate


def estimate_memory(
    model: nn.Module,
    inputs: Any,
    kwargs: Optional[Mapping[str, Any]] = None,
    *,
    backward: bool = False,
    optimizer: Optional[OptimizerSpec] = None,
    loss_fn: Optional[LossFn] = None,
    dtype: Union[None, str, torch.dtype] = None,
    autocast: Union[None, str, torch.dtype] = None,
) -> MemoryEstimate:
    """Peak tensor memory of one step of ``model(*inputs, **kwargs)`` on fake tensors.

    ``backward=False``: inference under ``torch.no_grad()``. ``backward=True``: forward
    then backward of ``loss_fn(outputs)`` or the default loss (the loss the model returns,
    else the sum of its floating outputs: docs/conventions.md), the outputs released first:
    the step ``plan`` and the trainer callbacks run (flopcount.step.runner). ``optimizer`` ("sgd", "sgd-momentum",
    "adam", "adamw" or an instance, needs ``backward``) adds its step, in the steady
    state: its state exists from the start (allocated by an earlier step), gradients do
    not (``zero_grad(set_to_none=True)``). ``dtype`` casts floating parameters, buffers and
    inputs. ``autocast`` (e.g. ``torch.bfloat16``) runs the forward and the loss under
    ``torch.autocast`` and the backward and step outside it, as the AMP recipe does; inside
    the caller's own ``torch.autocast`` its weight-cast cache is left alone (the forward then
    runs with the cache off).
    A tie the model declares but no longer has (``model.to("meta")`` unties) is restored on
    the fake copy, with a warning. Works on cpu, cuda and meta models (meta is estimated as cpu).
    A step that reads tensor values is measured once for real on a copy (said in warnings;
    refused on meta). A lazy module is refused, naming it. A stack of identical layers is run
    cut to 3 and 4 layers and the rest replayed, exactly, where the 4-layer run checks out and
    the forward around the layers is proven to treat every middle layer alike
    (flopcount.step.replay, flopcount.step.parent_walk; ``FLOPCOUNT_REUSE=0`` traces every layer)."""
    require_module(model, "estimate_memory")
    if optimizer is not None:  # the unknown name first: with backward=True it would be next
        check_spec(optimizer, "estimate_memory")
    if optimizer is not None and not backward:
        raise UsageError("estimate_memory: an optimizer step needs backward=True")
    if loss_fn is not None and not backward:
        raise UsageError("estimate_memory: loss_fn is only used with backward=True")
    _refuse_lazy(model)
    if backward:
        _refuse_sparse_gradients(model)
    cast = optional_dtype(dtype, "estimate_memory: dtype", "floating")
    amp = optional_dtype(autocast, "estimate_memory: autocast", "floating")
    request = _Request(prepare_call(inputs, kwargs), backward, optimizer, loss_fn, cast, amp)
    # on fakes, transformers' "is tracing" probe answered as a real run answers it (hf_tracing.py)
    # the automatic collector paused over the fake steps: where garbage cycles hold tensors (a
    # step's graph kept by a hook's closure), a collection in the middle of a step would free
    # them at a moment set by the process's allocation history, and the same step gave another
    # peak from one call to the next; paused, they are held as in a step the collector does not
    # interrupt (the real step measured in a fallback too)
    # the forward's Python code draws from Python's and numpy's generators on fakes too: set back.
    # torch's fake mode logs the error of a meta kernel that refuses (a float32 _grouped_mm, which
    # the step's stand-ins answer): muted, as plan and the count mute it, and its record with
    # the traceback (which holds the step's tensors) is not kept by a capturing log handler
    # and so are the globals and class data the forwards write (a class's call counter: the copies share its classes)
    with _ESTIMATE_LOCK, real_branches(model.modules()) as branches, PausedCollections(), preserved_random_modules(), \
            left_as_found(model.modules()), quiet_fake_logs():
        estimate = _estimate(model, request)
    return dataclasses.replace(estimate, warnings=estimate.warnings + branches.notes) if branches.notes else estimate


@dataclass(frozen=True)
class _Request:
    """What estimate_memory was asked, as every stage of it reads it."""

    call: PreparedCall
    backward: bool
    optimizer: Optional[OptimizerSpec]
    loss_fn: Optional[LossFn]
    cast: Optional[torch.dtype]
    amp: Optional[torch.dtype]
    #: False once the cut runs of a replay wrote the model's state: the step traced in full
    replay: bool = True
    #: the notes of the stand-in kernels the fake steps took (meta_kernels.KernelStandIns: a float32
    #: mixture-of-experts _grouped_mm), said in the estimate's warnings
    stand_ins: Set[str] = dataclasses.field(default_factory=set)
    #: the fake steps' index checks (fake/indices.py), for a model without transformers modules
    #: (FakeValues checks those); None: none
    index_checks: Optional[IndexChecks] = None


class _StateWritten(Exception):
    """The replay's cut runs (or the walk of the parent) wrote the model's state."""


def _refuse_sparse_gradients(model: nn.Module) -> None:
    """A sparse gradient (``Embedding(sparse=True)``) cannot be measured: torch's MemTracker
    reads every tensor's storage, which a sparse tensor has not, on fakes and in a real step
    alike (it raised "Cannot access storage of SparseTensorImpl"): refused, naming the module."""
    found = sparse_gradient(model, "estimate_memory", UNTRACKED_SPARSE + "estimate without backward=True, or with "
                            "sparse=False (a dense gradient of the whole table)")
    if found is not None:
        raise TraceError(found[1], module_path=found[0])


def _refuse_lazy(model: nn.Module) -> None:
    """A lazy module (``nn.LazyLinear``...) has no parameter shapes until its first forward,
    which would also change the caller's model: refused, naming it."""
    for name, module in model.named_modules():
        lazy = [
            k for k, t in (*module._parameters.items(), *module._buffers.items())
            if t is not None and nn.parameter.is_lazy(t)
        ]
        if lazy:
            raise UsageError(
                f"estimate_memory: module '{name or type(model).__name__}' ({type(module).__name__}) has uninitialized "
                f"lazy {', '.join(lazy)}, whose shapes its first forward decides: run the model once on an example "
                "input (model(x)) before estimating its memory"
            )


def _estimate(model: nn.Module, request: _Request, stateless: FrozenSet[str] = frozenset()) -> MemoryEstimate:
    """``stateless``: names of parameters the step gives no gradient (found by a first run):
    the warm-up gives them no optimizer state, as a real run's optimizer never makes it."""
    facts, call = model_facts(model), request.call
    try:
        copied = fake_copies(model, list(call.tensors), call.rebuild, dtype=request.cast, storages=True, retie=True, modules=facts.modules)
    except UsageError as exc:
        raise UsageError(f"estimate_memory: {exc}") from exc
    except FakeRunError as exc:
        raise UsageError(f"estimate_memory: {exc.reason}") from exc
    seed_running(copied.tensors, list(call.tensors))
    if not uses_transformers(facts.modules):  # their index checks: FakeValues's (seeded above)
        checks = IndexChecks()
        checks.seed(copied.tensors, list(call.tensors))
        request = dataclasses.replace(request, index_checks=checks)
    twin, mode, (fake_args, fake_kw) = copied.model, copied.mode, copied.call
    notes = copied.notes + ambient_autocast_note(request.amp)
    opt, opt_name = (None, None)
    if request.optimizer is not None:
        with mode:  # an optimizer that makes state in its constructor (Adagrad) makes fake state
            opt, opt_name = build_optimizer(request.optimizer, copied.twins, list(twin.parameters()), "estimate_memory")
            warm_up(opt, "estimate_memory", reuse=True, model=twin, stateless=stateless)  # one step per kind on fakes
    names = facts.names_on(copied.copies)
    step = (twin, opt, fake_args, fake_kw, names, mode)
    try:
        figures = _layered(request, *step)
    except _StateWritten:  # on a fresh copy: the cut runs' writes would be in the full trace's state
        return _estimate(model, dataclasses.replace(request, replay=False), stateless)
    layered = figures is not None
    if figures is None:
        for param in twin.parameters():
            param.grad = None  # a cut run that stopped may have left some
        tracker = _peak_tracker()
        try:
            _tracked_step(request, tracker, *step, warm=False)
        except _NeedsData as needs:
            tracker, copy_model, copy_names, note = _real_step_fallback(model, request, facts, needs)
            notes.append(note)
            return _collect(request, _figures(tracker, copy_names), copy_model, copy_names, opt_name, notes)
        figures = _figures(tracker, names)
    # after a replay the layers past the check's cut ran in no run (their gradients are None):
    # the check proved them alike the ones it ran, so each of theirs is judged as its twin in those
    found = _gradless_in_layers(twin, opt) if layered else gradless(twin, opt)
    if found and not stateless:  # parameters the step gives no gradient hold no state in a real run
        return _estimate(model, request, found)
    notes.extend(sorted(request.stand_ins))
    return _collect(request, figures, twin, names, opt_name, notes)


def _gradless_in_layers(twin: nn.Module, opt: Any) -> FrozenSet[str]:
    """:func:`gradless` after the replay's last cut run, where the stack held its head and the
    first ``Template.UNITS + 1`` units of its run: the whole model's layer ``k`` of the run is judged
    as the cut run's layer in the same place of the unit in the same role (the first, a middle one,
    the last), which the check proved alike; a layer of the head as itself (it ran)."""
    stack = find_stack(twin)
    if stack is None:
        return gradless(twin, opt)
    path = next(name for name, module in twin.named_modules() if module is stack.layers)
    found = gradless(twin, opt, skip=list(stack.layers.parameters()))  # outside the stack
    ran, units, period, head = Template.UNITS + 1, stack.units, stack.period, stack.head
    role = {0: 0, units - 1: ran - 1}  # the whole model's unit -> the cut run's unit in its role (else 1)
    layers = list(stack.layers.children())
    by_role: Dict[int, FrozenSet[str]] = {}
    out = set(found)
    for index in range(len(stack)):
        if index < head:
            cut = index
        else:
            unit, place = divmod(index - head, period)
            cut = head + role.get(unit, 1) * period + place
        if cut not in by_role:
            by_role[cut] = gradless(layers[cut], opt)
        out |= {f"{path}.{index}.{name}" for name in by_role[cut]}
    return frozenset(out)


def _layered(
    request: _Request, twin: nn.Module, opt: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any],
    names: Mapping[nn.Module, str], mode: Any,
) -> Optional[Figures]:
    """The step's figures with its repeated layers replayed (flopcount.step.replay): the step
    run on the copy cut to 3 layers (the template) and to 4 (the check); None (trace it in
    full) where that does not apply or the check differs in any record. Raises
    :class:`_StateWritten` where the runs wrote the model's state (a layer counting its calls in
    a config it shares with the others, a dict they share): the cut runs cannot show what the
    whole would do at layer 9, and the runs' writes would be in the full trace's start."""
    if not request.replay or not reuse_enabled() or isinstance(mode, contextlib.nullcontext) or (opt is not None and not per_parameter(opt)):
        return None
    stack = find_stack(twin)
    if stack is None:
        return None
    before, found = model_state(twin), FoundState()
    found.add(twin.modules())
    figures = _replayed(request, stack, twin, opt, args, kwargs, names, mode)
    if model_state(twin) != before:
        found.set_back()  # a global or class counter the cut runs advanced: the full trace starts where they did
        raise _StateWritten()
    return figures


def _replayed(
    request: _Request, stack: Stack, twin: nn.Module, opt: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any],
    names: Mapping[nn.Module, str], mode: Any,
) -> Optional[Figures]:
    """:func:`_layered` once ``stack`` is found: the cut runs, the check and the walk of the parent."""
    runs = []
    for units in (Template.UNITS, Template.UNITS + 1):
        keep = stack.kept(units)
        tracker = _peak_tracker()
        timeline: List[Any] = []
        for param in twin.parameters():
            param.grad = None
        try:
            with mode:
                tracker.watch(twin, opt, output_tensors((args, kwargs)))  # every layer's parameters and state
            with truncated(stack, keep), record_forward_calls(twin, tracker, timeline):
                tracker.timeline = timeline
                tracker.layer_tensors = lambda keep=keep: layer_tensors(stack, keep, opt)
                _tracked_step(request, tracker, twin, opt, args, kwargs, names, mode, warm=False)
        except Exception:  # the cut copy cannot run as the whole: the whole is traced
            return None
        runs.append((timeline, tracker._mod_tracker.get_known_fqn, tracker))
    (timeline, known, cut), (check, _, _) = runs
    list_name = known(stack.layers)
    if list_name is None:
        return None
    prefix = list_name + "."
    template = Template.of(timeline, prefix, cut.released_casts, cut.autocast_left, period=stack.period, head=stack.head)
    if template is None or not template.checked(check):
        return None
    # the parent's forward proven to treat every middle layer alike (flopcount.step.parent_walk)
    with mode:
        if not parent_proven(stack, twin, args, kwargs, request.backward, request.amp, amp_device(twin, args, kwargs)):
            return None
    figures = template.figures(stack.units)
    fqns = layer_names(stack, known, prefix)
    figures.names = {module: fqns.get(module) or known(module) for module in names}
    return figures


def _figures(tracker: Any, names: Mapping[nn.Module, str]) -> Figures:
    """What the reading reads off a tracker that watched the whole step."""
    calls: Dict[str, Tuple[List[int], List[int]]] = {}
    fqns: Dict[nn.Module, Optional[str]] = {}
    for module in names:
        fqn = fqns[module] = tracker._mod_tracker.get_known_fqn(module)
        stats = tracker.memory_tracking.get(module)
        if stats is None or fqn is None:
            continue
        states = {getattr(k, "value", k): v for k, v in stats.snapshots.items()}
        calls[fqn] = (
            [categories(s).get("Activation", 0) for s in states.get("Pre-Forward", [])],
            [categories(s).get("Activation", 0) for s in states.get("Post-Forward", [])],
        )
    return Figures(
        tracker.peak_total, tracker.peak_snapshot, tracker.peak_where, tracker.peak_phase, dict(tracker.module_peaks), calls, fqns,
    )


class _NeedsData(Exception):
    """The fake step read tensor values (``nonzero``, ``.item()``): only a real step can run it."""

    def __init__(self, error: TraceError):
        super().__init__(str(error))
        self.error = error


def _tracked_step(
    request: _Request, tracker: Any, twin: nn.Module, opt: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any],
    names: Mapping[nn.Module, str], mode: Any, warm: bool = True,
) -> None:
    """One step of ``twin`` inside ``tracker`` (under ``mode``: the fake mode, or nothing for a
    real step); a failure names the module it happened in; warnings' formatter kept. Fake
    tensors draw no random number, so a fake step leaves the process's RNG alone (setting it
    back would rewind another thread's draws, issue #29 item 18); a real step (the fallback)
    draws from it, and it is put back when no other thread could have drawn meanwhile
    (:func:`~flopcount.core.state.preserved_rng`)."""
    real = isinstance(mode, contextlib.nullcontext)
    formatwarning = warnings.formatwarning  # ModTracker may replace it process-wide
    try:
        with mode, preserved_rng() if real else contextlib.nullcontext():
            if opt is not None and warm:
                warm_up(opt, "estimate_memory", reuse=not real)  # one step per kind of parameter on fakes
            if tracker.timeline is None:  # a cut run's tracker watched the whole copy before it was cut
                tracker.watch(twin, opt, output_tensors((args, kwargs)))
            with tracker, ModuleStack(names) as stack, _stand_ins(request, stack, real):
                try:
                    run_step(
                        twin, args, kwargs, backward=request.backward, optimizer=opt, loss_fn=request.loss_fn,
                        amp=request.amp, device_type=amp_device(twin, args, kwargs), tracker=tracker,
                    )
                except FlopcountError:
                    raise
                except Exception as exc:
                    # with count_flops' hint for inputs given in the wrong form (a shape, a tokenizer's dict)
                    error = with_input_hint(_step_error(exc, stack.current, request.call.description), request.call,
                                            twin.forward, "estimate_memory")
                    # a real step has the values: its failure is its own, though its context
                    # chain holds the fake step's (the fallback runs while that is handled)
                    if not real and _in_chain(exc, _needs_value):
                        raise _NeedsData(error) from exc
                    raise error from exc
    finally:
        warnings.formatwarning = formatwarning


def _stand_ins(request: _Request, stack: ModuleStack, real: bool) -> Any:
    """A fake step's stand-in kernels (:class:`~flopcount.tracers.fake.meta_kernels.KernelStandIns`),
    entered inside the tracker; nothing for a real step."""
    if real:
        return contextlib.nullcontext()
    return KernelStandIns(request.stand_ins, lambda: stack.current, request.index_checks)


def _real_step_fallback(
    model: nn.Module, request: _Request, facts: Any, needs: _NeedsData
) -> Tuple[Any, nn.Module, Dict[nn.Module, str], str]:
    """The step that read tensor values run for real, as count_flops falls back to one real
    run: on a deep copy of the model and inputs (the caller's are never touched), measured
    by the same MemTracker. Refused on meta or fake weights and inputs (no values to read).
    Returns the tracker, the copy, its module names and the note that says so."""
    call, cast = request.call, request.cast
    dataless = [t for t in (*call.tensors, *facts.parameters, *facts.buffers) if isinstance(t, torch.Tensor) and is_dataless(t)]
    if dataless:
        raise TraceError(
            f"{needs.error}; on meta/fake tensors there are no values to run it with, so no real step can stand in: "
            "estimate with real weights and inputs (the step is then measured once for real)",
            module_path=needs.error.module_path,
            input_shapes=needs.error.input_shapes,
        ) from needs.error.__cause__
    memo: Dict[int, Any] = {}
    copy_model = deep_copied(model, memo)  # a hook wrapper's closure the copy's own, not shared
    copy_tensors = copy.deepcopy(list(call.tensors), memo)
    twins = {id(p): memo[id(p)] for p in model.parameters() if id(p) in memo}
    if cast is not None:
        copy_model.to(cast)
        copy_tensors = [t.to(cast) if t.is_floating_point() else t for t in copy_tensors]
    args, kwargs = call.rebuild(copy_tensors)
    opt = None
    if request.optimizer is not None:
        opt, _ = build_optimizer(request.optimizer, twins, list(copy_model.parameters()), "estimate_memory")
    names = facts.names_on(memo)
    tracker = _peak_tracker()
    # the collector stays paused, as over the fake steps: a tensor a garbage cycle holds dies at
    # the step's end, not at a moment set by the process's allocation history (the same step
    # gave another peak from one call to the next); what the step left is collected on return
    _tracked_step(request, tracker, copy_model, opt, args, kwargs, names, contextlib.nullcontext())
    first = (str(needs.error).splitlines() or [""])[0]
    return (
        tracker,
        copy_model,
        names,
        f"estimate_memory measured one real step (MemTracker, on a copy of the model and inputs) because the step "
        f"reads tensor values that fake tensors do not have ({first.split(': ', 1)[-1]}); the peak is for these "
        f"input values: a data-dependent size (nonzero, masks) can differ on other data",
    )


def _step_error(exc: Exception, where: str, description: str) -> TraceError:
    hint = " (fake tensors have no values: the step reads tensor data, e.g. .item() or nonzero())" if _needs_value(exc) else ""
    shown = refused_by_real_kernel(exc) or exc  # a real kernel's refusal, said as the real call says it
    return TraceError(
        f"estimate_memory: the step failed in {module_place(where)} with inputs {description}: "
        f"{type(shown).__name__}: {first_line(shown)}{hint}",
        module_path=where,
        input_shapes=description,
    )


def _needs_value(exc: BaseException) -> bool:
    """Whether ``exc`` is fake tensors' "this needs a value" error."""
    return "DataDependent" in type(exc).__name__ or "DynamicOutputShape" in type(exc).__name__


_CONVS = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)


def _collect(
    request: _Request, figures: Figures, twin: nn.Module, names: Mapping[nn.Module, str], opt_name: Optional[str],
    notes: List[str],
) -> MemoryEstimate:
    snapshot = figures.peak_snapshot
    held = categories(snapshot)
    at_peak = MemoryBreakdown(**{field: held.get(category, 0) for category, field in _CATEGORIES.items()})
    fqn_of = figures.names
    known = {fqn_of.get(module): name for module, name in names.items()}
    running = [fqn for fqn in figures.peak_where if fqn in known]
    peak_module = known[max(running, key=lambda fqn: (fqn.count("."), fqn))] if running else ""
    modules = []
    for module, name in names.items():
        fqn = fqn_of.get(module)
        before, after = figures.forward_calls.get(fqn, ([], [])) if fqn is not None else ([], [])
        retained = sum(max(0, b - a) for a, b in zip(before, after))
        modules.append(
            ModuleMemory(
                name,
                type(module).__name__,
                name.count(".") + 1 if name else 0,
                len(before),
                retained,
                figures.module_peaks.get(fqn, 0) if fqn is not None else 0,
            )
        )
    devices = sorted({str(device) for device in snapshot})
    if len(devices) > 1:
        notes.append(f"the step used several devices ({', '.join(devices)}); peak_bytes is their sum")
    if any(d.startswith("cuda") for d in devices) and torch.backends.cudnn.enabled and any(isinstance(m, _CONVS) for m in twin.modules()):
        notes.append(
            "cuDNN's convolution workspaces are not tensors and are not counted: on an H200 they took a small CNN's "
            "peak to 2.2-2.9x its tensors and ResNet-18's 5-7 % above (docs/memory.md, 'On a GPU'); leave headroom"
        )
    for note in notes:
        warnings.warn(note, FlopcountWarning, stacklevel=3)
    return MemoryEstimate(
        peak_bytes=at_peak.total,
        at_peak=at_peak,
        peak_module=peak_module,
        peak_phase=figures.peak_phase,  # type: ignore[arg-type]
        mode="training step" if opt_name else "forward+backward" if request.backward else "inference",
        optimizer=opt_name,
        params=sum(p.numel() for p in twin.parameters()),
        device=", ".join(devices) or "cpu",
        dtype=None if request.cast is None else dtype_name(request.cast),
        input_description=request.call.description,
        modules=tuple(modules),
        warnings=tuple(notes),
    )
