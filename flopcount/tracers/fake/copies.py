"""Fake copies of a model and its inputs, for counting without computing.

``tracer="auto"`` runs the forward on a copy of the module tree whose parameters,
buffers and tensor attributes are FakeTensors (shape, dtype, device; no storage), with
fake copies of the inputs, under a ``FakeTensorMode``. No arithmetic runs and no
activation memory is allocated; the caller's modules and tensors are never handed to the
forward, so they cannot change (the forward may set attributes, materialise lazy modules,
renormalise embeddings, update BatchNorm statistics: all of it happens to the copy).

A forward that needs a real value (``.item()``, ``.tolist()``, ``bool(t)`` on data,
``nonzero``, a custom op without a fake kernel) cannot run on fakes: the run raises
:class:`FakeRunError` with a one-sentence reason and the caller counts on a real run.

The memory estimate uses the same copies with ``storages=True`` (one fake storage per
real storage, of its full size, so tied weights and views share bytes as they do in the
model; meta mapped to cpu; dense tensors only), ``dtype`` (floating tensors cast) and
``retie=True`` (ties the model declares but lost restored on the copy, see ``tied.py``).
"""

from __future__ import annotations

import collections
import contextlib
import copy
import logging
import threading
from array import array
from bisect import bisect_left
from collections import OrderedDict
from functools import cache
from itertools import compress, repeat
from operator import is_not
from types import FunctionType, MappingProxyType
from typing import Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple

import torch
from torch import nn
from torch.overrides import TorchFunctionMode, handle_torch_function, has_torch_function

from flopcount.core.diagnostics import module_place
from flopcount.core.hooks import is_hook_name
from flopcount.core.inputs import is_uninitialized
from flopcount.core.tied import restore_ties
from flopcount.errors import TraceError, UsageError
from flopcount.tracers._containers import IMMUTABLE_TYPES, TreeCopier, deep_copied, fresh_uninitialized
from flopcount.tracers.fake.making import FakeMaker

__all__ = [
    "FakeCopy",
    "FakeRunError",
    "KeyTable",
    "LazyCopy",
    "LazyModules",
    "LazyTensors",
    "Pending",
    "SharedHooks",
    "UnreadModules",
    "UnreadTensors",
    "fake_copies",
    "give_back",
    "has_lazy_parameters",
    "quiet_fake_logs",
    "raw_children",
    "reason_for",
    "reuse_key",
    "shared_tensor_copy",
    "tensor_key",
]


class FakeRunError(TraceError):
    """The forward could not run on fake copies; ``reason`` says why in one sentence."""

    def __init__(self, reason: str, module_path: str = ""):
        super().__init__(reason, module_path=module_path)
        self.reason = reason


class FakeCopy:
    """A fake copy of a model and of the tensors it is called with, sharing one mode;
    ``call`` is the copied call arguments (positional, keyword); ``twins`` maps
    ``id(real tensor)`` to its fake; ``notes`` say what was changed on the copy (ties restored);
    ``copies`` maps ``id(original)`` to its copy for every object copied (modules included; an
    empty set a module holds, shared, once another object may meet it: ``_TreeCopier._memo_sets``);
    ``metas`` maps ``id(fake)`` to ``(fake, (shape, stride, offset, dtype, device, requires_grad,
    type))`` for the fakes made the fast way, read from the real tensor as it was faked (structural
    reuse keys parameters by that tuple: one read of a fake's metadata costs microseconds).
    ``names`` (a copy lazy in depth, :class:`LazyCopy`): each module copied so far -> its canonical
    name, filled as modules are copied; ``lazy``: that :class:`LazyCopy` (None: copied whole)."""

    __slots__ = ("mode", "model", "tensors", "call", "twins", "notes", "copies", "metas", "names", "lazy", "maker")

    def __init__(
        self,
        mode: Any,
        model: nn.Module,
        tensors: List[torch.Tensor],
        call: Any,
        twins: Optional[Dict[int, torch.Tensor]] = None,
        notes: Optional[List[str]] = None,
        copies: Optional[Dict[int, Any]] = None,
        metas: Optional[Dict[int, Tuple[torch.Tensor, Tuple[Any, ...]]]] = None,
        names: Optional[Dict[nn.Module, str]] = None,
        lazy: Optional[LazyCopy] = None,
    ):
        self.mode = mode
        self.model = model
        self.tensors = tensors
        self.call = call
        self.twins: Dict[int, torch.Tensor] = {} if twins is None else twins
        self.notes: List[str] = [] if notes is None else notes
        self.copies: Dict[int, Any] = {} if copies is None else copies
        self.metas: Dict[int, Tuple[torch.Tensor, Tuple[Any, ...]]] = {} if metas is None else metas
        self.names = names
        self.lazy = lazy
        #: the :class:`FakeMaker` of ``mode`` the copy's fakes were made with (the shape cache makes
        #: the run's with it too); None once :func:`give_back` took it
        self.maker: Optional[FakeMaker] = None


# -- the modes counts hand on to each other ------------------------------------------------
# A FakeTensorMode's constructor records the Python stack (``traceback.extract_stack``: ~20 us
# plus ~2 us a frame) and a FakeMaker checks its first fake against the constructor's (~50 us):
# a small model's count is mostly such fixed costs. A count whose fakes do not outlive it gives
# its mode and maker back (:func:`give_back`) for the next count to take, when the mode is as a
# fresh one is (nothing entered, nothing converted from a real tensor, its plain settings those
# of a new mode); any other mode is dropped. Each pair is held by one count at a time (two
# threads counting at once take two), under a lock; what the pool holds is a few idle objects.
_POOL_LOCK = threading.Lock()
_IDLE: List[Tuple[Any, FakeMaker]] = []
_POOL_SIZE = 4


def _take_mode() -> Tuple[Any, FakeMaker]:
    """An idle mode and its maker given back by an earlier count, or a new pair."""
    with _POOL_LOCK:
        if _IDLE:
            return _IDLE.pop()
    fake_tensor, fake_mode = _fake_types()
    # Real tensors the forward reaches some other way (a global, a closure) are converted on
    # use; they are never written to.
    mode = fake_mode(allow_non_fake_inputs=True)
    return mode, FakeMaker(mode, fake_tensor)


def give_back(copied: FakeCopy) -> None:
    """``copied``'s mode and maker, for the next count to take, when the run that used them has
    ended and none of its fakes is handed on (the caller's promise) and the mode is as made
    (:func:`_as_made`); else nothing. Once per copy."""
    maker, copied.maker = copied.maker, None
    mode = copied.mode
    if maker is None or not _as_made(mode):
        return
    with _POOL_LOCK:
        if len(_IDLE) < _POOL_SIZE and all(held is not mode for held, _ in _IDLE):
            _IDLE.append((mode, maker))


_PLAIN = (bool, int, type(None))


def _plain_state(mode: Any) -> Dict[str, Any]:
    """A mode's settings and flags (its bool, int and None attributes)."""
    return {name: value for name, value in vars(mode).items() if type(value) in _PLAIN}


@cache
def _fresh_state() -> Dict[str, Any]:
    """:func:`_plain_state` of a mode as ``_take_mode`` makes it."""
    return _plain_state(_fake_types()[1](allow_non_fake_inputs=True))


def _as_made(mode: Any) -> bool:
    """Whether ``mode`` holds nothing of the run that used it: not entered (an empty enter stack,
    no saved dispatch flags), not inside a kernel, no real tensor or storage converted (empty
    memos: a converted global would be answered from the memo next time, stale if it changed in
    between), its settings and counters those of a fresh mode. An attribute torch renamed or
    dropped makes it False: every count then makes its own mode, as before."""
    try:
        converter = mode.fake_tensor_converter
        meta = converter.meta_converter
        held = [mode.enter_stack, converter.tensor_memo, converter.constant_storage_mapping, meta.storage_memo,
                meta.tensor_memo, meta.describer.lookup_tensor, meta.describer.lookup_storage]
        held += [value for value in vars(mode).values() if isinstance(value, collections.deque)]
        return all(len(item) == 0 for item in held) and _plain_state(mode) == _fresh_state()
    except Exception:
        return False


@cache
def _fake_types() -> Tuple[Any, Any]:
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode  # slow to import: on first use

    return FakeTensor, FakeTensorMode


