"""The TorchDispatchMode tracer: records every aten op as it executes, forward and
(optionally) backward, with shapes, schema-named arguments and the owning module.

Works on real, meta and fake tensors alike because nothing here reads tensor data:
a data-dependent read of a meta/fake tensor (``.item()``, ``bool(t)``, ``torch.equal``)
is answered with a placeholder value and reported in the trace's warnings.

Op names follow the one vocabulary of ``_vocabulary.py``: kernel spellings are renamed
to their canonical names, and the composites jit records as one op (``F.linear``,
``torch.matmul``, SDPA, the RNN ops, ``F.multi_head_attention_forward``...) are recorded
as one event by a pass-through TorchFunctionMode that mutes the aten ops underneath, so
CPU, meta and jit give the same operators and numbers. Backward ops are recorded as they run.

Backward ops are attributed to the module whose forward created the autograd node
that runs them: module entries and exits are stamped with autograd's sequence number
during forward, and each backward op looks up its node's sequence number.
"""

from __future__ import annotations

import contextlib
import itertools
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple

import torch
from torch import nn

from flopcount.core.diagnostics import first_line, module_place
from flopcount.core.inputs import PreparedCall, fake_tensor_type, is_dataless, prepare_call
from flopcount.core.model_facts import ModelFacts, model_facts
from flopcount.errors import NeedsDataError, TraceError, UsageError
from flopcount.step.loss import needs_backward
from flopcount.step.optimizers import OptimizerSpec, sparse_gradient
from flopcount.tracers._backward import BackwardAttribution, cut_from_callers_graph, run_backward
from flopcount.tracers._modules import ModuleOutput, ModuleStack, forward_error
from flopcount.tracers._optimizer import FakeOptimizerStep
from flopcount.tracers._real_run import model_kept
from flopcount.tracers._reuse import IndexRefused, Reuse, reuse_enabled
from flopcount.tracers._vocabulary import CompositeInterceptor
from flopcount.tracers.fake.copies import FakeRunError, SharedHooks, fake_copies, give_back, quiet_fake_logs, reason_for
from flopcount.tracers.fake.hf_tracing import real_branches
from flopcount.tracers.fake.meta_kernels import NeedsValues, refused_by_real_kernel
from flopcount.tracers.fake.shape_cache import ShapeCache
from flopcount.types import Trace

__all__ = ["trace"]

from flopcount.tracers._recorder import DataReads, HopRecorder, Recorder, outputs_of, value_of


def trace(
    model: nn.Module,
    inputs: Any = (),
    kwargs: Optional[Mapping[str, Any]] = None,
    *,
    backward: bool = False,
    loss_fn: Optional[Callable[[Any], Any]] = None,
    fake_copy: bool = False,
    optimizer: Optional[OptimizerSpec] = None,
    marker: Optional[Callable[[int], Any]] = None,
    facts: Optional[ModelFacts] = None,
    on_output: Optional[Callable[[Any], None]] = None,
    watch_random: bool = False,
    module_output: Optional[ModuleOutput] = None,
    run_name: str = "dispatch tracer",
) -> Trace:
    """See :func:`_trace`. A forward that calls ``torch.cond`` is traced again with the
    recorder torch keeps out of dynamo (torch compiles an eager ``cond``; the fast recorder's
    own code must not be traced, and keeping every op out of dynamo costs ~10 us per op)."""
    options: Dict[str, Any] = dict(
        backward=backward, loss_fn=loss_fn, fake_copy=fake_copy, optimizer=optimizer, marker=marker,
        on_output=on_output, watch_random=watch_random, module_output=module_output, run_name=run_name,
    )
    call = prepare_call(inputs, kwargs)
    facts = model_facts(model) if facts is None else facts
    try:
        try:
            return _shared_or_own(model, call, facts, Recorder, options)
        except (IndexRefused, TraceError, FakeRunError) as exc:  # IndexRefused itself: the forward went on
            if not _in_chain(exc, lambda e: isinstance(e, IndexRefused)):
                raise
        # a layer-index stand-in of structural reuse was refused by the forward: once more without
        return _shared_or_own(model, call, facts, Recorder, dict(options, index_proxies=False))
    except (TraceError, FakeRunError) as exc:
        if not _refused_by_dynamo(exc):
            raise
    return _shared_or_own(model, call, facts, HopRecorder, options)


