"""``flopcount.profile``: run the model for real under ``torch.profiler`` and join every
profiled op call with flopcount's cost of that same call (see ``_tree.py`` for the join)."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import json
import math
import os
import tempfile
import threading
import warnings
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, TypeVar, Union, cast

import torch
from torch import nn

from flopcount.bench.device import real_run, synchronize
from flopcount.core.analysis import cost_events, uncompiled
from flopcount.core.diagnostics import warn_estimated
from flopcount.core.inputs import PreparedCall, prepare_call, require_module
from flopcount.core.model_facts import model_facts
from flopcount.core.registry import HandlerRegistry
from flopcount.devices import roofs_for
from flopcount.devices.measured import raise_to_achieved
from flopcount.devices.roofline import TF32X3, Roofs
from flopcount.errors import UsageError, int_at_least
from flopcount.handlers import default_registry
from flopcount.profiling import _book, _tree
from flopcount.profiling.result import ESTIMATED, ProfileResult
from flopcount.step.loss import backward_roots, differentiable, needs_backward, nothing_to_differentiate, unique_tensors
from flopcount.tracers import dispatch
from flopcount.tracers._backward import needs_plain_backward, real_step_backward
from flopcount.tracers.fake.copies import has_lazy_parameters, shared_tensor_copy

__all__ = ["profile"]

# One profile at a time in this process.
#
# torch's profiler is process-wide: two ``torch.profiler.profile`` sessions started from two
# threads at once crash the process (a segmentation fault on torch 2.13, measured with two
# threads each profiling a small model). :func:`one_at_a_time` makes the second thread's
# ``profile`` wait for the first; a ``profile`` started on a thread that is already profiling
# (from the model's forward or the loss) is a :class:`~flopcount.errors.UsageError`.
_F = TypeVar("_F", bound=Callable[..., Any])

_LOCK = threading.Lock()
_holder: List[int] = []  # the thread now profiling (empty when none)


def one_at_a_time(function: _F) -> _F:
    """``function`` holding the process's profiling lock while it runs."""

    @functools.wraps(function)
    def exclusive(*args: Any, **kwargs: Any) -> Any:
        if _holder and _holder[0] == threading.get_ident():
            raise UsageError(
                f"{function.__name__}() was called while this thread is already inside {function.__name__}() "
                "(from the model's forward or loss_fn): torch's profiler cannot run inside itself"
            )
        with _LOCK:
            _holder.append(threading.get_ident())
            try:
                return function(*args, **kwargs)
            finally:
                _holder.clear()

    return cast(_F, exclusive)


