"""transformers' "is tracing" probe, answered on flopcount's fake run (and jit's) as a real run answers it.

transformers (5.x) asks ``is_tracing(tensor)`` before code that reads a tensor's values, and
counts every ``FakeTensor`` as tracing (``utils.import_utils.is_fake_tensor``). On a fake copy
it then takes the branches meant for ``torch.compile`` / ``torch.export``: a decoder called
with no mask (no cache) or an all-ones mask materialises a (batch, 1, q, kv) causal mask
instead of passing ``is_causal`` to SDPA, and with a mask present the SDPA integration repeats
K and V for grouped-query attention (``repeat_kv``) instead of ``enable_gqa``. A count or a
memory estimate made that way describes another forward than the real one (more backward
FLOPs, a mask and expanded K/V that the real step never allocates).

:class:`RealBranches`, entered around a fake run of a model that holds transformers modules
(and only when transformers is imported already: it is never imported here):

* follows the values a real run would have, beside the fake run (:class:`FakeValues`): the
  caller's small inputs (token ids, attention masks, position ids; up to ``LIMIT`` elements) and
  every small tensor computed from them or from factories alone (``arange``, ``ones``) is also
  computed on CPU;
* answers transformers' probe, for a fake whose value it follows, as for a real tensor:
  transformers takes the real branch, and the reads that branch makes (``padding_mask.all()``)
  get the true value (the fake's ``constant`` is set for the read, so the modes below record
  the read as a real run records it);
* answers as before ("tracing") for a fake whose value it cannot know (computed from the
  weights, a meta input, too large), and says so in :attr:`RealBranches.notes`, which the
  reading puts in its warnings (not for a check whose real branch only decides whether to log).

The jit tracer runs the real model under ``torch.jit`` tracing, where transformers' ``is_tracing()``
is true for every tensor (``is_jit_tracing``): :class:`JitBranches`, entered around that run,
answers ``is_jit_tracing()`` with False in the tracing thread, so the mask code reads the real
values (jit bakes the branch taken into the graph, as for any data-dependent branch). Models that
call ``torch.jit.is_tracing()`` themselves keep their jit branch (flopcount does not patch torch).

Only the thread that runs the forward sees these answers: transformers' function is
wrapped while at least one such run is active in the process (the wrapper asks the running
thread's innermost run, else calls transformers' own function), and put back when the last
one ends, also when the forward raises.
"""

from __future__ import annotations

import sys
import threading
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.weak import WeakIdKeyDictionary

from flopcount.core.inputs import fake_tensor_type
from flopcount.tracers.fake.indices import INDEXED, check_indices
from flopcount.tracers.fake.values import UNDECIDED, cpu_value, keep_value, run_on_cpu

__all__ = [
    "JIT_PROBE_NAME", "PROBE_MODULE", "PROBE_NAME", "FakeValues", "JitBranches", "RealBranches", "jit_branches",
    "real_branches", "seed_running", "uses_transformers",
]

#: where transformers keeps the probe ``is_tracing`` calls for a tensor argument
PROBE_MODULE = "transformers.utils.import_utils"
PROBE_NAME = "is_fake_tensor"
#: and the one ``is_tracing`` asks for torch.jit's tracing state
JIT_PROBE_NAME = "is_jit_tracing"
#: the largest tensor (elements) whose value is followed: token ids and masks of a batch of long
#: sequences, not a (batch, 1, q, kv) mask of a long context
LIMIT = 1 << 20

_aten = torch.ops.aten
#: the reads of a value into Python that a followed fake answers
_LOCAL_SCALAR, _EQUAL, _IS_NONZERO = _aten._local_scalar_dense.default, _aten.equal.default, _aten.is_nonzero.default
_CPU = torch.device("cpu")
#: callers whose real branch only checks for a warning to log (whether the token ids hold the pad
#: token: an ``any`` over two columns): taking their tracing branch is not noted
_QUIET = frozenset({"transformers.modeling_utils.warn_if_padding_and_no_attention_mask"})