def _shared_or_own(model: nn.Module, call: PreparedCall, facts: ModelFacts, recorder_type: Any, options: Dict[str, Any]) -> Trace:
    """:func:`_trace`; a fake copy's modules share their empty hook dictionaries
    (``fake.copies.SharedHooks``: fewer objects for the garbage collector to walk while the count
    runs), unless the forward changed one (registered a hook on a module of the copy), in which
    case the run, or its failure, is not trusted and the forward runs again on a copy whose
    modules have dictionaries of their own. Not for a run handing its outputs on (``on_output``):
    that would hand them twice (nor for one handing a module's output on, ``module_output``)."""
    if not options.get("fake_copy") or options.get("on_output") is not None or options.get("module_output") is not None:
        return _trace(model, call, facts, recorder_type, **options)
    shared = SharedHooks()
    try:
        run = _trace(model, call, facts, recorder_type, shared_hooks=shared, **options)
    except Exception:
        if not shared.touched:
            raise
        return _trace(model, call, facts, recorder_type, **options)
    if shared.touched:
        return _trace(model, call, facts, recorder_type, **options)
    return run


def _refused_by_dynamo(exc: BaseException) -> bool:
    """True when the failure came from torch's compiler (an eager higher-order op compiling
    the fast recorder's own code), somewhere in the exception's chain."""
    return _in_chain(exc, lambda e: type(e).__module__.startswith("torch._dynamo"))


def _in_chain(exc: BaseException, test: Callable[[BaseException], bool]) -> bool:
    """True when ``test`` holds for an exception in ``exc``'s chain (causes and contexts)."""
    return _first_in_chain(exc, test) is not None


def _first_in_chain(exc: BaseException, test: Callable[[BaseException], bool]) -> Optional[BaseException]:
    """The first exception in ``exc``'s chain (``exc``, then its causes and contexts) for which
    ``test`` holds; None when none does."""
    seen: Set[int] = set()
    current: Optional[BaseException] = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if test(current):
            return current
        current = current.__cause__ or current.__context__
    return None


def _needs_values(exc: BaseException) -> Optional[str]:
    """What failed for want of tensor values, somewhere in ``exc``'s chain, on a run whose
    inputs or weights have none (meta or fake): an op :func:`~flopcount.tracers.fake.meta_kernels.fallback`
    refused (``NeedsValues``: ``.cpu()``/``.tolist()`` of a meta tensor, ``nonzero``, an op without
    a meta kernel), a fake tensor's data-dependent op, or ``Tensor.numpy()``, which torch refuses
    for meta and fake tensors before any op is dispatched (so only its message tells it). None
    for any other failure (a shape error fails on real tensors too)."""
    from torch._subclasses import fake_tensor as ft

    needs_data = (NeedsValues, ft.DataDependentOutputException, ft.DynamicOutputShapeException, ft.UnsupportedOperatorException)

    def refused(error: BaseException) -> bool:
        if isinstance(error, needs_data):
            return True
        if not isinstance(error, (TypeError, RuntimeError)):
            return False
        text = str(error)  # meta: "can't convert meta device type tensor to numpy"; fake: ".numpy() is not supported"
        return "to numpy" in text or ".numpy()" in text

    found = _first_in_chain(exc, refused)
    if found is None:
        return None
    if isinstance(found, NeedsValues):
        return first_line(found)
    return f"{type(found).__name__}: {first_line(found)}"


def _data_refusal(exc: BaseException, where: str, inputs_text: str, tensors: Iterable[torch.Tensor]) -> Optional[NeedsDataError]:
    """The refusal of a forward that failed on meta or fake ``tensors`` (its inputs, parameters
    and buffers) for want of their values (:func:`_needs_values`), naming the module
    running; None when the tensors have data or the failure is another one."""
    what = _needs_values(exc)
    if what is None or not any(is_dataless(t) for t in tensors):
        return None
    place = module_place(where)
    return NeedsDataError(
        f"the forward cannot run on the meta device or on fake tensors: {place} needs tensor values they do not "
        f"have ({what}); count it with real weights and inputs (tracer='auto', or tracer='dispatch' on real tensors)",
        module_path=where,
        input_shapes=inputs_text,
    )