@one_at_a_time
def profile(
    model: nn.Module,
    inputs: Any = (),
    kwargs: Optional[Mapping[str, Any]] = None,
    *,
    backward: bool = False,
    loss_fn: Optional[Callable[[Any], Any]] = None,
    warmup: int = 2,
    steps: int = 5,
    device: Union[None, str, torch.device] = None,
    roofs: Optional[Roofs] = None,
    registry: Optional[HandlerRegistry] = None,
    keep_trace: bool = True,
) -> ProfileResult:
    """Profile ``steps`` real steps of ``model`` (a forward; with ``backward=True`` also the
    backward of ``loss_fn(outputs)``, default every floating output with a ones gradient,
    as :func:`flopcount.count_flops` counts it) and join each profiled aten call with its
    counted cost: per op, module and phase, FLOPs, MACs, bytes, measured time per step, and
    the roofline figures under ``roofs``.

    One extra *join step* runs under the profiler with flopcount's dispatch recorder, which
    marks each recorded op; the timed steps run without it. The model, its flags and the
    inputs are left as found (a model with lazy modules runs as a copy); the RNG too when
    this is the process's only Python thread (else the timed steps' draws advance it as your
    own steps would: setting it back would rewind another thread's draws).

    What it measures and writes: with ``roofs=None`` (the default) this machine's roofs
    are read from ``$XDG_CACHE_HOME/flopcount/roofs.json`` (``~/.cache/flopcount/roofs.json``);
    when that file has none for this machine they are measured first (micro-benchmarks,
    seconds) and written there when sane. ``FLOPCOUNT_NO_ROOFS_CACHE=1`` neither reads nor
    writes the file (roofs are then measured on every call); ``roofs=`` given measures and
    writes nothing. Nothing else is written.

    Threads: torch's profiler is process-wide, so profiles run one at a time (a second
    thread's ``profile`` waits for the first); a ``profile`` inside a profile on the same
    thread is a :class:`~flopcount.errors.UsageError`.
    """
    require_module(model, "profile")
    int_at_least(warmup, 0, "profile: warmup")
    int_at_least(steps, 1, "profile: steps")
    needs_backward(backward, loss_fn)
    if roofs is not None and not isinstance(roofs, Roofs):
        raise UsageError(f"roofs must be a flopcount Roofs, got {type(roofs).__name__}")
    model = uncompiled(model)
    lazy = has_lazy_parameters(model)
    if lazy:
        # as count_flops: the run materialises a copy's lazy modules, not the caller's; a
        # first plain step materialises them (the join step's trace would restore their hooks)
        model = shared_tensor_copy(model)
    borrowed = real_run(model, () if inputs is None else inputs, kwargs, device, "profile")
    dev = borrowed.device
    roof = roofs_for(dev, roofs)
    table = registry if registry is not None else default_registry()
    activities = [torch.profiler.ProfilerActivity.CPU]
    if dev.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with borrowed.borrow(model) as on_device:
        step = _Step(on_device, borrowed.run, backward, loss_fn, dev)
        for _ in range(max(warmup, int(lazy))):
            step.fresh()
            step()
        join_args, join_kwargs = step.fresh()
        # described as the caller's inputs, as a failing plain step describes them (RealRun.borrow)
        join = dataclasses.replace(prepare_call(join_args, join_kwargs), description=borrowed.call.description)
        names = model_facts(on_device)  # module names and aliases, read on the model as it runs
        with _profiling(activities) as join_prof:
            trace = dispatch.trace(
                on_device, join, backward=backward, loss_fn=loss_fn, marker=_marker, facts=names, run_name="profile",
            )
            synchronize(dev)
        # the profiler's schedule discards a warm-up step: its own first-step cost stays out;
        # the events and the trace are taken when the cycle is complete
        captured: Dict[str, Any] = {}

        def ready(prof: Any) -> None:
            captured["events"] = prof.events()
            captured["trace"] = _chrome_trace(prof) if keep_trace else None

        schedule = torch.profiler.schedule(wait=0, warmup=1, active=steps)
        with _profiling(activities, schedule, ready) as timed_prof:
            step.fresh()
            step()
            synchronize(dev)
            with _quiet():  # the profiler starts recording here (and says so on stderr)
                timed_prof.step()
            for index in range(steps):
                step.fresh()
                with _range(f"{_tree.STEP}{index}"):
                    step()
                    synchronize(dev)
                with _quiet():
                    timed_prof.step()
    facts = _book.event_facts(cost_events(trace.events, table))
    measure = _tree.device_total if dev.type == "cuda" else _tree.cpu_total
    measured, args, count = _join(join_prof.events(), captured.get("events") or (), facts, measure, roof)
    if roofs is None:  # measured roofs are no ceiling if an op here ran faster than them
        roof = raise_to_achieved(roof, _achieved(facts, measured, count, roof), "an op of this profile")
    ledger = _book.book(facts, measured, roof, count, names.aliases)
    return ProfileResult(
        rows=_book.rows(ledger),
        unmatched=_book.unmatched(facts, measured, count),
        roofs=roof,
        overview=_book.overview(measured, count),
        device=str(dev),
        steps=count,
        warmup=warmup,
        backward=backward,
        timing="device" if dev.type == "cuda" else "cpu",
        # stacklevel 4: the caller, above one_at_a_time's wrapper
        warnings=tuple(trace.warnings) + _swap_notes(measured.swaps, count) + warn_estimated(roof, ESTIMATED, stacklevel=4),
        trace=captured.get("trace"),
        trace_args=args,
        _operators=ledger.cost_rows("operators"),
        _modules=ledger.cost_rows("modules"),
        _phases=ledger.cost_rows("phases"),
    )