def has_lazy_parameters(model: nn.Module) -> bool:
    """True when a lazy module (``nn.LazyLinear``...) has not been materialised yet."""
    return any(is_uninitialized(t) for t in _own_tensors(model))


def _named_tensors(
    model: nn.Module, modules: Optional[Sequence[Tuple[str, nn.Module]]] = None, attributes_only: bool = False
) -> Iterator[Tuple[str, torch.Tensor]]:
    """Every tensor the modules own (parameters, buffers, tensor attributes; only the last
    with ``attributes_only``), with a label for errors."""
    for mod_name, module in model.named_modules() if modules is None else modules:
        where = f"of module '{mod_name}'"
        if not attributes_only:
            for name, tensor in module._parameters.items():
                if tensor is not None:
                    yield f"parameter {name} {where}", tensor
            for name, tensor in module._buffers.items():
                if tensor is not None:
                    yield f"buffer {name} {where}", tensor
        for name, value in vars(module).items():
            if isinstance(value, torch.Tensor):
                yield f"tensor attribute {name} {where}", value


def _own_tensors(model: nn.Module) -> List[torch.Tensor]:
    tensors: List[torch.Tensor] = []
    for module in model.modules():
        tensors.extend(t for t in module._parameters.values() if t is not None)
        tensors.extend(t for t in module._buffers.values() if t is not None)
    return tensors


def _attribute_tensors(model: nn.Module) -> List[torch.Tensor]:
    """Tensors a module keeps as plain attributes (rotary caches, masks, constants)."""
    found: List[torch.Tensor] = []
    for module in model.modules():
        found.extend(v for v in vars(module).values() if isinstance(v, torch.Tensor))
    return found


_CPU = torch.device("cpu")
_STRIDED = torch.strided


def _stood_for(tensor: torch.Tensor) -> torch.device:
    # A meta tensor stands for a CPU one (as with storages=True): kernels then pick the
    # layouts they pick for real weights (CPU SDPA's output strides, for one), so a meta
    # copy of a model counts exactly what the model counts.
    kind = type(tensor)
    if kind is torch.Tensor or kind is nn.Parameter:
        # ``is_meta``, not ``device.type == "meta"``: the latter makes a string per read (~0.6 us, a
        # third of a parameter's key read, issue #32); a subclass (a FakeTensor: meta underneath)
        # answers by its own ``device``
        return _CPU if tensor.is_meta else tensor.device
    return _CPU if tensor.device.type == "meta" else tensor.device


def tensor_key(tensor: torch.Tensor) -> Tuple[Any, ...]:
    """What structural reuse keys a module's tensor by (``tracers/_reuse.py``): shape, stride,
    offset, dtype, device, requires_grad, type."""
    return (
        tuple(tensor.shape), tensor.stride(), tensor.storage_offset(), tensor.dtype, tensor.device,
        tensor.requires_grad, type(tensor),
    )


def reuse_key(tensor: torch.Tensor, fake_type: type) -> Tuple[Any, ...]:
    """:func:`tensor_key` of the fake made the fast way for the real ``tensor`` (offset 0, meta
    standing for cpu, a gradient only for floating and complex dtypes), read from the real
    tensor: one read of a fake's metadata costs microseconds."""
    grad = tensor.requires_grad and (tensor.is_floating_point() or tensor.is_complex())
    return (tuple(tensor.shape), tensor.stride(), 0, tensor.dtype, _stood_for(tensor), grad, fake_type)


class Pending:
    """A parameter or buffer of a fake copy's module whose fake is made on first use
    (:class:`LazyTensors`); ``key`` is the fake's :func:`reuse_key`, read from ``real``."""

    __slots__ = ("real", "key")

    def __init__(self, real: torch.Tensor, key: Tuple[Any, ...]):
        self.real = real
        self.key = key


class LazyTensors(dict):
    """A fake copy's ``_parameters`` / ``_buffers`` dictionary whose tensors are faked on first
    read (issue #32): structural reuse books most blocks of a deep model from an earlier one
    without running them, and their parameters are then never faked. Every way of reading a
    value (``[]``, ``get``, ``values``, ``items``, iteration-based copies, ``pop``) gives the
    fake, one per real tensor (ties kept); the raw value (``dict.values(d)``) is a
    :class:`Pending` until then, and stays one, so the identity of what a module holds does not
    change when it is read. Only structural reuse reads raw values (keys, fingerprints)."""

    __slots__ = ("faker", "lazy", "source")

    faker: _Faker
    lazy: LazyCopy
    source: Optional[Dict[str, Any]]

    def _fake(self, value: Any) -> Any:
        if type(value) is not Pending:
            return value
        faker = self.faker
        found = faker.memo.get(id(value.real))
        if found is not None:
            return found
        # made inside the run: below the recorder's and the fake mode's dispatch (not an op of the
        # model), in the inference mode the copy was made in (an inference tensor or not, as the others)
        same_mode = torch.is_inference_mode_enabled() == faker.inference
        with torch._C._DisableTorchDispatch():
            if same_mode:
                made = faker.fake_pending(value)
            else:
                with torch.inference_mode(faker.inference):
                    made = faker.fake_pending(value)
        if made is not None:
            return made
        # the fast constructor failed (a changed torch): torch's own route, FakeTensorMode.from_tensor,
        # which refuses to run below the dispatch (it converts under its own guard)
        if same_mode:
            return faker.fake(value.real)
        with torch.inference_mode(faker.inference):
            return faker.fake(value.real)

    def __getitem__(self, key: Any) -> Any:
        return self._fake(dict.__getitem__(self, key))

    def get(self, key: Any, default: Any = None) -> Any:
        return self._fake(dict.get(self, key, default))

    def values(self) -> Any:
        return [self._fake(v) for v in dict.values(self)]

    def items(self) -> Any:
        return [(k, self._fake(v)) for k, v in dict.items(self)]

    def __iter__(self) -> Iterator[Any]:
        # overridden so that dict(d), {**d} and update(d) read values through __getitem__
        return dict.__iter__(self)

    def pop(self, key: Any, *default: Any) -> Any:
        return self._fake(dict.pop(self, key, *default))

    def popitem(self) -> Any:
        key, value = dict.popitem(self)
        return key, self._fake(value)

    def setdefault(self, key: Any, default: Any = None) -> Any:
        return self._fake(dict.setdefault(self, key, default))

    def copy(self) -> Dict[Any, Any]:
        return dict(self.items())

    def __reduce__(self) -> Any:  # copy.copy / deepcopy / pickle: a plain dict of the fakes
        return (dict, (self.items(),))


def outside_modes(read: Callable[..., Any], tensors: Sequence[Any], *args: Any) -> Any:
    """``read(*args)``, the run's torch-function modes off the stack while it runs, so that the reads
    of ``tensors``' metadata (``.shape``, ``.stride()``, ``.dtype``...) inside it go through none of
    them. Inside the run every such read is a pass through each mode (~7 us; and torch looks up the
    mode's handler by a name string it makes anew each time, which CPython 3.11's type attribute
    cache then holds until its slot is reused: ~60 B a pass that a count leaves allocated, issue #32).
    Routed as one overridable call on ``tensors`` (``torch.overrides.handle_torch_function``,
    public): a mode runs a function it does not know with itself off the stack, so the reads below it
    go through no mode. A mode or subclass that refuses the call: ``read`` runs through the modes.
    A ``read`` that raises is not run again (the replay's ``_apply`` and ``_make`` write and make):
    its error is raised."""
    if not has_torch_function(tensors):
        return read(*args)
    started: List[bool] = []

    def once(*inner: Any) -> Any:
        started.append(True)
        return read(*inner)

    try:
        return handle_torch_function(outside_modes, tensors, once, tensors, *args)
    except Exception:
        if started:  # the read's own failure, not the routing's refusal
            raise
    return read(*args)


def _read_keys(faker: _Faker, tensors: List[Any], keys: Optional[Dict[Any, Any]] = None) -> List[Optional[Tuple[Any, ...]]]:
    """Each real tensor's :func:`reuse_key` where it can be faked the fast way, else None, read in one
    call (:func:`outside_modes`: a lazy copy reads them inside the run; a ResNet-50 count was 25%
    slower when its copies' keys were read through the modes). ``keys``: each key is the one equal
    key held there (added if new), as it is read: a duplicate is freed at once (a deep model's equal
    keys, read up front, were otherwise all alive at once, then left in CPython's free lists)."""
    return outside_modes(_keys_now, tensors, faker, tensors, keys)


