"""The caller's process and tensors as found: the random generators, the input tensors
(a forward that writes to its inputs in place), and the state a forward reads that its module
does not hold (plain objects, the globals its code names). Shared by the tracers, the step's
layer replay and the benchmark."""

from __future__ import annotations

import array
import builtins
import collections
import contextlib
import dis
import enum
import functools
import operator
import os
import random
import sys
import threading
import weakref
from types import CodeType, FunctionType, ModuleType
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from flopcount.core.inputs import flat_values, is_dataless
from flopcount.core.rebound import called_function
from flopcount.core.weakcache import PerObject

#: the roots of modules whose threads never draw torch random numbers: a notebook kernel's and
#: IPython's own threads (heartbeat, IOPub, control, history), a debugger's, an event loop's, tqdm's
#: monitor (HF's Trainer and Lightning start it), TensorBoard's event writers
_QUIET_THREAD_MODULES = frozenset({"ipykernel", "IPython", "zmq", "jupyter_client", "tornado", "debugpy", "pydevd",
                                   "_pydevd_bundle", "_pydev_bundle", "prompt_toolkit", "tqdm", "tensorboard",
                                   "tensorboardX"})
#: ipykernel's IOPub thread is a plain Thread; it is known by its name, as are a DataLoader's
#: pin-memory thread and TensorBoard's event writer in torch ("Thread-N (target)" since Python 3.10)
_QUIET_THREAD_NAMES = frozenset({"IOPub"})


def _quiet(thread: threading.Thread) -> bool:
    """A thread that cannot be drawing random numbers: one of a notebook's or a debugger's own,
    or a thread started outside Python (torch's autograd device threads appear as
    ``_DummyThread`` once they run a Python hook) that runs Python only in callbacks."""
    kind = type(thread)
    return (kind.__module__.split(".")[0] in _QUIET_THREAD_MODULES or thread.name in _QUIET_THREAD_NAMES
            or thread.name.endswith("(_pin_memory_loop)") or kind.__name__ == "_DummyThread"
            or kind.__module__.startswith("torch.utils.tensorboard"))


def _alone() -> bool:
    """No other Python thread can be drawing random numbers: this is the process's only thread
    but for a notebook's, a debugger's and torch's own (:func:`_quiet`). In a Jupyter kernel (five
    or more threads of its own) the generators are still set back as found."""
    me = threading.current_thread()
    return all(t is me or _quiet(t) for t in threading.enumerate())


@contextlib.contextmanager
def preserved_rng() -> Iterator[None]:
    """Set the CPU (and initialised CUDA) generators back on exit when this thread was the
    process's only Python thread throughout; else leave them where the work left them.

    The generators are process-wide: setting them back also rewinds every draw another thread
    made meanwhile, which then repeats its numbers (issue #29 item 18). So with another thread
    alive nothing is set back: a user's model that draws (train-mode dropout) in a benchmark's,
    a profile's or a plan's real run draws from the process's generator exactly as the same
    calls in the user's own code would, and the caller's next draw follows on from them. What
    flopcount draws itself uses generators of its own (measured roofs' operands); a count on
    fake tensors draws nothing; the tracers' real runs draw on private generators
    (:class:`PrivateRandom`, :class:`PrivateRandomCalls`)."""
    alone = _alone()
    rng = torch.get_rng_state() if alone else None
    cuda_rng = torch.cuda.get_rng_state_all() if alone and torch.cuda.is_available() and torch.cuda.is_initialized() else None
    try:
        yield
    finally:
        if rng is not None and _alone():
            torch.set_rng_state(rng)
            if cuda_rng is not None:
                torch.cuda.set_rng_state_all(cuda_rng)


def random_states() -> Tuple[Any, Any]:
    """The states of Python's ``random`` module and of numpy's global generator: what a forward's
    ``random.random()`` or ``np.random.rand()`` draws from (LayerDrop, stochastic depth). Compare
    two with :func:`same_random_states`. ``numpy.random`` is imported here if it is not yet (numpy
    is a dependency; ~5 ms once per process): a fake run imports it anyway, through
    ``torch._dynamo.utils``, and a state that was None before a process's first count and set after
    it read as a draw, so that count traced its forward twice (reading the state costs ~50 us)."""
    import numpy.random

    return random.getstate(), numpy.random.get_state()


def same_random_states(before: Tuple[Any, Any], after: Tuple[Any, Any]) -> bool:
    """Whether nothing drew from the generators of :func:`random_states` between ``before`` and
    ``after`` (numpy's key array compared by value)."""
    if before[0] != after[0]:
        return False
    kind, keys, *rest = before[1]
    kind_after, keys_after, *rest_after = after[1]
    # one generator kind: two arrays of one dtype and length, equal exactly when their bytes are
    # (~0.6 us; an elementwise comparison and ``all()`` ~3.5 us)
    return kind == kind_after and rest == rest_after and keys.tobytes() == keys_after.tobytes()


def set_random_states(states: Tuple[Any, Any]) -> None:
    """Set the generators of :func:`random_states` back to ``states`` when this thread is the
    process's only Python thread (as :func:`preserved_rng` sets torch's: setting them back would
    rewind another thread's draws)."""
    if not _alone():
        return
    import numpy.random

    python_state, numpy_state = states
    random.setstate(python_state)
    numpy.random.set_state(numpy_state)


class FoundRandom:
    """The states of Python's ``random`` and numpy's global generator as a run found them
    (:func:`random_states`), which :func:`preserved_random_modules` sets back on exit, and whether
    that set back is known to change nothing."""

    __slots__ = ("states", "unchanged")

    def __init__(self, states: Tuple[Any, Any]):
        self.states = states
        #: True: the generators were read since, found as they were, and nothing that could draw ran
        #: after that read: the set back is skipped (numpy's ``set_state``, ~70 us a count). Set by
        #: the one who read them, where nothing but returning runs after (``tracers._fake_run``)
        self.unchanged = False


@contextlib.contextmanager
def preserved_random_modules(set_back: bool = True) -> Iterator[FoundRandom]:
    """Gives the states of Python's ``random`` and numpy's global generator on entry
    (:func:`random_states`, held by a :class:`FoundRandom`) and, with ``set_back``, sets them back
    on exit (:func:`set_random_states`) unless it is known to change nothing
    (``FoundRandom.unchanged``). A count runs the user's forward, whose Python code draws from
    them for real even on fake tensors (``if self.training and random.random() < p``); before, each
    count advanced the caller's generators, and a fallback real run drew after the fake run's draws.
    ~0.1 ms per count (read and set back, numpy's generator most of it)."""
    found = FoundRandom(random_states())
    try:
        yield found
    finally:
        if set_back and not found.unchanged:
            set_random_states(found.states)