#: an op's rate counts toward the compute roof only when it is long enough to time well
_MIN_RATE_FLOPS, _MIN_RATE_US = 1e6, 20.0


def _achieved(facts: Sequence[_book.EventFacts], measured: _book.Measured, steps: int, roof: Roofs) -> Dict[str, float]:
    """The highest FLOP/s a counted op reached per dtype column (ops of at least a MFLOP and
    20 us per call; never above the ISA peak, which a mis-joined time could otherwise claim).
    Float32 attention priced at :data:`TF32X3` (a third of the TF32 peak, no column of its own)
    reached its rate with the TF32 units at three times it: booked so under "tfloat32", whose
    roof is raised where it is below that."""
    ceiling = roof.details.get("isa_peak_flops") or {}
    best: Dict[str, float] = {}
    for index, fact in enumerate(facts):
        time_us = measured.time.get(index, 0.0) / max(1, steps)
        if fact.flops < _MIN_RATE_FLOPS or time_us < _MIN_RATE_US:
            continue
        column = roof.column(fact.dtype, fact.event.call.op)
        if column is None:
            continue
        rate = fact.flops / (time_us * 1e-6)
        if column == TF32X3:  # float32 attention as 3xTF32: three TF32 products per float32 one
            column, rate = "tfloat32", 3 * rate
        rate = min(rate, float(ceiling.get(column, math.inf)))
        best[column] = max(best.get(column, 0.0), rate)
    return best


def _join(
    join_events: Any, timed_events: Any, facts: Sequence[_book.EventFacts], measure: Callable[[_tree.Node], float], roof: Roofs
) -> Tuple[_book.Measured, Dict[int, Dict[str, Any]], int]:
    """Book each timed step's top-level ops to the counted events (see ``_tree``): the
    measured sums, the trace args per profiler event id, and the number of steps."""
    join_tops = _tree.top_ops(_tree.from_profiler(join_events))
    join_keys = [t.node.key for t in join_tops]
    timed_roots = _tree.from_profiler(timed_events)
    all_tops = _tree.top_ops(timed_roots)
    measured = _book.Measured()
    args: Dict[int, Dict[str, Any]] = {}
    windows = _tree.steps(timed_roots)
    for window in windows:
        tops = [t for t in all_tops if window.start <= t.node.start <= window.end]
        measured.step_us += window.end - window.start
        alignment = _tree.align(join_keys, [t.node.key for t in tops])
        _book.book_step(tops, join_tops, alignment, facts, measured, measure, roof, args)
    return measured, args, max(len(windows), 1)


def _swap_notes(swaps: Mapping[str, int], steps: int) -> Tuple[str, ...]:
    """One sentence per fused path the timed run took instead of the counted ops."""
    return tuple(
        f"the timed run took another path: {what} (x{n / steps:g} per step); its time is booked to those counted "
        "ops in proportion to their attainable time"
        for what, n in swaps.items()
    )