def _trace(
    model: nn.Module,
    call: PreparedCall,
    facts: ModelFacts,
    recorder_type: Any,
    *,
    backward: bool = False,
    loss_fn: Optional[Callable[[Any], Any]] = None,
    fake_copy: bool = False,
    optimizer: Optional[OptimizerSpec] = None,
    marker: Optional[Callable[[int], Any]] = None,
    index_proxies: bool = True,
    watch_random: bool = False,
    on_output: Optional[Callable[[Any], None]] = None,
    shared_hooks: Optional[SharedHooks] = None,
    module_output: Optional[ModuleOutput] = None,
    run_name: str = "dispatch tracer",
) -> Trace:
    """Run ``model`` once under a TorchDispatchMode and return its aten op events.

    ``backward=True`` also runs the backward pass of ``loss_fn(outputs)`` (default:
    every floating output with a gradient of ones) and records its ops with phase
    "backward", attributed to the module whose forward created them. ``loss_fn``'s
    own forward ops are recorded at the root. The model is left as found.

    ``fake_copy=True`` runs a copy of the model with fake parameters, buffers and inputs
    (see ``_fake.py``): nothing is computed and the caller's objects are never touched.
    A forward that needs a real value raises :class:`FakeRunError` instead of guessing.

    ``optimizer`` (with ``backward``) then runs one step of that optimizer on fake twins
    of the parameters that got a gradient, its ops recorded with phase "optimizer" at
    the root (see ``_optimizer.py``); the user's parameters and optimizer are not stepped.

    ``marker(index)`` (real runs only) is a context manager entered around the run of
    each recorded op and composite, ``index`` being its event's position in the trace.

    ``on_output(outputs)`` is given what the forward returned (on a fake run, the copy's
    outputs: the KV cache a decode step continues from), after backward if any.

    ``module_output`` (name, callable): the callable is given the output of the module of that
    qualified name as it returns (on a fake run, the copy's), by the run's module stack: the
    decoding loop keeps an encoder-decoder's encoder output from the prefill.

    ``run_name`` is what a failure line calls the run: the tracer the caller chose (``"auto
    tracer"`` for the default count, whichever path failed), or the reading (``"profile"``).
    """
    needs_backward(backward, loss_fn, optimizer)
    args, kw = call.args, call.kwargs
    flat_inputs = list(call.tensors)
    inputs_text = call.description
    preserve: Any
    names: Mapping[nn.Module, str]
    reusing = fake_copy and not backward and recorder_type is Recorder and reuse_enabled()
    if fake_copy:
        # a forward-only run reuses blocks (below): their parameters need no fakes unless read
        copied = fake_copies(
            model, flat_inputs, call.rebuild, modules=facts.modules, shared_hooks=shared_hooks, lazy=reusing,
            attributes=facts.tensor_attributes, names=facts.names,
        )
        run_model, fake_mode, flat_inputs = copied.model, copied.mode, copied.tensors
        names = facts.names_on(copied.copies) if copied.names is None else copied.names  # lazy: filled as copied
        args, kw = copied.call
        # the copy needs no restoring, and fake tensors draw no random number: the process's
        # RNG is left alone (setting it back would rewind other threads' draws)
        preserve = contextlib.ExitStack()
        preserve.enter_context(quiet_fake_logs())
    else:
        run_model = model
        if backward:  # the backward ends at the model's inputs, never in the caller's graph
            cut = cut_from_callers_graph(flat_inputs)
            if any(a is not b for a, b in zip(cut, flat_inputs)):
                flat_inputs = cut
                args, kw = call.rebuild(cut)
        fake_mode = _fake_mode(itertools.chain(flat_inputs, facts.parameters, facts.buffers))
        preserve = contextlib.nullcontext()
        names = facts.names
    modules = ModuleStack(names, hand_over=module_output)
    # a real run: the model's state given back as found while the module stack follows it (_real_run.py)
    followed = modules if fake_copy else model_kept(model, modules)
    recorder = recorder_type(modules, answer_reads=not fake_copy)
    recorder.marker = marker
    recorder.real_checks = fake_copy
    shape_cache = ShapeCache(fake_mode, fake_tensor_type(), copied.maker) if fake_copy else None
    recorder.shape_cache = shape_cache
    reuse = None
    if reusing:
        # forward-only fake runs: a call matching an earlier one is booked from it (_reuse.py)
        reuse = Reuse(
            run_model, names, modules, recorder, shape_cache, fake_mode, fake_tensor_type(), index_proxies, copied.metas,
            lazy=copied.lazy, watch_random=watch_random,
        )
        reuse.install()
    attribution = BackwardAttribution(modules, () if fake_copy else [*run_model.parameters(), *flat_inputs]) if backward else None
    recorder.attribution = attribution
    with contextlib.ExitStack() as outer:
        if fake_copy and on_output is None:
            # no fake of the run is handed on: its mode serves a next count (run last, after its exit)
            outer.callback(give_back, copied)
        if reuse is not None:
            outer.callback(reuse.uninstall)  # the copy's modules get their own classes back
        if fake_mode is not None:
            # Fake tensors only work inside their mode (tensors made in forward must be
            # fake too); the extra reader answers data reads while the state is restored.
            outer.enter_context(fake_mode)
            if not fake_copy:
                outer.enter_context(DataReads(modules))
        with preserve, followed, torch.set_grad_enabled(backward):
            interceptor = CompositeInterceptor(
                recorder, value_of, outputs_of, shape_cache.run_composite if shape_cache is not None else None
            )
            # on fakes, transformers' "is tracing" probe answered as a real run answers it (hf_tracing.py)
            branches = real_branches(facts.modules if fake_copy else (), flat_inputs, call.tensors)
            if fake_copy:  # the index checks read the values it follows, and the caller's token ids
                if branches.values is not None:  # the recorder checks with its values (once per op)
                    recorder.indices.followed = branches.values.value
                    branches.values.checks_indices = False
                    recorder.known.fake = None  # they follow the fakes' values already: not twice
                recorder.indices.seed(flat_inputs, _with_known(call))
            with attribution or contextlib.nullcontext(), interceptor, recorder, branches:
                try:
                    outputs = run_model(*args, **kw)
                except Exception as exc:
                    refused = refused_by_real_kernel(exc)
                    if refused is not None:  # the real call fails here too: no real run to find out
                        raise forward_error(refused, modules.current, inputs_text, run_name) from refused
                    if fake_copy:
                        if isinstance(exc, FakeRunError):  # a module of the lazy copy could not be copied: said so
                            raise
                        raise FakeRunError(reason_for(exc, modules.current), modules.current) from exc
                    tensors = itertools.chain(flat_inputs, facts.parameters, facts.buffers)
                    refusal = _data_refusal(exc, modules.current, inputs_text, tensors)
                    if refusal is not None:  # on meta or fake tensors: no real run to fall back on
                        raise refusal from exc
                    raise forward_error(exc, modules.current, inputs_text, run_name) from exc
                if attribution is not None and recorder.conds:
                    raise UsageError(
                        "backward=True through torch.cond is not counted yet (torch runs the branch below "
                        "autograd under a dispatch mode); count the forward with backward=False"
                    )
                trained: Set[int] = set()
                if attribution is not None:
                    attribution.start_backward(names, interceptor)
                    try:
                        trained = run_backward(run_model, outputs, flat_inputs, loss_fn, recorder)
                    except UsageError:
                        raise
                    except Exception as exc:
                        if fake_copy:
                            where = recorder.module_stack()
                            raise FakeRunError(reason_for(exc, where[-1] if where else "")) from exc
                        raise _backward_error(exc, recorder, inputs_text, run_name) from exc
                if on_output is not None:
                    on_output(outputs)
                del outputs
    if reuse is not None and reuse.refused:
        raise IndexRefused("a layer index stand-in was refused and the forward went on")
    if optimizer is not None:
        _record_optimizer_step(optimizer, model, [id(p) in trained for p in run_model.parameters()], recorder)
    notes = _notes(recorder.placeholders) + _cond_notes(recorder.both_branches)
    return Trace(
        tuple(recorder.events), "dispatch", modules.calls,
        notes + branches.notes + tuple(sorted(recorder.assumptions)), gaps=notes,
        shape_cache=_cache_stats(shape_cache, reuse),
    )