def _keys_now(faker: _Faker, tensors: List[Any], keys: Optional[Dict[Any, Any]]) -> List[Optional[Tuple[Any, ...]]]:
    """:func:`_read_keys`' reads, through whatever modes are active."""
    key_of = faker.deferred_key
    if keys is None:
        return [key_of(t) for t in tensors]
    found: List[Optional[Tuple[Any, ...]]] = []
    for t in tensors:
        key = key_of(t)
        found.append(None if key is None else keys.setdefault(key, key))
    return found


def _held_tensors(modules: Iterable[nn.Module]) -> List[Any]:
    """The parameters and buffers ``modules`` (the caller's) hold in plain dictionaries themselves
    (not their children's), read through ``vars`` (no module ``__getattr__``) for the lazy copy's
    key reads; :func:`_own_tensors` walks a whole model."""
    tensors: List[Any] = []
    add = tensors.extend
    for module in modules:  # unrolled, empty dictionaries passed at once: ~2x faster (read every count)
        state = vars(module)
        held = state.get("_parameters")
        if held and type(held) is dict:
            add([t for t in dict.values(held) if t is not None])
        held = state.get("_buffers")
        if held and type(held) is dict:
            add([t for t in dict.values(held) if t is not None])
    return tensors


class KeyTable:
    """``id(caller's tensor)`` -> its :func:`reuse_key` (None: not fakeable the fast way), read once
    before the run (:meth:`LazyCopy.read_all`): the ids in a sorted array of machine words, the keys
    in a list beside it, found by bisection (~0.3 us). 16 B a tensor, where a dictionary held ~68 B
    (an ``int``, an entry, its index; issue #32). An entry no longer needed (a call booked from an
    earlier one: its subtree is never copied; a module copied: its :class:`Pending` holds the key) is
    marked taken (:meth:`take`), and the table made again without them when three quarters of it
    were taken (at a quarter, the remakes cost a 70B count 0.15 ms): a deep model's forward ends,
    where a KV cache's fakes make the count's peak, with a few entries, not one per tensor. An id
    stays valid: the caller's modules hold their tensors through the count."""

    __slots__ = ("ids", "keys", "taken")

    def __init__(self, tensors: Sequence[Any] = (), keys: Sequence[Any] = ()):
        ids = list(map(id, tensors))
        order = sorted(range(len(ids)), key=ids.__getitem__)
        if len(set(ids)) < len(ids):  # a tensor two modules hold (tied) is read twice: kept once
            order = [i for n, i in enumerate(order) if n == 0 or ids[i] != ids[order[n - 1]]]
        self.ids = array("Q", [ids[i] for i in order])
        self.keys = [keys[i] for i in order]
        self.taken = 0

    def find(self, ident: int) -> int:
        """The position of the key read for the tensor whose id is ``ident``; -1: not read, or taken."""
        ids = self.ids
        i = bisect_left(ids, ident)
        return i if i < len(ids) and ids[i] == ident and self.keys[i] is not _TAKEN else -1

    def get(self, ident: int, default: Any = None) -> Any:
        """The key read for the tensor whose id is ``ident``, or ``default`` (not read, or taken)."""
        i = self.find(ident)
        return default if i < 0 else self.keys[i]

    def as_dict(self) -> Dict[int, Any]:
        """The entries not taken, as a dictionary (~68 B an entry: for a moment, not to be kept)."""
        return {i: k for i, k in zip(self.ids, self.keys) if k is not _TAKEN}

    def take(self, positions: Iterable[int], remake: bool = True) -> None:
        """Drops the entries at ``positions`` (found by :meth:`find` since the table was last made:
        with ``remake``, it is made again without them when three quarters of it were taken)."""
        keys = self.keys
        for i in positions:
            if keys[i] is not _TAKEN:
                keys[i] = _TAKEN
                self.taken += 1
        if remake and self.taken * 4 > len(keys) * 3:
            # made again from iterators: no list of positions (an ``int`` each) beside the two tables
            ids = self.ids
            self.ids = array("Q", compress(ids, map(is_not, keys, repeat(_TAKEN))))
            self.keys = list(compress(keys, map(is_not, keys, repeat(_TAKEN))))
            self.taken = 0

    def __len__(self) -> int:
        return len(self.ids) - self.taken


_TAKEN: Any = object()
_NOTHING_READ = KeyTable()


_NO_FAKES: Mapping[int, Any] = MappingProxyType({})


class LazyCopy:
    """A fake copy made lazily in depth (issue #32, a deep model's memory): a copied module's
    children are copied when first reached (:class:`LazyModules`), so the children of a block
    that structural reuse books from an earlier one are never copied. ``originals``: every
    module of the caller's tree -> its canonical name; ``names``: every module copied so far ->
    that name (the module stack's names, filled as copies are made); ``adopt(copy, original)``,
    when set, is told of each module copied from then on (structural reuse wraps it).
    :meth:`release` ends it when the run ends (the copier and the copies refer to each other)."""

    __slots__ = ("copier", "originals", "names", "adopt", "root", "unread_kinds")

    def __init__(self, copier: _TreeCopier, originals: Mapping[nn.Module, str], root: nn.Module):
        self.copier: Optional[_TreeCopier] = copier
        self.originals = originals
        self.names: Dict[nn.Module, str] = {}
        self.adopt: Optional[Callable[[nn.Module, nn.Module], None]] = None
        self.root = root
        #: the classes (exactly) whose copies, their forward their class's, hold :class:`UnreadTensors`
        self.unread_kinds: frozenset = frozenset()

    def read_all(self) -> None:
        """Reads the key of every parameter and buffer of the caller's modules (``originals``) now,
        before the run's modes are entered: one plain read per tensor (~1 us), where a read inside
        the run passes each torch-function mode (issue #32: ResNet-50's keys and copies read their
        tensors in 25 calls through the modes, ~7% of its count). Called once, before anything is
        copied (``fake_copies``): the copier's :class:`KeyTable`."""
        copier = self.copier
        if copier is not None:
            copier.read_ahead_of(_held_tensors(self.originals))

    def copy_of(self, original: nn.Module) -> nn.Module:
        """The copy of ``original`` (a module of the caller's tree), made now if not made yet."""
        copier = self.copier
        if copier is None:
            raise RuntimeError("a module of a fake copy was reached after its run ended")
        found = copier.memo.get(id(original))
        if found is not None:
            return found
        try:  # copied inside the run (:meth:`_TreeCopier.inside_run`, as LazyTensors does)
            return copier.inside_run(copier.module, original)
        except UsageError:
            raise
        except Exception as exc:
            # said as the eager copy says it (a torch.jit.script'ed block: before, reuse on said "the
            # forward failed on fake tensors in the root module", off "could not be copied")
            raise FakeRunError(_copy_failure(exc, original)) from exc

    def copies_of(self, originals: Sequence[nn.Module]) -> List[nn.Module]:
        """:meth:`copy_of` each of ``originals`` (a subtree a first call runs)."""
        return [self.copy_of(module) for module in originals]

    def live(self, module: Any) -> Any:
        """``module``'s copy if it is an original copied already, else ``module`` itself (a copy,
        or an original not copied yet)."""
        copier = self.copier
        if copier is None:
            return module
        found = copier.memo.get(id(module))
        return module if found is None else found

    def copied(self, module: Any) -> Any:
        """The copy already made of ``module`` (an original), or None."""
        copier = self.copier
        return None if copier is None else copier.memo.get(id(module))

    def tensor_keys(self, tensors: Sequence[Any], found: Optional[List[int]] = None) -> List[Any]:
        """What structural reuse keys the copies of a caller's parameters or buffers by, before
        the module is copied: each one's fake (made already), the key of the :class:`Pending` its
        copy will hold (``reuse_key``), or None (it will be faked another way: the module must
        be copied). ``found``: the positions of the keys read up front (:meth:`read_all`) are added
        there (:meth:`forget` them when the call is booked; until then no entry is moved)."""
        copier = self.copier
        return [None] * len(tensors) if copier is None else copier.raw_keys(tensors, found)

    def identities(self, tensors: Sequence[Any]) -> List[int]:
        """One number per tensor of the copy among ``tensors`` (the raw values of a module's parameter
        and buffer dictionaries, of a copy or of an original not copied yet): a caller's tensor, its
        :class:`Pending` and its fake give the same one, so that ties between parameters (``b.weight =
        a.weight``, before the count or in the forward) are seen wherever the modules holding them are."""
        copier = self.copier
        if copier is None:
            return [id(t) for t in tensors]
        fakes = copier.faker.memo
        found: List[int] = []
        for tensor in tensors:
            real = tensor.real if type(tensor) is Pending else tensor
            fake = fakes.get(id(real))
            found.append(id(real) if fake is None else id(fake))
        return found

    def fakes_made(self) -> Mapping[int, Any]:
        """id(a caller's tensor) -> its fake, for the fakes made so far (none once released): a
        :class:`Pending`'s fake is ``fakes_made().get(id(pending.real))``."""
        copier = self.copier
        return _NO_FAKES if copier is None else copier.faker.memo

    def forget(self, found: List[int]) -> None:
        """The keys :meth:`tensor_keys` found for a call, let go: it was booked from an earlier one
        (nothing of its subtree is copied for it)."""
        copier = self.copier
        if copier is not None and found:
            copier.read_ahead.take(found)

    def keys_read(self) -> KeyTable:
        """The keys :meth:`read_all` read (none once released)."""
        copier = self.copier
        return _NOTHING_READ if copier is None else copier.read_ahead

    def release(self) -> None:
        """No more copies: drops what refers back to the copies, so the copy and the count's
        records are freed when the count lets them go, without waiting for the garbage collector."""
        if self.copier is not None:
            self.copier.read_ahead = _NOTHING_READ
        self.copier = None
        self.adopt = None
        self.names = {}