class _Step:
    """One step as the dispatch tracer counts it: the forward (no grad), or the forward
    and ``autograd.grad`` of the loss with ones seeds (made once, outside timed steps); a
    graph with a reentrant checkpoint, which refuses ``autograd.grad``, gets a plain backward,
    every ``.grad`` it would write set aside and put back (as the count's own backward).

    Inputs holding state the forward changes (a KV cache it appends to) are copied before
    each step (:meth:`fresh`, outside the timed ranges), so every step runs the same call
    and the caller's objects stay as found."""

    def __init__(self, model: nn.Module, call: PreparedCall, backward: bool,
                 loss_fn: Optional[Callable[[Any], Any]], dev: torch.device):
        self.model, self.backward, self.loss_fn, self.dev = model, backward, loss_fn, dev
        self.args, self.kwargs = call.args, call.kwargs
        self.flat = list(call.tensors)
        self.stateful = _has_objects((self.args, self.kwargs))
        self.call = (self.args, self.kwargs)
        self.seeds: Optional[List[torch.Tensor]] = None
        self.plain = False  # a reentrant checkpoint in the graph: a plain backward (read once, with the seeds)
        self.set_aside: List[torch.Tensor] = []  # the tensors whose .grad a plain backward sets aside

    def fresh(self) -> Any:
        """The call arguments for the next step: the originals, or a copy of their objects
        (the top-level input tensors shared) when they hold state."""
        if self.stateful:
            memo = {id(t): t for t in self.flat}
            self.call = copy.deepcopy((self.args, self.kwargs), memo)
        return self.call

    def __call__(self) -> None:
        args, kwargs = self.call
        if not self.backward:
            with torch.no_grad():
                self.model(*args, **kwargs)
            return
        with torch.enable_grad():
            outputs = self.model(*args, **kwargs)
            roots = backward_roots(outputs, self.loss_fn)  # the loss the dispatch tracer differentiates
            leaves = differentiable(unique_tensors(list(self.model.parameters()) + list(self.flat)))
            nothing = nothing_to_differentiate(outputs, roots, leaves)
            if nothing is not None:
                raise UsageError(nothing)
            if self.seeds is None:
                self.seeds = [torch.ones_like(r) for r in roots]
                self.plain, graph_leaves = needs_plain_backward(roots, [t for t in self.flat if isinstance(t, torch.Tensor)])
                self.set_aside = unique_tensors(leaves + graph_leaves) if self.plain else []
            real_step_backward(roots, self.seeds, self.set_aside or leaves, self.plain)


_PLAIN = (int, float, bool, str, bytes, type(None), torch.dtype, torch.device, torch.Size)


def _has_objects(value: Any) -> bool:
    """True when ``value`` holds anything besides tensors, plain values and the builtin
    containers (a cache object, a dataclass the forward may change)."""
    if isinstance(value, (torch.Tensor, *_PLAIN)):
        return False
    if type(value) in (list, tuple):
        return any(_has_objects(v) for v in value)
    return any(_has_objects(v) for v in value.values()) if type(value) is dict else True


def _range(name: str) -> Any:
    """A profiler range: torch's public ``record_function`` (~15 us a range on this machine
    against ~0.7 us for torch's private ``_RecordFunctionFast``, used until 2026-11-27: one per
    counted op of the join step and one per timed step, so the timed ops are untouched; the
    same rows and unmatched calls, benchmarks/private_torch_costs.py)."""
    return torch.profiler.record_function(name)


def _marker(index: int) -> Any:
    return _range(f"{_tree.MARKER}{index}")


@contextlib.contextmanager
def _profiling(activities: List[Any], schedule: Any = None, ready: Optional[Callable[[Any], None]] = None) -> Iterator[Any]:
    """``torch.profiler.profile`` recording shapes, its start and stop lines silenced."""
    prof = torch.profiler.profile(activities=activities, record_shapes=True, schedule=schedule, on_trace_ready=ready)
    with warnings.catch_warnings():
        # torch's note that a schedule's cycle clears its events: they are taken in `ready`
        warnings.filterwarnings("ignore", message=".*clears events at the end of each cycle.*")
        with _quiet():
            prof.__enter__()
        try:
            yield prof
        finally:
            with _quiet():
                prof.__exit__(None, None, None)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Kineto prints start/stop lines on stderr's file descriptor; the library never prints."""
    try:
        saved = os.dup(2)
    except OSError:
        yield
        return
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            try:
                yield
            finally:
                os.dup2(saved, 2)
    finally:
        os.close(saved)


def _chrome_trace(prof: Any) -> Optional[Dict[str, Any]]:
    handle, path = tempfile.mkstemp(suffix=".json", prefix="flopcount-trace-")
    os.close(handle)
    try:
        with _quiet():
            prof.export_chrome_trace(path)
        with open(path) as fh:
            data = json.load(fh)
        return data if isinstance(data, dict) else {"traceEvents": data}
    except (OSError, ValueError, RuntimeError):
        return None
    finally:
        with contextlib.suppress(OSError):
            os.remove(path)