class FakeValues(TorchDispatchMode):
    """Fake tensor -> its CPU value, for the small tensors a real run's values decide (the
    caller's inputs, and what is computed from them and from factories alone: position ids,
    masks, their checks). Entered on top of the run's other modes, so that it sees every op (the
    shape cache answers some below it without running them). A read of a fake it knows goes down
    with the value set as the fake's ``constant`` (FakeTensorMode then answers it). An in-place op
    it cannot follow forgets every value if it writes into a fake it knows or a view of one; ops
    whose result has no decided value (``empty``, random draws) give unknown results."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False  # as the recorder: no per-op shim for a mode that compiles nothing

    def __init__(self) -> None:
        super().__init__()
        self._fake: Any = fake_tensor_type()
        self._values = WeakIdKeyDictionary()
        #: check the indices of known value (fake/indices.py) here; off where the count's recorder,
        #: below, checks them (with these values)
        self.checks_indices = True

    def seed(self, fakes: Sequence[Any], reals: Sequence[Any]) -> None:
        """Each fake of ``fakes`` stands for the real tensor at the same place of ``reals``:
        its value is a copy of the real one, where small, dense and real."""
        with torch._C._DisableTorchDispatch():
            for fake, real in zip(fakes, reals):
                if (
                    isinstance(fake, self._fake) and type(real) in (torch.Tensor, nn.Parameter)
                    and real.numel() <= LIMIT and real.layout == torch.strided and real.device.type != "meta"
                    and tuple(real.shape) == tuple(fake.shape) and real.dtype == fake.dtype
                ):
                    self._values[fake] = real.detach().to(_CPU, copy=True)

    def knows(self, tensor: Any) -> bool:
        return tensor in self._values

    def value(self, tensor: Any) -> Optional[torch.Tensor]:
        """The CPU value of fake ``tensor`` when followed, else None (the index checks read it)."""
        found = self._values.get(tensor)
        return found if isinstance(found, torch.Tensor) else None

    def __torch_dispatch__(self, func: Any, types: Any, args: Tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is _LOCAL_SCALAR or func is _EQUAL or func is _IS_NONZERO:  # a read (compared, not hashed: per op)
            return self._read(func, args, kwargs)
        if self.checks_indices and id(func) in INDEXED:  # an index the real kernel refuses (fake steps: memory, plan)
            check_indices(func, args, kwargs, self.value)
        out = func(*args, **kwargs)
        # followed: a small fake result of an op whose top-level fakes are all known (an integral
        # result of an unknown one, token ids on meta, would only fail on the CPU: Unknown)
        if type(out) is self._fake and out.numel() <= LIMIT and self._known_args(args, kwargs):
            self._follow(func, args, kwargs, out)
        elif len(self._values) and func._schema.is_mutable:
            self._written(func, args, kwargs)
        return out

    def _known_args(self, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> bool:
        """No fake among the top-level arguments is unknown (a quick test before an op is
        followed: a float op mostly has an activation or a weight among them, an integral one
        the token ids, whose value a meta input does not give)."""
        values, fake = self._values, self._fake
        for value in (*args, *kwargs.values()):
            if type(value) is fake and value not in values:
                return False
        return True

    def _follow(self, func: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any], out: Any) -> None:
        value = None  # unknown for an op whose result no real run decides (a random draw, ``empty``)
        if torch.Tag.nondeterministic_seeded not in func.tags and func.overloadpacket not in UNDECIDED:
            try:
                value = self._on_cpu_run(func, args, kwargs)
            except Exception:  # an unknown input, or an op the CPU refuses: the value stays unknown
                pass
        if not keep_value(self._values, out, value) and func._schema.is_mutable:
            self._written(func, args, kwargs)

    def _on_cpu_run(self, func: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
        """``func`` run below every mode on the CPU values of its arguments (devices made cpu)."""
        with torch._C._DisableTorchDispatch():
            return run_on_cpu(func, args, kwargs, self._on_cpu, lambda value: isinstance(value, torch.device))

    def _on_cpu(self, tensor: torch.Tensor) -> torch.Tensor:
        value = cpu_value(self._values, tensor, isinstance(tensor, self._fake), LIMIT)
        if value is not tensor:
            return value
        # a real tensor the forward reached some other way: a copy, so that no op followed
        # here writes into it (an in-place op on a view of it)
        return tensor.detach().clone()

    def _written(self, func: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> None:
        """An in-place op not followed: every value is forgotten if it wrote into a fake this
        mode knows or a view of one (a known tensor's views are known or made too large to
        follow; a view of an unknown tensor is unknown, so a write into an unknown tensor that
        is no view of a known one changes no known value)."""
        for index, argument in enumerate(func._schema.arguments):
            if argument.alias_info is None or not argument.alias_info.is_write:
                continue
            value = args[index] if index < len(args) else kwargs.get(argument.name)
            for tensor in value if isinstance(value, (list, tuple)) else (value,):
                if isinstance(tensor, self._fake) and (
                    tensor in self._values or (tensor._base is not None and tensor._base in self._values)
                ):
                    self._values = WeakIdKeyDictionary()
                    return

    def _read(self, func: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
        fakes = [a for a in args if isinstance(a, self._fake)]
        values = [self._values.get(a) for a in fakes]
        if not fakes or any(v is None for v in values):
            return func(*args, **kwargs)  # as before: FakeTensorMode refuses a value it does not have
        before = [f.constant for f in fakes]
        try:
            for fake, value in zip(fakes, values):
                fake.constant = value
            return func(*args, **kwargs)
        except Exception:  # FakeTensorMode would not fold it (a real tensor beside the fake): read here
            return self._on_cpu_run(func, args, kwargs)
        finally:
            for fake, old in zip(fakes, before):
                fake.constant = old


class _Runs(threading.local):
    """This thread's runs that answer a probe, innermost last."""

    def __init__(self) -> None:
        self.runs: List[Any] = []