class LazyModules(dict):
    """A lazy fake copy's ``_modules`` dictionary (:class:`LazyCopy`): its raw values are the
    caller's child modules until read; every way of reading one (``[]``, ``get``, ``values``,
    ``items``, iteration-based copies, ``pop``: ``self.layers[3]``, ``getattr``, iterating a
    ``ModuleList``, ``named_modules()``, ``state_dict()``) gives the child's copy, made on first
    read and then held here. A value the forward assigns is kept as given. Only structural reuse
    reads raw values (:func:`raw_children`), to key a subtree from the caller's modules. Made as
    an :class:`UnreadModules` (``source``: None once its entries are its own)."""

    __slots__ = ("lazy", "source")

    lazy: LazyCopy
    source: Optional[Dict[str, Any]]

    def _live(self, key: Any, value: Any) -> Any:
        lazy = self.lazy
        if value is None or value not in lazy.originals:
            return value
        copier = lazy.copier
        made = copier.memo.get(id(value)) if copier is not None else None
        if made is None:
            made = lazy.copy_of(value)
        dict.__setitem__(self, key, made)
        return made

    def _made(self, value: Any) -> Any:
        return self.lazy.copy_of(value) if value is not None and value in self.lazy.originals else value

    def __getitem__(self, key: Any) -> Any:
        return self._live(key, dict.__getitem__(self, key))

    def get(self, key: Any, default: Any = None) -> Any:
        return self._live(key, dict.__getitem__(self, key)) if dict.__contains__(self, key) else default

    def values(self) -> Any:
        return [self._live(k, v) for k, v in list(dict.items(self))]

    def items(self) -> Any:
        return [(k, self._live(k, v)) for k, v in list(dict.items(self))]

    def __iter__(self) -> Iterator[Any]:
        # overridden so that dict(d), {**d} and update(d) read values through __getitem__
        return dict.__iter__(self)

    def pop(self, key: Any, *default: Any) -> Any:
        return self._made(dict.pop(self, key, *default))

    def popitem(self) -> Any:
        key, value = dict.popitem(self)
        return key, self._made(value)

    def setdefault(self, key: Any, default: Any = None) -> Any:
        if dict.__contains__(self, key):
            return self[key]
        return dict.setdefault(self, key, default)

    def copy(self) -> Dict[Any, Any]:
        return dict(self.items())

    def __reduce__(self) -> Any:  # copy.copy / deepcopy / pickle: a plain dict of the copies
        return (dict, (self.items(),))


class UnreadModules(LazyModules):
    """A :class:`LazyModules` not used yet: it holds no entry itself (an empty dictionary has no
    table: ~0.1 KiB less per copied module, issue #32; a deep model's forward reaches every layer,
    and structural reuse books most of them without reading their children). Its entries are the
    caller's module's own dictionary's (``source``, which the count does not change), taken in on
    the first use of any kind (every method of ``dict`` that reads or writes the entries is one,
    :data:`_READS_ENTRIES`), and it is from then on a :class:`LazyModules` (its class set to that
    one), as if made so. Structural reuse reads the raw children without taking them in
    (:func:`raw_children`)."""

    __slots__ = ()

    def _take_in(self) -> LazyModules:
        source, self.source = self.source, None
        if source is not None:
            dict.update(self, source)  # the caller's dictionary's table, cloned (as ``LazyModules(source)``)
        self.__class__ = LazyModules  # type: ignore[assignment]  # from now on one as if made so
        return self


#: the methods of ``dict`` that read or write its entries (its size, keys or values), which
#: :class:`UnreadModules` answers after taking the entries in; ``test_reuse_lazy_copy`` checks that
#: every other method of ``dict`` is one that does not
_READS_ENTRIES = (
    "__contains__", "__delitem__", "__eq__", "__getitem__", "__init__", "__ior__", "__iter__", "__len__", "__ne__",
    "__or__", "__reduce__", "__repr__", "__reversed__", "__ror__", "__setitem__", "__sizeof__", "clear", "copy", "get",
    "items", "keys", "pop", "popitem", "setdefault", "update", "values",
)


def _taking_in_first(name: str, taken_in: type = LazyModules) -> Callable[..., Any]:
    method = getattr(taken_in, name)

    def taking_in_first(self: Any, *args: Any, **kwargs: Any) -> Any:
        return method(self._take_in(), *args, **kwargs)

    taking_in_first.__name__ = taking_in_first.__qualname__ = name
    return taking_in_first


for _name in _READS_ENTRIES:
    setattr(UnreadModules, _name, _taking_in_first(_name))


class UnreadTensors(LazyTensors):
    """A :class:`LazyTensors` not used yet (issue #32, resnet15): the parameter or buffer dictionary
    of the copy of a module whose call may be answered from an earlier call of its key
    (``_leaf_calls``: torch's own convolutions and batch norms), which then never reads it. It holds
    no entry itself; its entries are those the caller's module's own dictionary (``source``) gives
    :meth:`_TreeCopier._lazy`, put in on the first use of any kind (:data:`_READS_ENTRIES`, as
    :class:`UnreadModules`), below the run's dispatch as a copy is made, and it is from then on a
    :class:`LazyTensors` (its class set to that one), as if made so. Read without taking the entries
    in: :meth:`unread_keys` (the leaf call's key); every other raw reader takes them in
    (:func:`raw_tensors`)."""

    __slots__ = ()

    def _take_in(self) -> LazyTensors:
        source, self.source = self.source, None
        if source is not None:
            copier = self.lazy.copier
            if copier is None:  # the run has ended: each tensor's fake, as a read would have made it
                faker = self.faker
                for name, tensor in source.items():
                    dict.__setitem__(self, name, None if tensor is None else faker.fake(tensor))
            else:
                try:
                    copier.inside_run(copier.lazy_into, self, source)  # as the copy is made (LazyCopy.copy_of)
                except UsageError:
                    raise
                except Exception as exc:
                    raise FakeRunError(f"the model could not be copied with fake tensors ({_one_line(exc)})") from exc
        self.__class__ = LazyTensors  # type: ignore[assignment]  # from now on one as if made so
        return self

    def unread_keys(self) -> Optional[List[Tuple[str, Any, Any]]]:
        """(name, the key its copy's fake will have, the caller's tensor) for each entry (a None
        entry: (name, None, None)), read without taking the entries in; None where one cannot be
        said so (its fake made already, which the forward may have changed since; one faked
        another way; the run ended): taken in, a read there would see a fake, not a :class:`Pending`."""
        source, lazy = self.source, self.lazy
        copier = lazy.copier
        if source is None or copier is None:
            return None
        # as :meth:`_TreeCopier.raw_keys` finds them, the common cases inline (a key read ahead, a
        # tensor's one Pending made for another module): ~110 such dictionaries a ResNet-50 count
        made, pending, ahead = copier.faker.memo, copier._pending, copier.read_ahead
        ids, keys = ahead.ids, ahead.keys
        size = len(ids)
        found: List[Tuple[str, Any, Any]] = []
        for name, tensor in source.items():
            if tensor is None:
                found.append((name, None, None))
                continue
            ident = id(tensor)
            if ident in made:
                return None  # faked already: the forward may have changed its fake since
            waiting = pending.get(ident)
            if waiting is not None:
                key = waiting.key
            else:
                i = bisect_left(ids, ident)
                key = keys[i] if i < size and ids[i] == ident else _TAKEN
                if key is _TAKEN:
                    key = lazy.tensor_keys([tensor])[0]
            if type(key) is not tuple:
                return None  # faked another way (a fake, or None: not the fast way)
            found.append((name, key, tensor))
        return found