class PrivateRandom(TorchDispatchMode):
    """A TorchDispatchMode that runs every random op of the entering thread on generators of
    its own, so a real run that draws (train-mode dropout, ``randn`` in a forward) neither
    advances the caller's generators nor has to set them back (issue #29 item 18: setting the
    process-wide generator back rewinds every draw another thread made meanwhile).

    Each private generator starts from a copy of the state of the generator the op would have
    drawn from (the device's default generator, or a ``generator=`` the call names): the run
    draws exactly what it would have drawn, and the caller's generator is only read. Ops whose
    schema takes a ``generator`` get the private one; overloads without that argument
    (``rand.default``, ``randint_like.low_dtype``...) run as their ``generator`` sibling;
    ``native_dropout`` is run as the ``bernoulli_`` mask it draws. A drawing op none of this
    covers (the CPU flash-attention kernel with ``dropout_p > 0``, cuDNN's RNN with dropout, a
    device other than CPU and CUDA) draws from the process's generator: :attr:`fell_back` is
    then True and the caller sets that generator back as before. Dataless tensors (meta, fake)
    draw nothing and pass through. The mode stack is per thread: other threads are not seen.
    Not usable under torch.jit tracing: any dispatch mode changes what jit records."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # no dynamo-disabling shim around each op: a per-op cost, and a toggle of the
        # interpreter's frame evaluation on every op while other threads run
        return False

    def __init__(self) -> None:
        super().__init__()
        self._generators: Dict[Any, torch.Generator] = {}
        #: a random op drew from the process's generator (see the class docstring)
        self.fell_back = False
        #: how many ops on tensors with data drew on a private generator
        self.redirected = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if not _seeded_overload(func):
            return func(*args, **kwargs)
        index = _generator_index(func)
        if index is None:
            if func is torch.ops.aten.native_dropout.default:
                return self._dropout(func, args, kwargs)
            sibling = _with_generator(func)
            if sibling is None:
                if _draws(func, args, kwargs) and not _dataless_call(args, kwargs):
                    self.fell_back = True
                return func(*args, **kwargs)
            func, index = sibling, _generator_index(sibling)
            assert index is not None
        given = args[index] if index < len(args) else kwargs.get("generator")
        if _dataless_call(args, kwargs):
            return func(*args, **kwargs)
        private = self._private(given, _device_of(args, kwargs))
        if private is None:
            self.fell_back = True
            return func(*args, **kwargs)
        if index < len(args):
            args = tuple(args[:index]) + (private,) + tuple(args[index + 1 :])
        else:
            kwargs = dict(kwargs, generator=private)
        self.redirected += 1
        return func(*args, **kwargs)

    def _private(self, given: Optional[torch.Generator], device: torch.device) -> Optional[torch.Generator]:
        """The private twin of ``given`` (or of ``device``'s default generator), made on first use."""
        source = given
        if source is None:
            if device.type == "cpu":
                source = torch.default_generator
            elif device.type == "cuda":
                index = device.index if device.index is not None else torch.cuda.current_device()
                source = torch.cuda.default_generators[index]
            else:
                return None
        key = id(source)
        private = self._generators.get(key)
        if private is None:
            private = torch.Generator(device=source.device)
            private.set_state(source.get_state())  # a read of the caller's generator, never a write
            self._generators[key] = private
        return private

    def _dropout(self, func: Any, args: Any, kwargs: Dict[str, Any]) -> Any:
        """``native_dropout(input, p, train)`` with its mask drawn on the private generator:
        ``mask ~ Bernoulli(1 - p)``, ``output = input * mask / (1 - p)`` (zeros for p = 1)."""
        names = ("input", "p", "train")
        bound = dict(zip(names, args), **kwargs)
        tensor, p, train = bound["input"], float(bound["p"]), bound.get("train")
        if train is False or _dataless_call((tensor,), {}):
            return func(*args, **kwargs)
        private = self._private(None, tensor.device)
        if private is None:
            self.fell_back = True
            return func(*args, **kwargs)
        mask = torch.empty_like(tensor, dtype=torch.bool).bernoulli_(1.0 - p, generator=private)
        self.redirected += 1
        scale = 0.0 if p >= 1.0 else 1.0 / (1.0 - p)
        return tensor * mask * scale, mask


@functools.cache
def _seeded_overload(func: Any) -> bool:
    return torch.Tag.nondeterministic_seeded in getattr(func, "tags", ())


@functools.cache
def _generator_index(func: Any) -> Optional[int]:
    return next((index for index, argument in enumerate(func._schema.arguments) if argument.name == "generator"), None)


@functools.cache
def _with_generator(func: Any) -> Any:
    """The overload of the same op whose arguments are ``func``'s plus ``generator``."""
    names = [a.name for a in func._schema.arguments]
    packet = func.overloadpacket
    for name in packet.overloads():
        other = getattr(packet, name)
        other_names = [a.name for a in other._schema.arguments]
        if "generator" in other_names and [n for n in other_names if n != "generator"] == names:
            return other
    return None


def _draws(func: Any, args: Any, kwargs: Dict[str, Any]) -> bool:
    """Whether a seeded op without a generator draws here: attention and RNN kernels draw
    only with a dropout probability above zero in training."""
    bound = {**{a.name: v for a, v in zip(func._schema.arguments, args)}, **kwargs}
    return not any(key in bound and not bound[key] for key in ("dropout_p", "dropout")) and bound.get("train", True) is not False


def _tensors(args: Any, kwargs: Dict[str, Any]) -> Iterator[torch.Tensor]:
    return (value for value in flat_values((*args, *kwargs.values())) if isinstance(value, torch.Tensor))


def _dataless_call(args: Any, kwargs: Dict[str, Any]) -> bool:
    device = kwargs.get("device")
    if device is not None and torch.device(device).type == "meta":
        return True
    return any(is_dataless(t) for t in _tensors(args, kwargs))


def _device_of(args: Any, kwargs: Dict[str, Any]) -> torch.device:
    device = kwargs.get("device")
    if device is not None:
        return torch.device(device)
    return next((tensor.device for tensor in _tensors(args, kwargs)), torch.device("cpu"))


def _layout(tensor: torch.Tensor) -> Tuple[Any, ...]:
    """Shape, strides and offset of a strided tensor; the shape of a sparse one (COO, CSR,
    CSC, BSR, BSC tensors have no strides)."""
    if tensor.layout != torch.strided:
        return (tensor.shape, tensor.layout)
    return (tensor.shape, tensor.stride(), tensor.storage_offset())
#: random ops whose ``train`` argument turns the draw off (eval-mode dropout draws nothing)
_TRAIN_GATED = ("dropout", "feature_dropout", "alpha_dropout", "feature_alpha_dropout", "native_dropout", "rrelu")


@functools.cache
def _seeded(op: str) -> bool:
    """``aten::name`` (any overload) draws from a generator (:func:`_seeded_overload`). An op
    torch does not know (a custom op) counts as drawing, and so does a call into TorchScript
    that jit left opaque (its body is not in the trace)."""
    if op in ("prim::CallFunction", "prim::CallMethod"):
        return True
    namespace, _, name = op.partition("::")
    packet = getattr(getattr(torch.ops, namespace, None), name.split(".")[0], None) if name else None
    return namespace not in ("aten", "prim") if packet is None else _packet_draws(packet, unknown=True)


def _packet_draws(packet: Any, unknown: bool) -> bool:
    """An overload of ``packet`` draws from a generator (:func:`_seeded_overload`); ``unknown``
    where the packet cannot list its overloads."""
    try:
        return any(_seeded_overload(getattr(packet, overload)) for overload in packet.overloads())
    except (AttributeError, RuntimeError):
        return unknown


def drawing_events(events: Iterable[Any]) -> int:
    """How many of the trace's events drew random numbers from a generator (dropout in train
    mode, ``randn``, ``bernoulli_``...)."""
    found = 0
    for event in events:
        call = event.call
        op = call.op
        if not _seeded(op):
            continue
        if call.arg("train") is False or call.arg("training") is False:
            continue  # eval-mode dropout, an RNN's inter-layer dropout in eval: nothing drawn
        if call.arg("dropout") == 0 or call.arg("dropout_p") == 0:
            continue  # an RNN or attention kernel without dropout
        if op.partition("::")[2].split(".")[0].rstrip("_") in _TRAIN_GATED and call.arg("p") == 0:
            continue
        found += 1
    return found


#: torch functions that draw although no aten op of their name does (they call one that does)
_PYTHON_DRAWS = frozenset(
    {
        "dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout",
        "feature_dropout", "rrelu", "rrelu_", "gumbel_softmax", "scaled_dot_product_attention",
    }
)  # fmt: skip


@functools.cache
def _may_draw(name: str) -> bool:
    """A torch function of this name may draw: a dropout-family function, or the name of an
    aten op that draws (``randn``, ``Tensor.uniform_``, ``multinomial``, ``lstm``...)."""
    if name in _PYTHON_DRAWS:
        return True
    if not name or name.startswith("__"):
        return False
    try:
        packet = getattr(torch.ops.aten, name, None)
    except RuntimeError:
        return False
    return packet is not None and _packet_draws(packet, unknown=False)


class PrivateRandomCalls(TorchFunctionMode):
    """:class:`PrivateRandom` for torch.jit's traces (issue #29 item 18). A dispatch mode
    active while torch.jit traces changes what it records (a convolution is recorded as its
    decomposition), so this TorchFunctionMode of the entering thread passes every torch call
    through as it is, and enters :class:`PrivateRandom`'s dispatch mode only for the duration
    of a call that may draw (:func:`_may_draw`: ``F.dropout``, ``torch.randn``,
    ``Tensor.uniform_``...). jit records such a call at its tracer kernel, above the dispatch
    mode, so the graph is the one recorded without it; the kernels underneath draw on the
    private generators. :attr:`redirected_calls` counts the calls that drew there; a draw made
    outside such a call (a TorchScript function calling ``randn``, a C++ extension) goes to
    the process's generator: compare with :func:`drawing_events` of the trace, and set the
    generator back when they disagree or :attr:`fell_back`.

    An active TorchFunctionMode makes torch's ``has_torch_function`` true, which turns off the
    fused eval paths of ``nn.MultiheadAttention`` and the Transformer layers: :meth:`pause` and
    :meth:`resume` take the mode off the stack around such a module (in eval mode, where those
    layers draw nothing)."""

    @staticmethod
    def available() -> bool:
        """The private torch name :meth:`pause` needs exists (without it the jit tracer sets the
        process's generator back instead, as before)."""
        return hasattr(torch.overrides, "_get_current_function_mode")

    def __init__(self) -> None:
        super().__init__()
        self.random = PrivateRandom()
        self._entered = False
        #: calls that drew on a private generator
        self.redirected_calls = 0
        self._called: Dict[Any, Any] = {}  # core/rebound.py: a Python function handed -> what it calls

    @property
    def fell_back(self) -> bool:
        """A random op drew from the process's generator (see :class:`PrivateRandom`)."""
        return self.random.fell_back

    def __enter__(self) -> PrivateRandomCalls:
        super().__enter__()
        self._entered = True
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._entered:
            self._entered = False
            super().__exit__(*exc)

    def pause(self) -> bool:
        """Take the mode off this thread's stack if it is on top; True when it was."""
        current = getattr(torch.overrides, "_get_current_function_mode", None)
        if not self._entered or current is None or current() is not self:
            return False  # a mode of the forward's own is above it: the fast path is off anyway
        self.__exit__(None, None, None)
        return True

    def resume(self) -> None:
        self.__enter__()

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if type(func) is FunctionType:  # or a wrapper the caller bound under a torch function's name
            func = self._called.get(func) or called_function(func, self._called)
        if not _may_draw(getattr(func, "__name__", "")):
            return func(*args, **kwargs)
        before = self.random.redirected
        with self.random:
            result = func(*args, **kwargs)
        if self.random.redirected > before:
            self.redirected_calls += 1
        return result


def plain_object(value: Any) -> bool:
    """Whether ``value``, held by a module as an attribute, is a plain object whose own attributes
    a forward may write (a config, a counter's holder): an instance with a ``__dict__`` or with
    ``__slots__`` of a Python class (``@dataclass(slots=True)``) that is not a module, a tensor, a
    class, a Python module, a function or a Python value. Keys that hold such an object by identity
    alone miss such a write (structural reuse, the step's layer replay): they key its own attributes
    too (:func:`object_state`)."""
    if isinstance(value, (torch.nn.Module, torch.Tensor, type, ModuleType, FunctionType, functools.partial)):
        return False
    try:
        own = vars(value)
    except Exception:  # no __dict__ (slots, a Python value), or a __getattr__ of its own that refuses
        kind = type(value)
        slots = _slots_of(id(kind))
        return bool(_SLOTS.fill(kind) if slots is None else slots) and not isinstance(value, GLOBAL_DATA)
    return isinstance(own, dict)


_MEMBER = type(type("_Slotted", (), {"__slots__": ("x",)}).__dict__["x"])  # types.MemberDescriptorType


def _slot_places(kind: type) -> Tuple[Tuple[str, int], ...]:
    """The slots a Python class's instances hold (``__slots__`` of it and its bases), each as its
    name and the place in ``kind.__mro__`` of the class whose member descriptor it is (a
    descriptor holds its class: :data:`_SLOTS` keeps none), read once per class; ``()`` for a class
    without (a C type's fields are not slots)."""
    found: Dict[str, int] = {}
    for place, base in enumerate(kind.__mro__):
        own = vars(base)
        if "__slots__" not in own:  # a C type's fields (a weak reference's ``__callback__``) are not slots
            continue
        for name, descriptor in own.items():
            if type(descriptor) is _MEMBER and descriptor.__objclass__ is base and name not in found:
                found[name] = place
    return tuple(found.items())


# per class, a lookup in C that keeps no class alive (an lru_cache held every class a count saw)
_SLOTS = PerObject(_slot_places)
_slots_of = _SLOTS.lookup


def object_state(value: Any) -> Dict[str, Any]:
    """A plain object's (:func:`plain_object`) own attributes: its ``__dict__`` (the very dictionary)
    and, where its class has ``__slots__``, the slots that are set (a new dictionary then). Before
    branch ``advreuse2`` a slotted object had no state to key: keyed by identity, a slot the parent
    set between two blocks, or a first call advanced, was not seen."""
    kind = type(value)
    slots = _slots_of(id(kind))
    if slots is None:
        slots = _SLOTS.fill(kind)
    try:
        own = vars(value)
    except TypeError:
        own = None
    if not slots:
        return own if own is not None else {}
    state = dict(own) if own is not None else {}
    mro = kind.__mro__
    for name, place in slots:
        descriptor: Any = vars(mro[place]).get(name)
        if type(descriptor) is not _MEMBER:  # deleted from its class since (``del Base.x``)
            continue
        try:
            state[name] = descriptor.__get__(value)
        except AttributeError:  # a slot not set
            continue
    return state


#: the globals a forward's work can depend on: Python data it can branch on or compute with
GLOBAL_DATA = (int, float, bool, complex, str, bytes, type(None), torch.dtype, torch.device, torch.layout,
               torch.memory_format, tuple, list, dict, set, frozenset, torch.Tensor, collections.deque, bytearray,
               array.array)
_GLOBAL_OPS = frozenset({"LOAD_GLOBAL", "STORE_GLOBAL", "DELETE_GLOBAL"})
#: the attribute ops that continue a path from a global (``othermod.FLAG``, ``CFG.flag = 1``, ``othermod.helper()``)
_ATTRIBUTE_OPS = frozenset({"LOAD_ATTR", "LOAD_METHOD", "STORE_ATTR", "DELETE_ATTR"})
_NOT_BOUND = object()
_BUILTINS = frozenset(vars(builtins))
#: a global's name, then the attributes read from it (``("othermod", "FLAG")``); one name for a plain global
Path = Tuple[str, ...]
#: (namespace, paths) of one module class: a function's closure (a :class:`_Closure`), or a
#: globals namespace as a :class:`_Globals` (what holds it, weakly): a class's entry holds nothing
#: of the user's (its namespaces, functions and cells may hold the class: it would never go)
NamedGlobals = Tuple[Tuple[Any, Tuple[Path, ...]], ...]
# class -> the size of its own __dict__ and the names in it that hold Python data, as last read
_OWN_DATA: weakref.WeakKeyDictionary[type, Tuple[int, Tuple[str, ...]]] = weakref.WeakKeyDictionary()
# module class -> where the functions its code runs are bound (:func:`code_bound`): (an index in its
# ``__mro__`` or a Python module's globals, name) pairs; the ids of what they held when its paths were read
_CODE_WHERE: PerObject[Tuple[Tuple[Tuple[Any, str], ...], Tuple[int, ...]]] = PerObject(lambda kind: _read_code(kind)[1])
_code_where_of = _CODE_WHERE.lookup
# code -> the paths it and the code nested in it name: each function's code read once per process
_CODE_PATHS: weakref.WeakKeyDictionary[CodeType, Tuple[Path, ...]] = weakref.WeakKeyDictionary()


def forward_globals(modules: Iterable[torch.nn.Module]) -> List[Tuple[Any, str, Any]]:
    """``(namespace, name, value)`` of each global that the code of a class of ``modules`` names
    (reads, writes or deletes) and that holds Python data (:data:`GLOBAL_DATA`), and of each
    attribute the code reads from a global Python module, class or plain object (``othermod.FLAG``,
    ``CFG.flag``, ``Block.calls``, ``othermod.CFG.flag``: the first attribute along the path that
    holds Python data; ``namespace`` is then that holder's own ``__dict__``, a class's read-only);
    each class once; and the class attributes of each class that hold Python data (its bases' too,
    not ``nn.Module``'s). The code: its ``forward`` (the code nested in it, each function a decorator
    wraps), the methods of its class that this code names (``self._forward_impl``, ``self.helper``:
    a name the class defines, not ``nn.Module``'s own), and the Python functions it names, by a
    global or along such a path (a module-level helper such as ``apply_rotary_pos_emb``, a helper
    of another Python module), followed from one to the next; torch's own functions and the
    standard library's are not followed. What a key of a module's calls holds besides the module
    (structural reuse, the step's layer replay): a flag a parent sets per layer, a counter a layer
    advances. Since branch ``advreuse2`` also: the functions of the class's properties, static and
    class methods and an ``lru_cache``'d helper's are followed; each followed function's closure
    variables (one :class:`ClosureValues` per function) and mutable defaults; every global holding
    data of a namespace whose code calls ``globals()``; a user's object (:func:`keyed_object`) the
    code hands on whole (``helper(CFG)``) or asks by a method (``CFG.is_on()``), or a class holds
    (``Block.cfg``); a user's random generator and ``os.environ``. Functions, classes, Python modules
    and other objects (a logger) are code and services, left out; so is what the code reads other
    ways: a global read through ``getattr`` with a computed name or a function held in a container
    (Python 3.11 has no cheap way to see every global read)."""
    found: List[Tuple[Any, str, Any]] = []
    seen: Dict[type, None] = {}
    for module in modules:
        kind = type(module)
        if kind in seen:
            continue
        seen[kind] = None
        found += _code_data(kind)
        found += _class_data(kind)
    return found


def _code_data(kind: type) -> List[Tuple[Any, str, Any]]:
    """:func:`forward_globals`' globals and attributes along paths of one class (not its class data)."""
    found: List[Tuple[Any, str, Any]] = []
    named = _named_globals(kind)
    for source, paths in named:
        if type(source) is _Closure:  # a function's closure: its variables' values, read together (one path)
            found += [(source, path[0], source.get(path[0])) for path in paths]
            continue
        namespace = source()
        if namespace is None:  # its module and the function (a helper a global held, rebound since) are gone
            continue
        for path in paths:
            if path is _EVERY_GLOBAL:  # the code calls ``globals()``: any of them may be read by name
                found += [(namespace, name, value) for name, value in list(namespace.items())
                          if not name.startswith("__") and isinstance(value, GLOBAL_DATA)]
                continue
            bound = _data_along(namespace, path)
            if bound is not None:
                found.append(bound)
    return found


#: the path of a namespace whose code calls ``globals()`` (``globals()[name]``): every global of it
#: that holds data, read on each keyed call
_EVERY_GLOBAL: Tuple[str, ...] = ("globals()",)


def _class_data(kind: type) -> List[Tuple[Any, str, Any]]:
    """``(namespace, name, value)`` of each class attribute of ``kind`` (its own or a base's, but
    ``nn.Module``'s and dunder names) that holds Python data, as ``kind`` resolves it: what
    ``self.n``, ``type(self).n`` and ``Block.n`` read, and ``type(self).n += 1`` writes."""
    found: List[Tuple[Any, str, Any]] = []
    for name in _class_data_names(kind):
        for base in kind.__mro__:
            holder = vars(base)
            if name in holder:
                if _class_datum(name, holder[name]):
                    found.append((holder, name, holder[name]))
                break
    return found


def _class_data_names(kind: type) -> Tuple[str, ...]:
    found = _class_data_of(id(kind))
    return _CLASS_DATA.fill(kind) if found is None else found


def _class_data_read(kind: type) -> Tuple[str, ...]:
    names: Dict[str, None] = {}
    for base in _own_bases(kind):
        names.update((name, None) for name, value in vars(base).items() if _class_datum(name, value))
    return tuple(names)


# module class -> the names of its class attributes that hold Python data (its bases' too)
_CLASS_DATA = PerObject(_class_data_read)
_class_data_of = _CLASS_DATA.lookup


def _own_bases(kind: type) -> Iterator[type]:
    """``kind`` and its bases but ``nn.Module`` and ``object``: the classes whose attributes a
    module's forward reads as its class's (``self.n``, ``type(self).n``)."""
    return (base for base in kind.__mro__ if base is not torch.nn.Module and base is not object)


def _own_data_names(base: type) -> Tuple[str, ...]:
    """The names of ``base``'s own attributes that hold Python data (:func:`_class_datum`), read
    again when its ``__dict__`` changed size since (an attribute added or removed)."""
    own = vars(base)
    cached = _OWN_DATA.get(base)
    if cached is None or cached[0] != len(own):
        names = tuple(name for name, value in own.items() if _class_datum(name, value))
        cached = _OWN_DATA[base] = (len(own), names)
    return cached[1]


def _class_datum(name: str, value: Any) -> bool:
    """Whether a class attribute ``name`` bound to ``value`` is Python data (:data:`GLOBAL_DATA`),
    a random generator or a user's plain object (:func:`keyed_object`: ``Block.cfg = Config()``,
    read as ``self.cfg.flag``, a descriptor holding a value), not a dunder name (``__constants__``,
    ``__annotations__``)."""
    return (isinstance(value, GLOBAL_DATA) or random_generator(value) or keyed_object(value)) and not (
        name.startswith("__") and name.endswith("__"))


def random_generator(value: Any) -> bool:
    """A generator object of the user's whose state is in C, out of its ``__dict__``: Python's
    ``random.Random()`` (and subclasses), numpy's ``Generator`` and ``RandomState`` (not imported
    here: known by their class's module)."""
    kind = type(value)
    found = _kind_of_class(id(kind))
    return (_KINDS.fill(kind) if found is None else found) == _GENERATOR


_OTHER, _GENERATOR, _USERS = 0, 1, 2


def _kind_read(kind: type) -> int:
    """What instances of ``kind`` are to the key: a random generator, a user's class (not torch's,
    nor the standard library's, nor a method wrapper) or other; per class (a lookup in C, on every
    keyed call's globals)."""
    if issubclass(kind, random.Random) or (kind.__name__ in ("Generator", "RandomState")
                                           and (kind.__module__ or "").startswith("numpy.random")):
        return _GENERATOR
    package = (kind.__module__ or "").partition(".")[0]
    if package != "torch" and package not in sys.stdlib_module_names and not issubclass(kind, _CODE_HOLDERS):
        return _USERS
    return _OTHER


# per class, a lookup in C that keeps no class alive (an lru_cache held every class a count saw)
_KINDS = PerObject(_kind_read)
_kind_of_class = _KINDS.lookup


def generator_state(value: Any) -> Any:
    """The state of a :func:`random_generator`, as hashable Python values: what its next draws
    follow from (a draw or a reseed changes it)."""
    if isinstance(value, random.Random):
        return value.getstate()
    state = value.bit_generator.state if hasattr(value, "bit_generator") else value.get_state(legacy=False)
    return _frozen(state)


def _frozen(value: Any) -> Any:
    if isinstance(value, dict):
        return tuple((k, _frozen(v)) for k, v in value.items())
    if hasattr(value, "tolist") and hasattr(value, "dtype"):  # a numpy array (a Mersenne Twister's key)
        return (str(value.dtype), tuple(value.shape), _frozen(value.tolist()))
    if isinstance(value, list):
        return tuple(_frozen(v) for v in value)
    return value


#: objects that hold code, not data: a class's methods wrapped
_CODE_HOLDERS = (staticmethod, classmethod, property)


def keyed_object(value: Any) -> bool:
    """A plain object (:func:`plain_object`) of a class of the user's (not torch's, nor the
    standard library's: a logger, a lock) that the key of a call holds with its own attributes
    where a forward reaches it from outside its module: a class attribute (``Block.cfg``), a global
    handed to a function (``helper(CFG)``) or whose method it calls (``CFG.is_on()``), a closure's
    variable."""
    kind = type(value)
    found = _kind_of_class(id(kind))
    return (_KINDS.fill(kind) if found is None else found) == _USERS and plain_object(value)


#: the containers whose entries :class:`FoundState` sets back (these exact types: a subclass's
#: methods may do more than hold entries, as transformers' ``ACT2FN`` instantiates on lookup)
_REFILLED = (dict, list, set)


class FoundState:
    """The state of the process a reading's forwards can write that neither the model's modules
    nor the run's copies hold, as found, to be set back (:meth:`set_back`; :func:`left_as_found`):
    the globals their code names (:func:`forward_globals`: ``global step; step += 1``, a helper's
    ``CFG.flag = 1``) and the Python data of their classes, their own and their bases' but
    ``nn.Module``'s (``type(self).calls += 1``, ``Block.calls += 1``: a fake copy's modules and a
    real run's private twin share the caller's classes).

    Setting back binds each such global and class attribute to the object it held again where
    a run rebound it, removes a class attribute of Python data a run added (``type(self).calls
    += 1`` where ``calls`` is a base's binds a new ``calls`` on the subclass), and puts back the
    entries of each dict, list and set (:data:`_REFILLED`) among them that a run changed in place
    (a class-level cache a forward fills: on fakes it would hand the caller's next real call a
    fake tensor); what those entries hold is not copied (one level). Read once per module class
    (:meth:`add`), not per call: the globals' paths and class data names are those the structural
    reuse key reads (cached per class), the values read once per reading."""

    def __init__(self) -> None:
        self._kinds: Dict[type, None] = {}
        #: each class seen (a module's class or one of its bases): its Python data as found
        self._classes: Dict[type, Dict[str, Any]] = {}
        #: the size of each such class's own ``__dict__`` as found: a run that added a name changed it
        self._sizes: Dict[type, int] = {}
        #: (namespace, name, value) of each global (a plain dict namespace) as found
        self._globals: Dict[Tuple[int, str], Tuple[Dict[str, Any], str, Any]] = {}
        #: (container, a shallow copy) of each dict, list and set among them
        self._contents: Dict[int, Tuple[Any, Any]] = {}

    def add(self, modules: Iterable[torch.nn.Module]) -> None:
        """Read the state of the classes of ``modules`` not read yet (before their forwards run)."""
        new: List[type] = []
        for module in modules:
            kind = type(module)
            if kind not in self._kinds:
                self._kinds[kind] = None
                new.append(kind)
        for kind in new:
            for namespace, name, value in _code_data(kind):
                if isinstance(namespace, dict):  # a class's own (read-only) namespace: below, by class
                    self._globals.setdefault((id(namespace), name), (namespace, name, value))
                    self._keep_contents(value)
            for base in _own_bases(kind):
                if base not in self._classes:
                    own = vars(base)
                    found = {name: own[name] for name in _own_data_names(base) if name in own}
                    self._classes[base] = found
                    self._sizes[base] = len(own)
                    for value in found.values():
                        self._keep_contents(value)

    def _keep_contents(self, value: Any) -> None:
        if type(value) in _REFILLED and id(value) not in self._contents:
            self._contents[id(value)] = (value, value.copy())

    def set_back(self) -> None:
        """Bind, remove and refill as the class docstring says, where a run changed something."""
        for namespace, name, value in self._globals.values():
            if namespace.get(name, _NOT_BOUND) is not value:
                namespace[name] = value
        for kind, found in self._classes.items():
            own = vars(kind)
            for name, value in found.items():
                if own.get(name, _NOT_BOUND) is not value:
                    setattr(kind, name, value)
            if len(own) != self._sizes[kind]:
                added = [name for name, value in own.items() if name not in found and _class_datum(name, value)]
                for name in added:
                    delattr(kind, name)
        for container, entries in self._contents.values():
            _refill(container, entries)


def _refill(container: Any, entries: Any) -> None:
    """Put ``entries`` (a shallow copy made by :meth:`FoundState.add`) back into ``container``
    where its entries differ from them (by identity; a set by equality)."""
    if isinstance(container, dict):
        changed = len(container) != len(entries) or any(container.get(key, _NOT_BOUND) is not value
                                                         for key, value in entries.items())
    elif isinstance(container, list):
        changed = len(container) != len(entries) or any(now is not then for now, then in zip(container, entries))
    else:
        changed = container != entries
    if changed:
        if isinstance(container, list):
            container[:] = entries
        else:
            container.clear()
            container.update(entries)


@contextlib.contextmanager
def left_as_found(modules: Iterable[torch.nn.Module] = (), set_back: bool = True) -> Iterator[FoundState]:
    """Gives a :class:`FoundState` that has read the classes of ``modules`` (more with its
    :meth:`~FoundState.add`) and, with ``set_back``, sets it back on exit, also when the work
    raises: every reading runs the caller's forwards under it (the tracers' ``trace``, the
    decoding loop, estimate_memory, plan, the benchmark's real runs). ~0.1 ms per reading
    (docs/performance.md, asfound)."""
    found = FoundState()
    found.add(modules)
    try:
        yield found
    finally:
        if set_back:
            found.set_back()


@contextlib.contextmanager
def module_attributes_kept(modules: Iterable[torch.nn.Module]) -> Iterator[None]:
    """Each of ``modules``' own attributes (``vars()``: its parameter, buffer and child registries
    by identity, its flags, what its code set on it) bound again as found on exit, also when the
    work raises, and those the work added removed. The decoding loop calls the caller's model's own
    generation rules, which write on it as generate() lets them (Qwen2-VL's
    ``_prepare_position_ids_for_generation`` sets ``model.model.rope_deltas``); the forwards run
    on copies. One shallow copy of each module's ``__dict__``."""
    found = [(vars(module), dict(vars(module))) for module in modules]
    try:
        yield
    finally:
        for own, attributes in found:
            for name in [name for name in own if name not in attributes]:
                del own[name]
            for name, value in attributes.items():
                if own.get(name, _NOT_BOUND) is not value:
                    own[name] = value


def _holder(value: Any) -> Optional[Any]:
    """The own attributes of ``value`` that a path from a global goes on through: a Python
    module's, a class's or a plain object's (:func:`plain_object`); None for anything else."""
    if isinstance(value, (ModuleType, type)):
        return vars(value)
    if plain_object(value):
        return object_state(value)
    return None


def _steps(namespace: Any, path: Path) -> Iterator[Tuple[Any, str, Any]]:
    """``(namespace, name, value)`` of each step of ``path`` from ``namespace``, as far as each
    value holds attributes (:func:`_holder`); ``_NOT_BOUND`` for a name not bound there."""
    for name in path:
        value = namespace.get(name, _NOT_BOUND)
        yield namespace, name, value
        namespace = _holder(value)
        if namespace is None:
            return


def _data_along(namespace: Any, path: Path) -> Optional[Tuple[Any, str, Any]]:
    """The first step of ``path`` (:func:`_steps`) whose value is Python data (:data:`GLOBAL_DATA`)
    or a random generator (or the environment), or a user's object (:func:`keyed_object`) that the
    path ends at (handed on whole) or goes on from by a name its own attributes do not hold (a
    method, a property: what it computes comes from its state); or None. Read for every keyed call,
    so without a generator."""
    last = len(path) - 1
    for depth, name in enumerate(path):
        value = namespace.get(name, _NOT_BOUND)
        if isinstance(value, GLOBAL_DATA):
            return namespace, name, value
        kind = _kind_of_class(id(type(value)))
        if kind is None:
            kind = _KINDS.fill(type(value))
        if kind == _GENERATOR or value is os.environ:
            return namespace, name, value
        if depth == last:
            return (namespace, name, value) if kind == _USERS and plain_object(value) else None
        following = _holder(value)
        if following is None:
            return None
        if kind == _USERS and path[depth + 1] not in following and plain_object(value):
            return namespace, name, value
        namespace = following
    return None


def _may_hold_data(
    namespace: Any, path: Path, pending: List[Any], where: Optional[Dict[Tuple[Any, str], Tuple[Any, str]]] = None
) -> bool:
    """Whether ``path`` may lead to Python data when a call is keyed: it does now (or to a random
    generator, the environment, or a user's object handed on or asked by a method, :func:`_data_along`),
    or a step is not bound yet (a flag set later) other than a builtin (``len``) or a name the object's
    class defines (a method, a property: ``logger.warning_once``); the Python functions along it (not
    torch's or the standard library's, :func:`_library_function`) go to ``pending``, and so does a
    function's cache (``functools.lru_cache``) for the function it wraps; and where such a function is
    bound in a Python module's globals, that place, to ``where`` (:func:`code_bound`)."""
    owner: Any = None
    last = len(path) - 1
    for depth, (held_in, name, value) in enumerate(_steps(namespace, path)):
        if isinstance(value, FunctionType):
            if not _library_function(value):
                pending.append(value)  # a helper, of this Python module or another: its globals too
                if where is not None and _module_globals(held_in):
                    where[(id(held_in), name)] = (held_in, name)
        elif callable(value) and isinstance(getattr(value, "__wrapped__", None), FunctionType):
            pending.append(value)  # an lru_cache'd helper: what it wraps (``__wrapped__``, below)
        if isinstance(value, GLOBAL_DATA):
            return not isinstance(value, enum.Enum)  # an enum's member (a ``str`` enum's too) cannot be rebound
        if random_generator(value) or value is os.environ:  # the environment: a flag read per call
            return True
        if value is _NOT_BOUND:
            if not depth:
                return name not in _BUILTINS  # ``len``, ``ValueError``: Python's own
            defined = getattr(type(owner), name, _NOT_BOUND)
            return defined is _NOT_BOUND or isinstance(defined, GLOBAL_DATA) or keyed_object(owner)
        if depth == last and keyed_object(value):
            return True
        owner = value
    return False


class ClosureValues(tuple):
    """The values a function's closure variables hold now, in a fixed order (:func:`forward_globals`'
    value for them, one per function; an empty cell as :data:`EMPTY_CELL`): keyed by the identity of
    each value and, for what is not a scalar, by content, since a decorator's closure holds a dozen
    names (transformers' ``deprecate_kwarg``) that no code rebinds: ~1 us a closure."""


#: an empty closure cell's value in :class:`ClosureValues` (a variable not assigned yet)
EMPTY_CELL = ("empty cell",)
_CONTENTS = operator.attrgetter("cell_contents")


#: the name of a function's closure variables in its :class:`_Closure` namespace
_CELLS = "<closure>"


class _Closure:
    """A function's closure variables and its defaults as a namespace (``get``, as a Python module's
    ``__dict__`` is one): what its code reads besides its globals (``nonlocal n; n += 1`` in a helper,
    a flag of the function that made the class, a mutable default ``opts={}``). It holds the
    function by a weak reference and its variables by their place in ``__closure__``, which is
    fixed: a cell may hold the class whose entry of :data:`_NAMED_GLOBALS` this is (the
    ``__class__`` of ``super()``, a class made in a function and named by its own methods).
    A function gone (a helper a global held, rebound since) has nothing to read."""

    __slots__ = ("function", "places", "kept")

    def __init__(self, function: FunctionType) -> None:
        self.function = weakref.ref(function)
        self.places = {name: place for place, name in enumerate(function.__code__.co_freevars)}
        self.kept: Tuple[int, ...] = ()  # the places of the variables keyed

    def get(self, name: str, default: Any = None) -> Any:
        function = self.function()
        if function is None:
            return default
        if name == _CELLS:
            closure = function.__closure__ or ()
            cells = [closure[place] for place in self.kept]
            try:
                return ClosureValues(map(_CONTENTS, cells))
            except ValueError:  # an empty cell: a variable not assigned yet
                return ClosureValues([cell.cell_contents if _filled(cell) else EMPTY_CELL for cell in cells])
        if name == "__defaults__":
            return function.__defaults__
        if name == "__kwdefaults__":
            return function.__kwdefaults__
        place = self.places.get(name)
        if place is None or not function.__closure__:
            return default
        try:
            return function.__closure__[place].cell_contents
        except ValueError:
            return default


def _filled(cell: Any) -> bool:
    try:
        return cell.cell_contents is not _NOT_BOUND
    except ValueError:
        return False


def _closure_paths(function: FunctionType, pending: List[Any]) -> Tuple[_Closure, Tuple[Path, ...]]:
    """The paths of ``function``'s closure variables and mutable defaults that may hold data: the
    variables holding data, a generator or a user's object, or none yet, as one path (their values
    read together, :class:`ClosureValues`); a variable holding a Python function goes to ``pending``
    (followed as a global one is); classes and modules (the ``__class__`` cell of ``super()``) are
    code, left out."""
    closure = _Closure(function)
    paths: List[Path] = []
    kept: List[int] = []
    for name, place in closure.places.items():
        value = closure.get(name, _NOT_BOUND)
        if isinstance(value, FunctionType):
            if not _library_function(value):
                pending.append(value)
        elif value is _NOT_BOUND or isinstance(value, GLOBAL_DATA) or random_generator(value) or keyed_object(value):
            kept.append(place)
    if kept:
        closure.kept = tuple(kept)
        paths.append((_CELLS,))
    for name in ("__defaults__", "__kwdefaults__"):
        held = closure.get(name)
        values = held.values() if isinstance(held, dict) else held or ()
        if any(not isinstance(v, _IMMUTABLE) for v in values):
            paths.append((name,))
    return closure, tuple(paths)


#: default values a function's code cannot change in place
_IMMUTABLE = (int, float, bool, complex, str, bytes, type(None), torch.dtype, torch.device, enum.Enum, type,
              FunctionType)


def _named_globals(kind: type) -> NamedGlobals:
    found = _named_globals_of(id(kind))
    return found if found is not None else _read_code(kind)[0]


def _read_code(kind: type) -> Tuple[NamedGlobals, Tuple[Tuple[Tuple[Any, str], ...], Tuple[int, ...]]]:
    """``kind``'s paths (:func:`_globals_of`) and the places its functions are bound, read from the
    functions bound now and kept (each returned as read: another thread's :func:`forget_code`
    between the two stores cannot make a caller miss one)."""
    where: Dict[Tuple[Any, str], Tuple[Any, str]] = {}
    paths = _globals_of(kind, where)
    places = tuple(where.values())
    bound = (places, tuple([id(value) for value in _bound_now(kind, places)[2]]))
    _NAMED_GLOBALS.put(kind, paths)
    _CODE_WHERE.put(kind, bound)
    return paths, bound


#: the functions a module class's code runs as bound now (:func:`code_bound`): for each place, the
#: ``get`` of the namespace that binds it, the name, and what it holds (None: not there)
CodeBound = Tuple[Tuple[Callable[[str], Any], ...], Tuple[str, ...], Tuple[Any, ...]]


def code_bound(kind: type) -> CodeBound:
    """Where the functions that :func:`forward_globals` follows for ``kind`` are bound, and what each
    place holds now: its ``forward`` and the methods its code names, as the class resolves them
    (each class of its ``__mro__`` up to the one defining it: a subclass given its own ``forward``
    later shadows it), and the Python functions it names by a global of their module
    (``apply_rotary_pos_emb``). :func:`still_bound` of it is False once one is rebound
    (``Block.forward = other``, ``Block.helper = other``, ``othermod.helper = other``: code, which
    the globals' key leaves out). Where the functions bound now are not those the class's paths were
    read from (rebound since, in this process), its paths are read again first (:func:`forget_code`).
    The caller holds the result (the functions alive) while it compares; the process-wide caches
    hold no function (a class defined in a function, whose methods refer to it, is freed with its model)."""
    found = _code_where_of(id(kind))
    if found is None or _named_globals_of(id(kind)) is None:
        found = _read_code(kind)[1]
    bound = _bound_now(kind, found[0])
    if tuple([id(value) for value in bound[2]]) != found[1]:
        _CLASS_DATA.forget(kind)
        bound = _bound_now(kind, _read_code(kind)[1][0])
    return bound


def still_bound(bound: CodeBound) -> bool:
    """Whether every place of ``bound`` (:func:`code_bound`) holds what it held then (in C, ~50 ns a place)."""
    getters, names, values = bound
    return all(map(operator.is_, map(operator.call, getters, names), values))


def forget_code(kind: type) -> None:
    """Drops what was read of ``kind``'s code (its paths, the places its functions are bound, its class
    data's names): read again from the functions bound now on next use."""
    for cache in (_NAMED_GLOBALS, _CODE_WHERE, _CLASS_DATA):
        cache.forget(kind)


def _bound_now(kind: type, where: Tuple[Tuple[Any, str], ...]) -> CodeBound:
    mro = kind.__mro__
    getters = tuple([vars(mro[place]).get if type(place) is int else place.get for place, _ in where])
    names = tuple([name for _, name in where])
    return getters, names, tuple(map(operator.call, getters, names))


def _module_globals(namespace: Any) -> bool:
    """Whether ``namespace`` is a Python module's globals (held by :data:`_CODE_WHERE` as the module holds
    them: not a user's object's attributes)."""
    return type(namespace) is dict and _module_of(namespace, namespace.get("__name__")) is not None


def _module_of(namespace: Dict[str, Any], name: Any) -> Any:
    """The Python module named ``name`` in ``sys.modules`` whose ``__dict__`` is ``namespace``, or None."""
    module = sys.modules.get(name or "")
    return module if module is not None and getattr(module, "__dict__", None) is namespace else None


def _resolved(kind: type, name: str, where: Dict[Tuple[Any, str], Tuple[Any, str]]) -> None:
    """Into ``where``: the places along ``kind.__mro__`` that resolve ``name``, up to the class defining it."""
    for i, base in enumerate(kind.__mro__):
        where[(i, name)] = (i, name)
        if name in vars(base):
            return


def _globals_of(kind: type, where: Optional[Dict[Tuple[Any, str], Tuple[Any, str]]] = None) -> NamedGlobals:
    """:func:`forward_globals`' paths of one class, by namespace: from its ``forward``, following
    the methods of the class (and of its bases but ``nn.Module``) that the code read so far names
    as attributes, and the Python functions (not torch's or the standard library's) it names by a
    global or along a path; each function read once. A path is kept where it leads to Python data or to a name not bound
    yet (a flag set later); one that leads to a function, a class or a Python module only
    (``torch.nn.functional.relu``) is not looked up again for each call. ``where`` gets the places
    the functions followed are bound (:func:`code_bound`)."""
    where = {} if where is None else where
    methods: Dict[str, List[Any]] = {}
    for base in reversed(kind.__mro__):
        if base is not torch.nn.Module and base is not object:
            methods.update((name, functions) for name, value in vars(base).items() if (functions := _code_of(value)))
    by_namespace: Dict[int, Tuple[Any, Dict[Path, None]]] = {}
    pending: List[Any] = [getattr(kind, "forward", None)]
    _resolved(kind, "forward", where)
    read = set()
    while pending:
        function = pending.pop()
        if id(function) in read:
            continue
        read.add(id(function))
        code, namespace = getattr(function, "__code__", None), getattr(function, "__globals__", None)
        if isinstance(code, CodeType) and isinstance(namespace, dict):
            entry = by_namespace.get(id(namespace))
            if entry is None:
                entry = by_namespace[id(namespace)] = (_Globals(function, namespace), {})
            paths = entry[1]
            for path in _code_paths(code):
                if _may_hold_data(namespace, path, pending, where):
                    paths[path] = None
            if "globals" in code.co_names and "globals" not in namespace:
                paths[_EVERY_GLOBAL] = None
            for name in _all_names(code):  # ``self.helper(...)``, ``self.flag`` of a property
                followed = methods.get(name)
                if followed:
                    _resolved(kind, name, where)
                    pending += followed
            if isinstance(function, FunctionType) and (function.__closure__ or function.__defaults__
                                                       or function.__kwdefaults__):
                closure, own = _closure_paths(function, pending)
                if own:
                    by_namespace[id(closure)] = (closure, dict.fromkeys(own))
        wrapped = getattr(function, "__wrapped__", None)
        if wrapped is not None:
            pending.append(wrapped)
    return tuple((source, tuple(paths)) for source, paths in by_namespace.values() if paths)


# module class -> its paths: read from its code once per class per process
_NAMED_GLOBALS: PerObject[NamedGlobals] = PerObject(lambda kind: _read_code(kind)[0])
_named_globals_of = _NAMED_GLOBALS.lookup


class _Globals:
    """A function's globals namespace as what holds it, weakly (calling it gives the namespace, or
    None): the Python module of the function's ``__module__`` whose ``__dict__`` it is (a helper
    rebound later leaves the module's globals read, as before), and the function itself, read
    where there is no such module (a namespace ``exec`` made, ``torch.fx``'s generated code's) or
    once that module object is gone while its functions, and so its namespace, live on (taken out
    of ``sys.modules``, ``runpy``'s temporary module; before branch sweep21 its globals then left
    the key); held strongly only by a function without weak references."""

    __slots__ = ("module", "function")

    def __init__(self, function: Any, namespace: Dict[str, Any]) -> None:
        module = _module_of(namespace, getattr(function, "__module__", None))
        self.module: Any = None
        if module is not None:
            try:
                self.module = weakref.ref(module)
            except TypeError:
                pass
        try:
            self.function: Any = weakref.ref(function)
        except TypeError:
            self.function = functools.partial(_held, function)

    def __call__(self) -> Optional[Dict[str, Any]]:
        module = self.module() if self.module is not None else None
        if module is not None:
            return module.__dict__
        function = self.function()
        return None if function is None else function.__globals__


def _held(value: Any) -> Any:
    return value


def _code_of(value: Any) -> List[Any]:
    """The Python functions a class attribute runs when the code names it: a method, a static or
    class method's function, a property's getter, setter and deleter, a ``cached_property``'s."""
    if isinstance(value, FunctionType):
        return [value]
    if isinstance(value, (staticmethod, classmethod)):
        return [value.__func__]
    if isinstance(value, property):
        return [f for f in (value.fget, value.fset, value.fdel) if f is not None]
    if isinstance(value, functools.cached_property):
        return [value.func]
    return []


def _library_function(function: FunctionType) -> bool:
    """A function of torch's own or of Python's standard library, not followed. torch's globals
    are torch's (what ops read of the process is keyed apart, as settings); the standard library's
    are the interpreter's services, no flag a model's parent sets per layer: followed, diffusers'
    ``deprecate`` (``inspect.getouterframes``) reached ``linecache.cache``, every source line
    the process had shown keyed on each call of a block (docs/performance.md, sweeprest)."""
    package = (function.__module__ or "").partition(".")[0]
    return package == "torch" or package in sys.stdlib_module_names


def _all_names(code: CodeType) -> Iterator[str]:
    """Every name ``code`` and the code nested in it use (globals and attributes alike)."""
    yield from code.co_names
    for constant in code.co_consts:
        if isinstance(constant, CodeType):
            yield from _all_names(constant)


def _code_paths(code: CodeType) -> Tuple[Path, ...]:
    found = _CODE_PATHS.get(code)
    if found is None:
        found = _CODE_PATHS[code] = tuple(dict.fromkeys(_global_paths(code)))
    return found


def _global_paths(code: CodeType) -> Iterator[Path]:
    """The global names of ``code`` and of the code nested in it (comprehensions, lambdas, inner
    functions), each with the attributes read from it right after it is loaded
    (``othermod.CFG.flag``: ``("othermod", "CFG", "flag")``); builtins among them (``len``) are
    left out by :func:`_may_hold_data`."""
    path: List[str] = []
    for instruction in dis.get_instructions(code):
        name = instruction.opname
        if path and name in _ATTRIBUTE_OPS:
            path.append(instruction.argval)
            if name == "LOAD_ATTR" or name == "LOAD_METHOD":
                continue
        if path:
            yield tuple(path)
            path = []
        if name == "LOAD_GLOBAL":
            path = [instruction.argval]
        elif name in _GLOBAL_OPS:
            yield (instruction.argval,)
    if path:
        yield tuple(path)
    for constant in code.co_consts:
        if isinstance(constant, CodeType):
            yield from _global_paths(constant)


def _written(tensor: torch.Tensor, version: Optional[int], copy: torch.Tensor) -> bool:
    """Whether ``tensor`` was written since its ``version`` (None: an inference tensor, which keeps
    no version counter: whether its bytes differ from ``copy``'s, taken then; NaN equal to NaN)."""
    if version is None:
        return not torch.equal(_bytes_of(tensor), _bytes_of(copy))
    return int(tensor._version) != version


def _bytes_of(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.reshape(-1).contiguous().view(torch.uint8)


@contextlib.contextmanager
def preserved_inputs(tensors: Sequence[torch.Tensor]) -> Iterator[None]:
    """Give the caller's input tensors back exactly as found, even when the forward
    writes to them in place (``x.add_(1)``, ``x.relu_()``): their values, ``requires_grad``
    and ``.grad``. Each tensor with data is copied first; a copy is only written back to a
    tensor whose version counter moved (an inference tensor keeps none: to one whose values
    differ; only inside inference mode can a forward write one, and the copy goes back there)."""
    saved: List[Tuple[torch.Tensor, Optional[int], Tuple[Any, ...], torch.Tensor, bool, Any]] = []
    seen = set()
    for tensor in tensors:
        if id(tensor) in seen or is_dataless(tensor):
            continue
        seen.add(id(tensor))
        layout = _layout(tensor)
        version = None if tensor.is_inference() else int(tensor._version)  # an inference tensor keeps none
        saved.append((tensor, version, layout, tensor.detach().clone(), tensor.requires_grad, tensor.grad))
    try:
        yield
    finally:
        with torch.no_grad():
            for tensor, version, layout, copy, requires_grad, grad in saved:
                if _layout(tensor) != layout and tensor.layout == torch.strided:
                    shape, stride, offset = layout
                    tensor.as_strided_(shape, stride, offset)
                if _written(tensor, version, copy):
                    tensor.copy_(copy)
                if tensor.is_leaf:
                    tensor.requires_grad_(requires_grad)
                    tensor.grad = grad