class _Probe:
    """One of transformers' probes, wrapped while some thread runs a forward that answers it
    (``count`` of them): the running thread's innermost run answers, else transformers' own."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.lock = threading.Lock()
        self.count = 0
        self.module: Any = None
        self.original: Optional[Callable[..., bool]] = None
        self.wrapper: Optional[Callable[..., bool]] = None
        self.local = _Runs()

    def enter(self, run: Any) -> bool:
        """Install the wrapper and make ``run`` this thread's innermost (False: transformers' probe
        is not there, nothing done)."""
        module = sys.modules.get(PROBE_MODULE)
        if module is None:
            return False
        with self.lock:
            if self.count == 0:
                original = getattr(module, self.name, None)
                if not callable(original):
                    return False
                self.module, self.original = module, original
                self.wrapper = _wrapper(self, original)
                setattr(module, self.name, self.wrapper)
            self.count += 1
        self.local.runs.append(run)
        return True

    def leave(self, run: Any) -> None:
        """Undo :meth:`enter` for ``run``."""
        runs = self.local.runs
        if runs and runs[-1] is run:
            runs.pop()
        with self.lock:
            self.count -= 1
            if self.count == 0:
                # put transformers' own function back, unless someone replaced ours since (their
                # function may call ours: it answers as transformers' own with no run active)
                if getattr(self.module, self.name, None) is self.wrapper:
                    setattr(self.module, self.name, self.original)
                self.module = self.original = self.wrapper = None


def _wrapper(probe: _Probe, original: Callable[..., bool]) -> Callable[..., bool]:
    def answered(*args: Any) -> bool:
        runs = probe.local.runs
        if runs:
            answer = runs[-1].answer(*args)
            if answer is not None:
                return bool(answer)
        return original(*args)

    answered.__name__ = answered.__qualname__ = probe.name
    answered.__wrapped__ = original  # type: ignore[attr-defined]
    answered.__doc__ = original.__doc__
    return answered


# The wrappers of transformers' probes (process-wide by nature: each replaces a function of another
# package's module); who is answered is per thread (a run entered in that thread).
#: ``is_fake_tensor(x)``: answered by :class:`RealBranches` (fake runs)
_PROBE = _Probe(PROBE_NAME)
#: ``is_jit_tracing()``: answered by :class:`JitBranches` (the jit tracer's real run)
_JIT_PROBE = _Probe(JIT_PROBE_NAME)


class RealBranches:
    """Entered around a fake forward (see the module docstring); ``notes``: the places where
    transformers was told "tracing" because the value it would have read is unknown here."""

    def __init__(self, active: bool, fakes: Sequence[Any] = (), reals: Sequence[Any] = ()) -> None:
        self.active = active
        self.values = FakeValues() if active else None
        self._seeds = (fakes, reals)
        self._traced: Dict[str, None] = {}
        self._installed = False
        self._fake: Any = fake_tensor_type() if active else None

    @property
    def notes(self) -> Tuple[str, ...]:
        if not self._traced:
            return ()
        return (
            "transformers' tracing path counted in " + ", ".join(self._traced) + ": it asked whether a fake tensor is "
            "traced before reading its values, which a fake run cannot know here (computed from the weights or from "
            "an input without data); a real forward may run other code there (for the attention mask: a mask "
            "materialised instead of SDPA's is_causal, K and V repeated for grouped-query attention): count real "
            "tensors (tracer='dispatch') for the real branch",
        )

    def seed(self, fakes: Sequence[Any], reals: Sequence[Any]) -> None:
        if self.values is not None:
            self.values.seed(fakes, reals)

    def answer(self, tensor: Any) -> Optional[bool]:
        """transformers' probe for ``tensor`` on this run: False (not a fake: the real branch)
        for a fake whose value is followed, None (transformers' own answer) otherwise."""
        if self.values is None or not isinstance(tensor, self._fake):
            return None
        if self.values.knows(tensor):
            return False
        caller = _caller()
        if caller not in _QUIET:
            self._traced[caller] = None
        return None

    def __enter__(self) -> RealBranches:
        self._installed = self.active and _PROBE.enter(self)
        if not self._installed:
            return self
        assert self.values is not None
        try:
            self.values.seed(*self._seeds)
            self._seeds = ((), ())
            self.values.__enter__()
        except BaseException:
            self._installed = False
            _PROBE.leave(self)
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        if not self._installed:
            return
        self._installed = False
        try:
            assert self.values is not None
            self.values.__exit__(*exc)
        finally:
            _PROBE.leave(self)


def _caller() -> str:
    """The transformers function that asked (two frames above the probe: is_tracing, its caller)."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_globals.get("__name__") in (__name__, PROBE_MODULE):
        frame = frame.f_back  # type: ignore[assignment]
    if frame is None:
        return "transformers"
    return f"{frame.f_globals.get('__name__', '?')}.{frame.f_code.co_name}"


def uses_transformers(modules: Iterable[Any]) -> bool:
    """Whether transformers is imported and a module of ``modules`` (modules or ``(name,
    module)`` pairs) is one of its classes (or a subclass of one)."""
    if PROBE_MODULE not in sys.modules:
        return False
    kinds = (type(item[1] if isinstance(item, tuple) else item) for item in modules)
    return any(cls.__module__.startswith("transformers.") for kind in kinds for cls in kind.__mro__)


def real_branches(modules: Iterable[Any], fakes: Sequence[Any] = (), reals: Sequence[Any] = ()) -> RealBranches:
    """:class:`RealBranches` for a fake forward of a model with ``modules`` (inert where no
    module is transformers'), ``fakes`` standing for the caller's ``reals`` (same order)."""
    return RealBranches(uses_transformers(modules), fakes, reals)


def seed_running(fakes: Sequence[Any], reals: Sequence[Any]) -> None:
    """:meth:`RealBranches.seed` of the innermost run this thread has entered (none: nothing),
    for a reading that makes its fake copies inside the run (estimate_memory)."""
    if _PROBE.local.runs:
        _PROBE.local.runs[-1].seed(fakes, reals)


class JitBranches:
    """Entered around the jit tracer's run of a model that holds transformers modules: in the
    tracing thread, transformers' ``is_jit_tracing()`` answers False, so that ``is_tracing`` (and the
    mask code that asks it before reading a value) takes the branch of a real forward; the tensors
    are real, so their values are read as in that forward (torch.jit bakes each read into the
    graph as a constant: the trace holds the branch this input took, as for any model)."""

    def __init__(self, active: bool) -> None:
        self.active = active
        self._installed = False

    def answer(self, *args: Any) -> Optional[bool]:
        return False

    def __enter__(self) -> JitBranches:
        if self.active:
            self._installed = _JIT_PROBE.enter(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._installed:
            self._installed = False
            _JIT_PROBE.leave(self)


def jit_branches(modules: Iterable[Any]) -> JitBranches:
    """:class:`JitBranches` for the jit tracer's run of a model with ``modules`` (inert where no
    module is transformers')."""
    return JitBranches(uses_transformers(modules))