for _name in _READS_ENTRIES:
    setattr(UnreadTensors, _name, _taking_in_first(_name, LazyTensors))


def raw_tensors(tensors: Any) -> Any:
    """A parameter or buffer dictionary whose raw values (``dict.values``) are what the copy holds:
    ``tensors`` itself, an :class:`UnreadTensors` after taking its entries in."""
    if type(tensors) is UnreadTensors:
        tensors._take_in()
    return tensors


def raw_children(children: Dict[str, Any]) -> Dict[str, Any]:
    """The dictionary holding a module's children as they are (``dict.values`` of it reads them raw):
    ``children`` itself, or the caller's dictionary an :class:`UnreadModules` has not taken in yet."""
    if type(children) is UnreadModules:
        source = children.source
        if source is not None:
            return source
    return children


class _Faker:
    """Makes one fake per real tensor (the same fake for the same tensor: ties survive).
    ``storages``: one fake storage per real storage (see the module docstring); ``dtype``:
    floating tensors are cast to it."""

    def __init__(self, dtype: Optional[torch.dtype] = None, storages: bool = False) -> None:
        fake_tensor = _fake_types()[0]
        self._fake_tensor = self.fake_type = fake_tensor
        self.mode, self.maker = _take_mode()  # a mode of an earlier count's, or a new one
        self.memo: Dict[int, Any] = {}
        self.dtype = dtype
        self.storages = storages
        self.inference = torch.is_inference_mode_enabled()
        #: id(fake) -> (fake, its metadata) for fakes made the fast way (FakeCopy.metas)
        self.metas: Dict[int, Tuple[torch.Tensor, Tuple[Any, ...]]] = {}
        # (id(real storage), dtype) -> (the real storage, kept alive so ids stay unique; its fake base)
        self._bases: Dict[Tuple[int, torch.dtype], Tuple[Any, torch.Tensor]] = {}

    def fake(self, tensor: torch.Tensor, what: str = "a tensor") -> torch.Tensor:
        found = self.memo.get(id(tensor))
        if found is not None:
            return found
        meta = None
        if self.storages:
            made = self._on_storage(tensor, what)
        else:
            made, meta = self._make(tensor)
        if isinstance(tensor, nn.Parameter):
            made._is_param = True  # makes isinstance(made, nn.Parameter) true
        grad = tensor.requires_grad and (made.is_floating_point() or made.is_complex())
        if grad:
            made.requires_grad_(True)
        self.memo[id(tensor)] = made
        if meta is not None:  # made the fast way: its metadata is the real tensor's, at offset 0
            self.metas[id(made)] = (made, meta)
        return made

    def fake_pending(self, pending: Pending) -> Optional[torch.Tensor]:
        """The fake of a :class:`Pending`'s tensor (the one already made, if any), made from the
        metadata its key holds: inside the run every read of a tensor's metadata goes through the
        run's torch-function mode, so the real tensor is not read again. None where the fast
        constructor fails (a private constructor that changed): the caller then takes
        :meth:`fake`'s general route, above the dispatch it runs this below."""
        real = pending.real
        found = self.memo.get(id(real))
        if found is not None:
            return found
        shape, stride, _, dtype, device, grad, _ = pending.key
        try:
            made = self.maker.make(shape, stride, dtype, device, grad, type(real) is nn.Parameter)
        except Exception:
            return None
        self.memo[id(real)] = made
        return made

    def deferred_key(self, tensor: Any) -> Optional[Tuple[Any, ...]]:
        """:func:`reuse_key` of ``tensor`` where its fake is made the fast way (a meta tensor
        wrapped as fake, whose metadata :func:`reuse_key` reads from the real tensor: such a fake
        can be made on first use), else None (the checks made by type first: every parameter of
        a count is read so)."""
        kind = type(tensor)
        if self.storages or (kind is not torch.Tensor and kind is not nn.Parameter):
            return None  # a subclass (an uninitialised parameter among them) or a fake storage
        if tensor.layout is not _STRIDED or tensor.is_quantized:
            return None
        return reuse_key(tensor, self.fake_type)

    def _make(self, tensor: torch.Tensor) -> Tuple[torch.Tensor, Optional[Tuple[Any, ...]]]:
        """The fake of ``tensor`` and, when made the fast way, its :func:`reuse_key`."""
        kind = type(tensor)
        if tensor.layout == torch.strided and not tensor.is_quantized and kind in (torch.Tensor, nn.Parameter, self._fake_tensor):
            try:
                # The fast way (a meta tensor wrapped as fake): ~20x cheaper than from_tensor.
                made = self.maker.make(tensor.shape, tensor.stride(), tensor.dtype, _stood_for(tensor))
                return made, reuse_key(tensor, self._fake_tensor)
            except Exception:
                pass  # a private constructor that changed: the public route below
        return self.mode.from_tensor(tensor, static_shapes=True), None

    def _on_storage(self, tensor: torch.Tensor, what: str) -> torch.Tensor:
        """A view of the one fake storage made for ``tensor``'s storage (of the storage's full
        size, or the view's extent if that is larger), meta mapped to cpu, cast to ``dtype``."""
        if tensor.layout != torch.strided or tensor.is_quantized:
            raise UsageError(f"{what} is a {tensor.layout} tensor; only dense tensors are supported")
        dtype = self.dtype if self.dtype is not None and tensor.is_floating_point() else tensor.dtype
        storage = tensor.untyped_storage()
        key = (id(storage), dtype)
        if key not in self._bases:
            extent = tensor.storage_offset() + sum((n - 1) * s for n, s in zip(tensor.shape, tensor.stride())) + 1
            numel = max(storage.nbytes() // tensor.element_size(), extent if tensor.numel() else 0)
            device = torch.device("cpu") if tensor.device.type == "meta" else tensor.device
            with self.mode:
                self._bases[key] = (storage, torch.empty(numel, dtype=dtype, device=device))
        with self.mode:
            # detached: not a view for autograd, as a real parameter is not (autocast caches
            # its low-precision copies of leaves that are not views)
            return self._bases[key][1].as_strided(tensor.shape, tensor.stride(), tensor.storage_offset()).detach()


def fake_copies(
    model: nn.Module,
    inputs: Sequence[torch.Tensor],
    rebuild: Optional[Callable[[Sequence[torch.Tensor]], Any]] = None,
    *,
    dtype: Optional[torch.dtype] = None,
    storages: bool = False,
    retie: bool = False,
    modules: Optional[Sequence[Tuple[str, nn.Module]]] = None,
    shared_hooks: Optional[SharedHooks] = None,
    lazy: bool = False,
    attributes: Optional[Sequence[Tuple[str, torch.Tensor]]] = None,
    names: Optional[Mapping[nn.Module, str]] = None,
) -> FakeCopy:
    """A copy of ``model`` (modules copied, tensors faked, lazy parameters left lazy), a
    fake for each of ``inputs``, and the call arguments ``rebuild(fakes)`` with every other
    object in them copied too (a list or KV cache the forward appends to stays the
    caller's own). ``dtype``, ``storages``, ``retie``: see the module docstring; ``modules``:
    ``model.named_modules()`` when the caller has them already; ``shared_hooks``: the modules'
    empty hook dictionaries are that object's shared ones (the caller checks ``touched`` after
    the run); ``lazy``: the modules' parameters and buffers that can be faked the fast way are
    faked on first use (:class:`LazyTensors`; ``twins`` then lists only those made);
    ``attributes``: with ``lazy``, the tensors the modules keep as plain attributes, when the
    caller has them already (``ModelFacts.tensor_attributes``: no walk of the tree); ``names``:
    with ``lazy``, each module's canonical name (``ModelFacts.names``): the copy is then lazy in
    depth too, a module's children copied when first reached (:class:`LazyModules`), and
    ``FakeCopy.names`` / ``FakeCopy.lazy`` say which are copied so far. Raises
    :class:`FakeRunError` if it cannot, :class:`UsageError` for a tensor ``storages`` refuses."""
    faker = _Faker(dtype, storages)
    memo: Dict[int, Any] = {}
    lazy = lazy and not storages
    try:
        named = attributes if lazy and attributes is not None else _named_tensors(model, modules, attributes_only=lazy)
        for label, tensor in named:
            if not is_uninitialized(tensor):
                memo[id(tensor)] = faker.fake(tensor, label)
        fake_inputs = [faker.fake(t, f"input tensor {i}") for i, t in enumerate(inputs)]
        for fake in fake_inputs:  # inside an object the copier deep-copies (a dataclass input): kept as is
            memo[id(fake)] = fake
        copier = _TreeCopier(memo, faker, shared_hooks, lazy)
        lazy_copy = copier.lazy_copy = LazyCopy(copier, names, model) if lazy and names is not None else None
        if lazy_copy is not None:
            lazy_copy.read_all()  # here, outside the run's modes
        model_copy = copier.module(model)
        call_copy = copier.value(rebuild(fake_inputs)) if rebuild is not None else None
        notes = restore_ties(model_copy) if retie else []
    except UsageError:
        raise
    except Exception as exc:
        raise FakeRunError(_copy_failure(exc, model)) from exc
    made = FakeCopy(
        faker.mode, model_copy, fake_inputs, call_copy, dict(faker.memo), notes, memo, faker.metas,
        lazy_copy.names if lazy_copy is not None else None, lazy_copy,
    )
    made.maker = faker.maker
    return made


_UNSEEN: Any = object()


class _EmptyHooks(OrderedDict):  # keys and values as in torch's own hook dictionaries
    """An empty hook dictionary shared by every module of a fake copy (one per attribute
    name): any change to it marks the copy's :class:`SharedHooks` touched, and the run is
    made again with a dictionary of its own per module."""

    sharing: SharedHooks

    def _touch(self) -> None:
        self.sharing.touched = True

    def __setitem__(self, key: Any, value: Any) -> None:
        self._touch()
        super().__setitem__(key, value)

    def __delitem__(self, key: Any) -> None:
        self._touch()
        super().__delitem__(key)

    def update(self, *args: Any, **kwargs: Any) -> None:
        self._touch()
        super().update(*args, **kwargs)

    def setdefault(self, key: Any, default: Any = None) -> Any:
        self._touch()
        return super().setdefault(key, default)

    def pop(self, *args: Any) -> Any:
        self._touch()
        return super().pop(*args)

    def popitem(self, last: bool = True) -> Any:
        self._touch()
        return super().popitem(last)

    def clear(self) -> None:
        self._touch()
        super().clear()

    def move_to_end(self, key: Any, last: bool = True) -> None:
        self._touch()
        super().move_to_end(key, last)

    def __ior__(self, other: Any) -> Any:  # type: ignore[misc]  # OrderedDict's own is typed against its __or__
        self._touch()
        return super().__ior__(other)


class _EmptyDict(dict):
    """An empty ``_parameters``, ``_buffers`` or ``_modules`` dictionary shared by every module
    of a fake copy that has none (as :class:`_EmptyHooks`): adding to it marks the copy's
    :class:`SharedHooks` touched. Only adding can change an empty dictionary."""

    sharing: SharedHooks

    def __setitem__(self, key: Any, value: Any) -> None:
        self.sharing.touched = True
        super().__setitem__(key, value)

    def update(self, *args: Any, **kwargs: Any) -> None:
        self.sharing.touched = True
        super().update(*args, **kwargs)

    def setdefault(self, key: Any, default: Any = None) -> Any:
        self.sharing.touched = True
        return super().setdefault(key, default)

    def __ior__(self, other: Any) -> Any:  # type: ignore[misc]  # dict's own is typed against its __or__
        self.sharing.touched = True
        return super().__ior__(other)

    def __reduce__(self) -> Any:  # copy.copy / deepcopy / pickle: a plain dict of its own
        return (dict, (dict(self),))


class _EmptySet(set):  # holds nothing; torch's own sets hold names
    """An empty set shared by every module of a fake copy that holds one under that name (torch's
    per-module set of non-persistent buffer names: a set object is ~0.2 KiB, one per copied module;
    issue #32's memory target). Only adding can change an empty set: adding marks the copy's
    :class:`SharedHooks` touched, and the run is made again with sets of each module's own."""

    sharing: SharedHooks

    def add(self, item: Any) -> None:
        self.sharing.touched = True
        super().add(item)

    def update(self, *others: Any) -> None:
        self.sharing.touched = True
        super().update(*others)

    def symmetric_difference_update(self, other: Any) -> None:
        self.sharing.touched = True
        super().symmetric_difference_update(other)

    def __ior__(self, other: Any) -> Any:  # type: ignore[misc]  # set's own is typed against its __or__
        self.sharing.touched = True
        return super().__ior__(other)

    def __ixor__(self, other: Any) -> Any:  # type: ignore[misc]  # likewise
        self.sharing.touched = True
        return super().__ixor__(other)

    def __reduce__(self) -> Any:  # copy.copy / deepcopy / pickle: a plain set of its own
        return (set, (list(self),))


#: a module's own containers that a fake copy's modules share while empty (torch's attribute names)
_SHARED_WHEN_EMPTY = frozenset({"_parameters", "_buffers", "_modules"})


class SharedHooks:
    """The empty hook dictionaries a fake copy's modules share (a count's copy of a 70B model
    holds 1,047 modules with eleven each: 11,500 objects the garbage collector walks while the
    count runs), and their empty parameter, buffer and child dictionaries (issue #32: one to
    three per module).
    ``touched``: something changed one (a forward that registers a hook or a buffer on a module
    of the copy): the copy is then not to be trusted, as that hook would be every module's."""

    def __init__(self) -> None:
        self.touched = False
        self._dicts: Dict[str, _EmptyHooks] = {}
        self._plain: Dict[str, _EmptyDict] = {}
        self._sets: Dict[str, _EmptySet] = {}

    def empty_set(self, name: str) -> _EmptySet:
        """The shared empty set held under attribute ``name``."""
        found = self._sets.get(name)
        if found is None:
            found = self._sets[name] = _EmptySet()
            found.sharing = self
        return found

    def empty_plain(self, name: str) -> _EmptyDict:
        """The shared empty ``_parameters`` / ``_buffers`` / ``_modules`` dictionary."""
        found = self._plain.get(name)
        if found is None:
            found = self._plain[name] = _EmptyDict()
            found.sharing = self
        return found

    def empty(self, name: str) -> _EmptyHooks:
        found = self._dicts.get(name)
        if found is None:
            found = self._dicts[name] = _EmptyHooks()
            found.sharing = self
        return found


class _TreeCopier(TreeCopier):
    """A deep copy of a module tree, made for the fake run: modules, their attribute and
    hook dictionaries, lists and tuples are copied here; tensors come from ``memo`` (their
    fakes) or are faked; immutable values and plain functions are shared; anything else goes
    through ``copy.deepcopy`` with the same memo. Several times cheaper than ``copy.deepcopy``
    of the whole tree, which spends its time on a dozen (mostly empty) dicts per module."""

    def __init__(self, memo: Dict[int, Any], faker: _Faker, shared: Optional[SharedHooks] = None, lazy: bool = False):
        super().__init__(memo)
        self.faker = faker
        self.shared = shared
        self.lazy = lazy
        self._pending: Dict[int, Pending] = {}  # id(real tensor) -> its one Pending (ties kept)
        # one key object per distinct key: the repeated layers of a deep model hold equal keys
        # (issue #32: one tuple of tuples per parameter per layer was most of a Pending's size)
        self._keys: Dict[Tuple[Any, ...], Tuple[Any, ...]] = {}
        # attribute name -> the shared empty hook dictionary (OrderedDict) or torch container
        # (dict) for it (None: none shared under that name)
        self._empties: Dict[str, Any] = {}
        self._plain: Dict[str, Any] = {}
        # the ids of the caller's empty sets the copies hold as a shared one, and that one, in order:
        # a memo entry each once another object may meet them (:meth:`_memo_sets`)
        self._set_ids = array("Q")
        self._set_copies: List[Any] = []
        #: a copy lazy in depth: children copied when first reached (None: the whole tree now)
        self.lazy_copy: Optional[LazyCopy] = None
        #: id(caller's tensor) -> its key, read before the run (:meth:`LazyCopy.read_all`)
        self.read_ahead = _NOTHING_READ

    def module(self, module: nn.Module) -> nn.Module:
        found = self.memo.get(id(module))
        if found is not None:
            return found
        new = super().module(module)
        lazy = self.lazy_copy
        if lazy is not None:
            name = lazy.originals.get(module)
            if name is not None:
                lazy.names.setdefault(new, name)
            if lazy.adopt is not None:
                lazy.adopt(new, module)
        return new

    def fill(self, module: nn.Module, state: Dict[str, Any], attributes: Dict[str, Any]) -> None:
        convert = self.value
        empties, plain = self._empties, self._plain
        memo = self.memo
        for key, value in attributes.items():
            kind = type(value)  # the common cases inline (a module holds a dozen, mostly empty hook dicts)
            if kind is OrderedDict and not value:  # first: eleven of a module's attributes are these
                shared = empties.get(key, _UNSEEN)
                if shared is _UNSEEN:
                    shared = self._empty(kind, key)
                state[key] = kind() if shared is None else shared
            elif kind in IMMUTABLE_TYPES:
                state[key] = value
            elif kind is tuple and all(type(item) in IMMUTABLE_TYPES for item in value):
                state[key] = value  # a convolution's stride, padding...: immutable, shared as the copier would rebuild it
            elif kind is dict and not value:
                shared = plain.get(key, _UNSEEN)
                if shared is _UNSEEN:
                    shared = self._empty(kind, key)
                state[key] = kind() if shared is None else shared
            elif kind is set and not value:  # torch's per-module set of non-persistent buffers
                # shared while empty, by attribute name (not named here: that would name one more
                # private torch attribute); in the memo (an empty set of a user's that another
                # object holds stays one with it), or noted for it (:meth:`_memo_sets`)
                shared = self.shared
                if shared is None:
                    state[key] = memo[id(value)] = set()
                else:
                    made = state[key] = shared.empty_set(key)
                    if id(value) in memo:
                        memo[id(value)] = made
                    else:
                        self._set_ids.append(id(value))
                        self._set_copies.append(made)
            elif self.lazy and kind is dict and (key == "_parameters" or key == "_buffers"):
                lazy = self.lazy_copy
                if lazy is not None and type(module) in lazy.unread_kinds and "forward" not in attributes:
                    unread = dict.__new__(UnreadTensors)  # not through ``__init__``, which takes in
                    unread.faker, unread.lazy, unread.source = self.faker, lazy, value
                    state[key] = unread
                else:
                    state[key] = self._lazy(value)
            elif kind is dict and key == "_modules" and self.lazy_copy is not None:
                # the caller's children, taken in when first used, each copied when first read
                children = dict.__new__(UnreadModules)  # not through ``__init__``, which takes in
                children.lazy, children.source = self.lazy_copy, value
                state[key] = children
            elif key == "forward":
                state[key] = self.own_forward(value)
            elif kind is FunctionType:
                state[key] = self.own_method(module, value)
            else:
                # an object met before (the config every layer holds): its copy, before any
                # isinstance test (a transformers config answers each through Python code)
                found = memo.get(id(value))
                state[key] = found if found is not None else convert(value)

    def _empty(self, kind: type, key: str) -> Any:
        """The shared empty container for attribute ``key`` of type ``kind`` (remembered), or None."""
        shared = self.shared
        made: Any
        if kind is OrderedDict:
            made = self._empties[key] = shared.empty(key) if shared is not None and is_hook_name(key) else None
        else:
            made = self._plain[key] = shared.empty_plain(key) if shared is not None and key in _SHARED_WHEN_EMPTY else None
        return made

    def read_ahead_of(self, tensors: Sequence[Any]) -> None:
        """``read_ahead``: the keys of those of ``tensors`` :meth:`_lazy` will need, read in one call."""
        memo, pending = self.memo, self._pending
        unread = [t for t in tensors if id(t) not in memo and id(t) not in pending and isinstance(t, torch.Tensor)]
        if unread and self.lazy:
            keys = _read_keys(self.faker, unread, self._keys)
            if None in keys:
                unread, keys = self._fake_slow_ones(unread, keys)
            self.read_ahead = KeyTable(unread, keys)

    def _fake_slow_ones(self, tensors: List[Any], keys: List[Any]) -> Tuple[List[Any], List[Any]]:
        """Fakes now, above the dispatch, those of ``tensors`` the fast constructor cannot make (key
        None: a ``Parameter`` or tensor subclass, a sparse or quantized tensor), and gives back the
        others and their keys. Those are made by ``FakeTensorMode.from_tensor``, which refuses to
        run below the dispatch, where a module below the root is copied (:meth:`LazyCopy.copy_of`):
        a model holding one there was counted by a real run instead (wild7). One that fails here
        stays in the read-ahead and is tried again there, as before."""
        memo, faker = self.memo, self.faker
        for tensor, key in zip(tensors, keys):
            if key is None and not is_uninitialized(tensor):
                try:
                    memo[id(tensor)] = faker.fake(tensor)
                except Exception:
                    continue
        kept = [i for i, tensor in enumerate(tensors) if id(tensor) not in memo]
        return [tensors[i] for i in kept], [keys[i] for i in kept]

    def raw_keys(self, tensors: Sequence[Any], found_at: Optional[List[int]] = None) -> List[Any]:
        """See :meth:`LazyCopy.tensor_keys`: what :meth:`_lazy` will hold for each of ``tensors``, keyed."""
        memo, pending, read = self.memo, self._pending, self.read_ahead
        found: List[Any] = []
        unread: List[Tuple[int, Any]] = []
        for tensor in tensors:
            made = memo.get(id(tensor))
            if made is not None:
                found.append(made)
                continue
            waiting = pending.get(id(tensor))
            if waiting is not None:
                found.append(waiting.key)
                continue
            i = read.find(id(tensor))
            if i < 0:
                key = _UNSEEN
            else:
                key = read.keys[i]
                if found_at is not None:
                    found_at.append(i)
            found.append(None if key is _UNSEEN else key)
            if key is _UNSEEN and self.lazy and isinstance(tensor, torch.Tensor):
                unread.append((len(found) - 1, tensor))
        if unread:
            keys = self._keys
            for (i, _), key in zip(unread, _read_keys(self.faker, [t for _, t in unread])):
                found[i] = None if key is None else keys.setdefault(key, key)
        return found

    def _lazy(self, tensors: Dict[str, Any]) -> LazyTensors:
        """A module's parameter or buffer dictionary, its tensors faked on first read where
        they can be faked the fast way (a tensor faked already, or of another kind: its fake).
        One pass over the tensors, each found by one bisection in the read-ahead (a module is
        copied when the forward first reaches it: ~110 of a ResNet-50 count's, two such
        dictionaries each); a tensor not read ahead has its key read after the pass, with the
        others not read ahead, in one call, its place in the dictionary kept."""
        made = LazyTensors()
        made.faker = self.faker
        self.lazy_into(made, tensors)
        return made

    def lazy_into(self, made: LazyTensors, tensors: Dict[str, Any]) -> None:
        """:meth:`_lazy`'s entries, put into ``made`` (empty)."""
        # not in the memo: a module's own parameter or buffer dictionary, held by nothing else
        memo, pending = self.memo, self._pending
        ahead = self.read_ahead
        ids, ahead_keys = ahead.ids, ahead.keys
        size = len(ids)
        taken: List[int] = []
        later: List[Tuple[str, Any]] = []  # not read ahead (or taken since): keys read below
        for name, tensor in tensors.items():
            if tensor is None:
                dict.__setitem__(made, name, None)
                continue
            ident = id(tensor)
            found = memo.get(ident)
            if found is None:
                found = pending.get(ident)
            if found is not None:
                dict.__setitem__(made, name, found)
                continue
            i = bisect_left(ids, ident)
            key = ahead_keys[i] if i < size and ids[i] == ident else _TAKEN
            if key is _TAKEN:
                dict.__setitem__(made, name, None)  # its place, filled below
                later.append((name, tensor))
                continue
            taken.append(i)
            # from now on the Pending holds the key (None: faked now, another way)
            dict.__setitem__(made, name, self.value(tensor) if key is None else self._pending_of(tensor, key))
        if later:
            read = _read_keys(self.faker, [tensor for _, tensor in later])
            for (name, tensor), key in zip(later, read):
                found = memo.get(id(tensor))
                if found is None:
                    found = pending.get(id(tensor))
                if found is None:
                    found = self.value(tensor) if key is None else self._pending_of(tensor, key)
                dict.__setitem__(made, name, found)
        if taken:  # the Pendings and fakes hold what it held for them; not made again here, where a call
            # being keyed may hold positions found in it (``LazyCopy.tensor_keys``)
            ahead.take(taken, remake=False)

    def _pending_of(self, tensor: torch.Tensor, key: Tuple[Any, ...]) -> Pending:
        """The one :class:`Pending` of ``tensor`` (made now, holding the one key equal to ``key``)."""
        made = self._pending[id(tensor)] = Pending(tensor, self._keys.setdefault(key, key))
        return made

    def inside_run(self, make: Callable[..., Any], *args: Any) -> Any:
        """``make(*args)`` as a copy is made inside the run: below the recorder's and the fake mode's
        dispatch (its fakes are not ops of the model), in the inference mode the copy was begun in."""
        with torch._C._DisableTorchDispatch():
            if torch.is_inference_mode_enabled() == self.faker.inference:
                return make(*args)
            with torch.inference_mode(self.faker.inference):
                return make(*args)

    def value(self, value: Any) -> Any:
        kind = type(value)
        if (kind is dict or kind is OrderedDict) and not value:
            return kind()  # the hook and buffer dictionaries of most modules: empty
        return super().value(value)

    def tensor(self, value: torch.Tensor) -> Any:
        if isinstance(value, self.faker.fake_type) and value.fake_mode is self.faker.mode:
            return value  # already one of ours
        made = self.memo[id(value)] = self.faker.fake(value)  # held in a container attribute: faked too
        return made

    def _memo_sets(self) -> None:
        """The empty sets :meth:`fill` noted, into the memo (as if put there as met; the last one for
        an id wins, as it would have): every object not met before comes here (:meth:`other`, the
        deep copy's memo) before it is copied, so an empty set that a module and another object hold
        stays one object in the copy. A set noted is an id (8 B) and a reference (8 B), where a memo
        entry took ~75 B (an ``int``, an entry, its index): one per module copied (issue #32)."""
        self.memo.update(zip(self._set_ids, self._set_copies))
        del self._set_ids[:]
        self._set_copies.clear()

    def other(self, value: Any) -> Any:
        if isinstance(value, _shared_types()):
            return value
        if self._set_ids:
            self._memo_sets()
            found = self.memo.get(id(value))
            if found is not None:
                return found
        if type(value) is set and all(type(item) in IMMUTABLE_TYPES for item in value):
            new = self.memo[id(value)] = set(value)
            return new
        # Any other object (a KV cache) is deep-copied, each tensor it holds faked into this
        # copy's mode: a fake tensor's own deep copy would deep-copy its FakeTensorMode too (a
        # second mode sharing the first one's internals, which crashes the interpreter when
        # both are collected), and a real one would copy its data.
        with _FakedOnCopy(self.memo, self.faker):
            return copy.deepcopy(value, self.memo)


class _FakedOnCopy(TorchFunctionMode):
    """While active, ``copy.deepcopy`` of a tensor gives its fake (one per tensor, kept in
    ``memo``); every other torch function runs as it would."""

    def __init__(self, memo: Dict[int, Any], faker: _Faker):
        super().__init__()
        self.memo = memo
        self.faker = faker

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func is torch.Tensor.__deepcopy__ and len(args) == 2 and isinstance(args[0], torch.Tensor):
            tensor, memo = args
            found = memo.get(id(tensor))
            if found is None:
                found = memo[id(tensor)] = self.faker.fake(tensor)
            return found
        return func(*args, **(kwargs or {}))


@cache
def _shared_types() -> Tuple[type, ...]:
    """Objects shared with the copy rather than deep-copied: a ``torch.export``ed (or
    fx) module's graph, which its generated forward never reads, its nodes (an unflattened
    program keeps its input placeholders, read only to check input shapes; their recorded
    values may have symbolic sizes, which cannot be deep-copied), and pytree specs (its
    ``_in_spec``/``_out_spec``, immutable). Copying them is slow and trips a deprecation
    warning inside torch. The spec type is the one torch.export's public
    ``ModuleCallSignature`` declares for its ``in_spec``: the type of the specs an exported
    program hands out, wherever torch keeps that class."""
    import dataclasses

    import torch.export
    import torch.fx

    return (torch.fx.Graph, torch.fx.Node) + _spec_types(dataclasses.fields(torch.export.ModuleCallSignature))


def _spec_types(fields: Sequence[Any]) -> Tuple[type, ...]:
    """The declared type of the ``in_spec`` field among a dataclass's ``fields``, when it is a
    class (none when the field is gone or its type is not a class: specs are then deep-copied)."""
    declared = [field.type for field in fields if field.name == "in_spec"]
    return tuple(kind for kind in declared if isinstance(kind, type))


def shared_tensor_copy(model: nn.Module) -> nn.Module:
    """A copy of the module tree that shares every initialised tensor with ``model``: a
    real run on it materialises the copy's lazy modules, not the caller's."""
    memo: Dict[int, Any] = {}
    for tensor in _own_tensors(model) + _attribute_tensors(model):
        # an uninitialised buffer cannot be deep-copied: the copy gets a fresh one of its kind
        memo[id(tensor)] = fresh_uninitialized(tensor) if is_uninitialized(tensor) else tensor
    return deep_copied(model, memo)


class _QuietThread(logging.Filter):
    """Drops the records of one thread (the one that made it); every other thread's pass."""

    def __init__(self) -> None:
        super().__init__()
        self.thread = threading.get_ident()

    def filter(self, record: logging.LogRecord) -> bool:
        return record.thread != self.thread


@contextlib.contextmanager
def quiet_fake_logs() -> Iterator[None]:
    """FakeTensorMode logs an error line when an op's meta kernel raises; that failure is
    ours to handle (a real run follows), and the library never prints: mute it meanwhile,
    for this thread only (another thread's records of that logger still pass), and take
    the filter off on exit."""
    logger = logging.getLogger("torch._subclasses.fake_tensor")
    quiet = _QuietThread()
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    first = text.splitlines()[0] if text else ""
    if len(first) > 160:
        first = first[:157] + "..."
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def _copy_failure(exc: BaseException, module: nn.Module) -> str:
    """One sentence saying why the model could not be copied with fake tensors (up front, or a module
    of a lazy copy when the forward reached it): a TorchScript module in ``module`` by name (its
    C++ state has no fake copy; named by its class, as a lazy copy's module has no path here), else
    the error's first line."""
    scripted = next((sub for sub in module.modules() if isinstance(sub, torch.jit.ScriptModule)), None)
    if scripted is not None:
        name = getattr(scripted, "original_name", type(scripted).__name__)
        return f"the model holds a TorchScript module (a scripted {name}), which cannot be copied with fake tensors"
    return f"the model could not be copied with fake tensors ({_one_line(exc)})"


def reason_for(exc: BaseException, where: str) -> str:
    """One sentence saying why the forward could not run on fake tensors."""
    from torch._subclasses import fake_tensor as ft

    place = module_place(where)
    needs_value = (ft.DataDependentOutputException, ft.DynamicOutputShapeException)
    if isinstance(exc, needs_value):
        op = str(exc).strip().splitlines()[0] if str(exc).strip() else "an op"
        return f"the forward needs a tensor's value in {place} ({op})"
    if isinstance(exc, ft.UnsupportedOperatorException):
        return f"{str(exc).strip() or 'an op'} in {place} has no fake-tensor kernel"
    return f"the forward failed on fake tensors in {place} ({_one_line(exc)})"