def _cache_stats(shape_cache: Optional[ShapeCache], reuse: Optional[Reuse]) -> Dict[str, Any]:
    """The shape cache's stats, with the calls structural reuse booked from an earlier one."""
    if shape_cache is None:
        return {}
    stats = shape_cache.stats()
    stats["reused_calls"] = reuse.reused if reuse is not None else 0
    return stats


def _record_optimizer_step(spec: OptimizerSpec, model: nn.Module, trained: List[bool], recorder: Recorder) -> None:
    """Record one step of ``spec`` on fake twins of ``model``'s parameters (phase "optimizer")."""
    found = sparse_gradient(model, "count_flops", ", and an optimizer step over it costs the rows the batch looked up, which "
                            "the step on fake parameters does not see (it would price the whole table); count without "
                            "optimizer=, or with sparse=False")
    if found is not None:  # the twins' gradients are dense: SGD would be priced over the whole table
        raise UsageError(found[1])
    step = FakeOptimizerStep(spec, list(model.parameters()), trained, "count_flops")
    recorder.phase = "optimizer"
    recorder.answer_reads = False  # the step reads its step counters: the fake mode knows them
    recorder.run_op = recorder.shape_cache = None
    with step.running(), CompositeInterceptor(recorder, value_of, outputs_of, None), recorder:
        step.step()


