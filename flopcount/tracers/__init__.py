"""Tracers: run a model once and return a :class:`flopcount.types.Trace` of op events.

Tracers know nothing about costs. ``jit`` uses torch.jit tracing; ``dispatch`` uses a
TorchDispatchMode. :func:`trace` with ``tracer="auto"`` runs the dispatch tracer on fake
copies of the model and inputs (``_fake.py``), or one real run when the forward needs a
value, and says why in the trace's warnings.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any, Callable, Mapping, Optional, Protocol, Sequence, Tuple

import torch
from torch import nn

from flopcount.core.collection import PausedCollections
from flopcount.core.diagnostics import module_place
from flopcount.core.inputs import PreparedCall, is_dataless, prepare_call, with_input_hint
from flopcount.core.model_facts import ModelFacts, model_facts
from flopcount.core.state import (
    FoundRandom,
    left_as_found,
    preserved_random_modules,
    random_states,
    same_random_states,
    set_random_states,
)
from flopcount.errors import TraceError, UsageError
from flopcount.step.optimizers import OptimizerSpec
from flopcount.tracers._modules import ModuleOutput
from flopcount.tracers._real_run import inputs_kept, real_run_model
from flopcount.tracers._sparse import has_sparse
from flopcount.tracers.fake.copies import FakeRunError
from flopcount.types import TRACERS, ReplayedCall, TensorMeta, Trace

__all__ = ["TRACERS", "LossFn", "Tracer", "trace", "trace_on_fakes"]

LossFn = Callable[[Any], Any]


class Tracer(Protocol):
    """What a tracer module provides: run the model once, return its op events."""

    def __call__(self, model: nn.Module, inputs: Any = (), kwargs: Optional[Mapping[str, Any]] = None) -> Trace: ...


def trace(
    model: nn.Module,
    inputs: Any = (),
    kwargs: Optional[Mapping[str, Any]] = None,
    *,
    tracer: str = "auto",
    backward: bool = False,
    loss_fn: Optional[LossFn] = None,
    optimizer: Optional[OptimizerSpec] = None,
    facts: Optional[ModelFacts] = None,
    set_back: bool = True,
    module_output: Optional[ModuleOutput] = None,
    run_name: Optional[str] = None,
) -> Trace:
    """Run ``model`` once with the chosen tracer and return its op events.

    "auto" runs the dispatch tracer on fake copies of the model and inputs (no arithmetic,
    nothing of the caller's touched). If the forward needs a real value, or cannot run on
    fakes, it counts one real run instead and says why in the warnings. Inputs or weights
    already on the meta device (or fake) take the same path (a meta tensor standing for a CPU
    one), and are counted as given only when the forward needs a value. "jit" and "dispatch" run
    the real model. Every path gives the caller's model and input tensors back as found.
    ``optimizer`` (with ``backward``, dispatch or auto) adds one optimizer step on fake
    twins of the parameters, recorded with phase "optimizer".
    ``inputs`` may be a :class:`~flopcount.core.inputs.PreparedCall` and ``facts`` the model's
    :class:`~flopcount.core.model_facts.ModelFacts`, read once by the caller.
    Python's ``random`` and numpy's global generator, which the forward's
    Python code draws from on every path, and the globals and class data its code writes
    (:func:`~flopcount.core.state.left_as_found`: a fake copy and a real run's twin share the
    caller's classes) are set back as found unless ``set_back`` is False (a step of the decoding
    loop: the next step starts where it left them, and the loop sets them back).
    ``module_output`` (dispatch and auto): (a module's qualified name, a callable given that
    module's output as it returns; see :func:`flopcount.tracers.dispatch.trace`).
    ``run_name`` (dispatch and auto): what a failure line calls the run, in place of the
    tracer's name (``"count_generation, decode step 2 (0-based) at position 32"``).
    """
    if tracer not in TRACERS:
        raise UsageError(f"tracer must be one of {', '.join(TRACERS)}; got {tracer!r}")
    if tracer == "jit" and optimizer is not None:
        raise UsageError(
            "optimizer= needs tracer='dispatch' (or 'auto'): the step follows a backward pass, which torch.jit cannot see"
        )
    if tracer == "jit" and backward:
        raise UsageError("backward=True needs tracer='dispatch' (or 'auto'); torch.jit cannot see backward")
    call = prepare_call(inputs, kwargs)
    facts = model_facts(model) if facts is None else facts
    modules = (module for _, module in facts.modules)
    try:
        with preserved_random_modules(set_back) as drawn, left_as_found(modules, set_back=set_back):
            return _traced(model, call, tracer, backward, loss_fn, optimizer, facts, drawn, module_output=module_output,
                           run_name=run_name)
    except TraceError as exc:
        hinted = with_input_hint(exc, call, model.forward)
        if hinted is exc:
            raise
        raise hinted from exc


def _traced(
    model: nn.Module, call: PreparedCall, tracer: str, backward: bool, loss_fn: Optional[LossFn],
    optimizer: Optional[OptimizerSpec], facts: ModelFacts, drawn: FoundRandom,
    module_output: Optional[ModuleOutput] = None, run_name: Optional[str] = None,
) -> Trace:
    from flopcount.tracers import dispatch, jit

    note = ""
    scripted = None
    if isinstance(model, torch.jit.ScriptModule) and tracer in ("auto", "jit") and not backward and optimizer is None \
            and module_output is None:
        # a TorchScript program read from its graph, each op under the submodule that runs it
        # (tracers/jit/scripted.py); one the graph cannot answer is counted as before
        scripted = jit.trace_scripted(model, call, facts=facts)
    if tracer == "auto" and scripted is None:
        # Meta or fake weights get the fake path too (fake copies, shape cache): the same events
        # as real weights; what fakes cannot run is counted as given, as before.
        run, why = _fake_run(
            model, call, facts, drawn, backward=backward, loss_fn=loss_fn, optimizer=optimizer, module_output=module_output,
            run_name=run_name or "auto tracer",
        )
        if run is not None:
            return run
        set_random_states(drawn.states)  # the real run draws what the fake run drew
        dataless = _dataless(call.tensors, facts)
        # counted on the private twin below (a lazy module is materialised there, not in the
        # caller's model: on meta it used to turn the caller's LazyLinear into a Linear)
        if dataless is not None:
            note = f"tracer auto: used dispatch as given because {dataless}"
        else:
            note = f"tracer auto: counted one real run (dispatch) because {why}"
    # A real run (_real_run.py): on a private twin of the module tree, the caller's inputs given back
    run_model, run_facts = real_run_model(model, facts)
    with inputs_kept(call.tensors):
        if tracer == "jit" and scripted is None:
            return jit.trace(run_model, call, facts=run_facts)
        run = dispatch.trace(
            run_model, call, backward=backward, loss_fn=loss_fn, optimizer=optimizer, facts=run_facts,
            module_output=module_output, run_name=run_name or f"{tracer} tracer",  # auto's real run: the tracer chosen
        )
    if scripted is not None:
        # the graph's shape analysis checks no argument: the program is run as before, so a call
        # it refuses (a wrong input shape) fails as a run does; its ops are booked from the graph
        return scripted
    notes = tuple(filter(None, (note, _scripted_note(facts))))
    return dataclasses.replace(run, warnings=notes + run.warnings) if notes else run


def _scripted_note(facts: ModelFacts) -> str:
    """The warning for TorchScript modules with submodules: TorchScript runs those without
    Python's module hooks, so their work is booked on the scripted module and their rows read 0."""
    scripted = [name for name, module in facts.modules
                if isinstance(module, torch.jit.ScriptModule) and next(module.children(), None) is not None]
    if not scripted:
        return ""
    outermost = [""] if "" in scripted else [
        name for name in scripted if not any(name.startswith(f"{outer}.") for outer in scripted)
    ]
    places = ", ".join(module_place(name) for name in outermost)
    return (f"TorchScript runs the submodules of {places} without Python module hooks: their work is "
            "booked on the scripted module, and their own rows read 0")


def trace_on_fakes(
    model: nn.Module,
    inputs: Any = (),
    *,
    facts: Optional[ModelFacts] = None,
    on_output: Optional[Callable[[Any], None]] = None,
    module_output: Optional[ModuleOutput] = None,
    run_name: str = "auto tracer",
) -> Optional[Trace]:
    """The forward traced on fake copies, as ``tracer="auto"`` traces it first (shape cache,
    structural reuse), with no real run behind it: None where "auto" would count a real run
    (lazy modules, packed or sparse tensors, a forward fakes cannot run, sparse outputs).
    ``on_output`` is given the copy's outputs (the decoding loop continues from its cache), and
    ``module_output`` one module's (see :func:`flopcount.tracers.dispatch.trace`); ``run_name`` is
    what a failure line calls the run."""
    call = prepare_call(inputs)
    facts = model_facts(model) if facts is None else facts
    # a step of the decoding loop: its draws from Python's and numpy's generators are left for the next step
    return _fake_run(model, call, facts, FoundRandom(random_states()), on_output=on_output, module_output=module_output,
                     run_name=run_name)[0]


def _fake_run(
    model: nn.Module, call: PreparedCall, facts: ModelFacts, drawn: FoundRandom, run_name: str = "auto tracer", **options: Any
) -> Tuple[Optional[Trace], str]:
    """The forward on fake copies and "", or None and why it was not run there (what fakes
    cannot copy or keep) or could not run. A fake run's garbage holds no data: automatic
    collection is paused and its young generations collected when it ends, so its short-lived
    copy of the model starts no full collection of the process."""
    from flopcount.tracers import dispatch

    if facts.lazy:
        return None, "lazy modules are not materialised yet"
    if has_sparse(call.tensors, facts.parameters, facts.buffers):
        # a fake copy of a sparse tensor keeps its layout but not its stored values
        return None, "the inputs or weights hold sparse tensors, whose non-zeros fake tensors do not keep"
    if facts.packed is not None:
        # torch's packed quantized weights are C++ objects a FakeTensorMode cannot copy
        return None, "the model has quantized packed parameters"
    # Python's and numpy's generators (``drawn``: their states now): a forward may draw from them
    # (LayerDrop) even on fakes. A run handing its outputs on watches each first call of structural
    # reuse for a draw; any other runs once unwatched (reading the generators costs ~13 us, numpy's
    # ~50 us more: once per count, not once per first call) and, where it booked a call from an earlier one and drew,
    # again from the same states, watched (a block that drew is not booked again: a next call may
    # branch otherwise).
    # The unwatched run's read, made once its young garbage is collected, also tells the caller that
    # the generators are as found (``drawn.unchanged``): its set back would change nothing.
    watch = options.get("on_output") is not None
    unchanged = False
    try:
        with PausedCollections():
            run = dispatch.trace(model, call, fake_copy=True, facts=facts, watch_random=watch, run_name=run_name, **options)
        if run.reused_calls and not watch:
            unchanged = same_random_states(drawn.states, random_states())
            if not unchanged:
                set_random_states(drawn.states)
                with PausedCollections():
                    run = dispatch.trace(model, call, fake_copy=True, facts=facts, watch_random=True, run_name=run_name, **options)
    except FakeRunError as exc:
        return None, exc.reason
    if _made_sparse(run):
        return None, "the forward makes sparse tensors, whose non-zeros fake tensors do not have"
    drawn.unchanged = unchanged  # nothing runs after this but the caller's return
    return run, ""


def _made_sparse(run: Trace) -> bool:
    """Whether an op of a fake run made a sparse tensor (whose stored values are unknown)."""
    for event in run.records:
        if isinstance(event, ReplayedCall):
            continue  # its ops' calls are those of an earlier call, seen in the records already
        for out in event.call.outputs:
            if isinstance(out, TensorMeta) and out.sparse and out.nnz is None:
                return True
    return False


def _dataless(tensors: Sequence[Any], facts: ModelFacts) -> Optional[str]:
    for tensor in itertools.chain(tensors, facts.parameters, facts.buffers):
        if is_dataless(tensor):
            kind = "on the meta device" if tensor.device.type == "meta" else "FakeTensors"
            return f"inputs or weights are {kind}"
    return None