def _fake_mode(tensors: Iterable[torch.Tensor]) -> Any:
    """The FakeTensorMode of the first fake tensor among ``tensors`` (None if none is fake)."""
    fake = fake_tensor_type()
    for tensor in tensors:
        if isinstance(tensor, fake):
            return tensor.fake_mode  # type: ignore[attr-defined]  # isinstance(tensor, FakeTensor) above
    return None


def _with_known(call: PreparedCall) -> Sequence[torch.Tensor]:
    """The call's tensors, each one without data whose value the caller knows (``call.known``)
    replaced by that value: what the index checks take each fake input to stand for."""
    if not call.known:
        return call.tensors
    return [known if known is not None else tensor for tensor, known in zip(call.tensors, call.known)]


def _backward_error(exc: BaseException, recorder: Recorder, inputs_text: str, run_name: str) -> TraceError:
    """A TraceError for a failure in ``loss_fn`` or in backward, naming the module."""
    in_backward = recorder.phase == "backward"
    stack = recorder.module_stack() if in_backward else ()
    where = stack[-1] if stack else ""
    text = str(exc).strip()
    detail = f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__
    place = f" in module '{where}'" if where else ""
    return TraceError(
        f"{'backward' if in_backward else 'loss_fn'} failed{place} ({run_name}) with inputs {inputs_text}: {detail}",
        module_path=where,
        input_shapes=inputs_text,
    )


def _cond_notes(both: Mapping[str, int]) -> Tuple[str, ...]:
    return tuple(
        f"torch.cond in {module_place(where)} ({n}x): its predicate has no value on "
        "meta/fake tensors, so both branches are counted (an upper bound); count real tensors "
        "(tracer='dispatch') for the branch taken"
        for where, n in sorted(both.items())
    )


def _notes(placeholders: Mapping[Tuple[str, str], int]) -> Tuple[str, ...]:
    if not placeholders:
        return ()
    listing = ", ".join(
        f"{op} x{n} in {module_place(module)}"
        for (op, module), n in sorted(placeholders.items(), key=lambda kv: kv[0])
    )
    return (
        "dispatch: data-dependent reads of meta/fake tensors were answered with placeholders "
        f"(all() -> True, any() and other booleans -> False, numbers -> 0, equal() -> True): {listing}",
    )
