"""Structural reuse on the default (fake) path: a submodule call that matches an earlier
call exactly is booked again from that call's events instead of being run (issue #32).

A count needs shapes only, and most models repeat one block (12 layers of BERT, 16
bottlenecks of four kinds in ResNet-50). On the fake copy of the model (never the
caller's), each submodule's ``forward`` is wrapped. A call's key is everything its events
can depend on that we can see:

* the whole subtree, structurally: each module's class and ``forward`` code, its
  parameters' and buffers' metadata (shape, stride, offset, dtype, device, layout,
  requires_grad), which modules of the subtree are the same object and which of its tensors
  are one (``b.weight = a.weight``), and the ``requires_grad`` of its fakes where a parent changed
  it after the key was first read (branch ``exact3``);
* the plain attributes the first call *read* (``training``, ``stride``, ``eps``...; tensors by
  metadata, objects by identity), compared with the new subtree's before a call is booked:
  each module of the copy runs as a subclass of its class whose ``__getattribute__`` logs
  reads while a first call runs, so an attribute no forward reads (transformers'
  ``layer_idx`` without a KV cache) does not split the key; a module whose class cannot be
  subclassed safely (its own metaclass or ``__init_subclass__``) has all its plain
  attributes keyed;
* every argument: tensors by that metadata and by which arguments are the same tensor,
  Python scalars, dtypes, devices and None by value, tuples/lists/dicts of those;
* the process settings ops read: default dtype, grad mode, autocast state;
* the globals the subtree's code names (each class's ``forward``, the code nested in it, what a
  decorator wraps, the methods of the class it names and the functions of its own Python module
  it calls: :func:`~flopcount.core.state.forward_globals`) that hold Python data: scalars,
  tuples, lists, dicts, sets and tensors, keyed as attributes are (a flag or counter set between
  two layers splits the key); and whether that code was rebound since the count first saw the
  class (``Block.forward = other`` between two layers: :func:`~flopcount.core.state.code_bound`).

A call whose key was seen before, and whose earlier call was *clean*, is a hit: it is
recorded as one :class:`~flopcount.types.ReplayedCall` (the earlier call's ops, shared, under module
stacks mapped onto the new subtree by relative path; the ledger books it as a group), the
module call counts are added likewise, and fresh fake outputs of the recorded metadata are returned
(or the argument itself when the earlier call returned its argument). A transformers KV
cache argument is keyed by what the call can observe of it and its writes to the cache are
replayed (``_reuse_cache.py``). Not reused, always traced: a call with any other argument
(another object, a real tensor, a fake of another mode), a subtree with a hook or an instance-level ``forward`` (or any
process-wide module hook), a call inside an intercepted composite, and any key whose first
call was not clean: it changed an attribute of its subtree (a counter), what a container or a
plain object (a config) held by one holds, needed a stand-in
kernel or a placeholder, turned a shape-cache entry off, ran ``torch.cond``, ran an op
outside its subtree's modules, wrote a global its forwards name (``global step; step += 1``),
changed the ``requires_grad`` of its own tensors, rebound its classes' code, or returned
something other than tensors, scalars, None, tuples and lists. What the key reaches
beyond the subtree (closures, properties, a user's objects and generators, backend switches) and
what it still cannot see (a global read by a computed name, code rebound outside the subtree's
classes and their modules' globals, a tie to a tensor outside the subtree): docs/internals.md, "What the key still cannot see"; a forward whose work
depends on such state that changes between two calls of equal key would be counted from the first
call.

Forward only: the caller installs this for forward-only fake runs (no autograd graph is
needed for the events, and none is made). On by default; ``FLOPCOUNT_REUSE=0`` turns it off
(every call traced, as before #32). A twin group (modules of equal signature) is keyed only where
keying is expected to cost less than tracing (the reuse policy, :func:`_pays`: by the group's calls
and its blocks' size in modules); ``FLOPCOUNT_REUSE=always`` keys every group (branch resnet11).
"""

from __future__ import annotations

import collections
import functools
import operator
import os
import random
import sys
import threading
import weakref
from abc import ABCMeta
from array import array
from bisect import bisect_left
from collections.abc import Sequence
from types import MappingProxyType
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Tuple, cast, overload

import torch
from torch import nn

from flopcount.core import hooks
from flopcount.core.state import (
    ClosureValues,
    CodeBound,
    code_bound,
    forget_code,
    forward_globals,
    generator_state,
    object_state,
    plain_object,
    random_generator,
    random_states,
    same_random_states,
    still_bound,
)
from flopcount.core.weakcache import PerObject
from flopcount.tracers._leaf_calls import (
    ANSWERABLE,
    LEAF_READ,
    LeafCall,
    LeafCalls,
    answerable,
    answered_leaf,
    leaf_attributes,
)
from flopcount.tracers._reuse_cache import INDEX_ATTRIBUTE, LayerIndex, SlotList, States, Unkeyable, cache_type
from flopcount.tracers.fake.copies import LazyCopy, Pending, outside_modes, raw_children, raw_tensors, tensor_key
from flopcount.tracers.fake.indices import version_of
from flopcount.types import ReplayedCall, expand

__all__ = ["IndexRefused", "Reuse", "reuse_enabled", "reuse_policy"]

_SCALARS = frozenset({int, float, bool, str, type(None), complex, torch.dtype, torch.device, torch.layout, torch.memory_format})
# the scalars equal only to values of their own type, keyed as themselves; a number (bool, int,
# float, complex) is keyed with its type: True == 1 == 1.0 and they hash alike, yet a forward can
# do other work with each (``torch.full(shape, fill)`` makes a bool, int64 or float32 tensor)
_SELF_KEYED = _SCALARS - {bool, int, float, complex}
# the items of a tuple or list keyed as the tuple itself (a convolution's stride): ints and the
# self-keyed; a tuple with a bool, float (NaN) or complex is keyed item by item, so (1, 0) and
# (True, False) key apart
_TUPLE_ITEMS = _SELF_KEYED | {int}
# hooks: which a module and the process have is flopcount.core.hooks's (found by pattern, not by name);
# any process-wide module hook other than the tracer's own module-stack hooks (installed after
# this check) turns reuse off for the run


# torch's own per-module dictionaries and sets (hooks, state-dict hooks, the registries)
_STRUCTURE = frozenset({"training", "_parameters", "_buffers", "_modules"}) | hooks.hook_flag_names()
_OWN = (frozenset(vars(nn.Module())) - _STRUCTURE) | {"forward"}
# what a tracked module's own key part holds besides its training flag and tensors: the hook flags
_FLAGS = tuple(sorted(hooks.hook_flag_names()))
# names a read of which says nothing the key does not hold already
_SKIP = _OWN | (_STRUCTURE - {"training"})
_MISSING = ("missing",)
# mutable sequences other than a list, keyed by content as a list is
_SEQUENCES = frozenset({collections.deque, bytearray, array})
# how deep plain objects are keyed inside one another (:meth:`Reuse._held`); deeper: the call is traced
_HELD_DEPTH = 16
# a tuple, list, dict or set longer than this is keyed once per count while it holds the same items (``Reuse._long``)
_LONG = 64
# attribute values that are neither a container, a plain object nor a generator (``Reuse._containers``)
_UNHELD = _SCALARS | {tuple}
# a fake argument met first in a call: its metadata is in the key's part of the arguments' tensors
_TENSOR = ("tensor",)
_NO_KEYS: Mapping[int, Any] = MappingProxyType({})
_UNSET: Any = object()
# nn.Module's own methods that read ``__dict__`` for torch's registries (a parameter lookup,
# an attribute assignment): not a read of every attribute, as user code's ``vars(self)`` is.
# The call machinery (``__call__`` and what it calls) reads no ``__dict__`` itself: its code
# names none, so it needs no entry (tests/test_private_replacements.py calls a module with every
# kind of hook and checks which code reads its ``__dict__``)
_MODULE_CODE = frozenset(
    getattr(nn.Module, name).__code__
    for name in ("__getattr__", "__setattr__", "__delattr__")
    if hasattr(getattr(nn.Module, name), "__code__")
)


class _NeedsCopy(Exception):
    """A module of the caller's cannot be keyed as its copy will be without copying it."""


class IndexRefused(Exception):
    """A first call given a KV cache failed after using a :class:`LayerIndex` stand-in (a C
    function that wants a true int): the count is run again without stand-ins."""


class _Watch:
    """A first call given caches: the stand-ins put in place for it and what the caches held."""

    __slots__ = ("caches", "proxies", "lists", "slots", "owns", "dirty")

    def __init__(self, caches: List[Any]):
        self.caches = caches
        self.proxies: List[Tuple[int, LayerIndex]] = []  # (module index in the subtree order, stand-in)
        self.lists: List[Tuple[List[Any], SlotList]] = []  # per cache: its own list, the recording one
        # per cache, per slot: (slot object, its attributes then (tensors' descriptions under "\0" + name),
        # its description or None)
        self.slots: List[List[Tuple[Any, Optional[Dict[str, Any]], Any]]] = []
        self.owns: List[Tuple[Dict[str, Any], Any]] = []
        self.dirty = False


def reuse_policy() -> str:
    """Structural reuse's policy, from ``FLOPCOUNT_REUSE``: ``"auto"`` by default (a twin group is
    keyed when its expected saving beats its bookkeeping: :func:`_pays`), ``"always"`` (every twin
    group keyed, the policy before branch resnet11: what tests of the key on a 2-block stack ask
    for), ``"off"`` for 0, false, no or off (every call traced; docs/internals.md)."""
    value = os.environ.get("FLOPCOUNT_REUSE", "1").strip().lower()
    if value in ("0", "false", "no", "off"):
        return "off"
    return "always" if value == "always" else "auto"


def reuse_enabled() -> bool:
    """Whether structural reuse is on: by default; ``FLOPCOUNT_REUSE=0`` (or false, no, off)
    turns it off, for a count that traces every call (docs/internals.md)."""
    return reuse_policy() != "off"


class _LogBox:
    """Where the tracking classes' ``__getattribute__`` logs reads: ``log`` is the list of
    (module, name) of the first call running, None when none is."""

    __slots__ = ("log",)

    def __init__(self) -> None:
        self.log: Optional[List[Tuple[Any, str]]] = None


class _Entry:
    """What the first call of a key left: its events, the module calls under it, its
    outputs' description, the subtree's module list (relative order) and whether it is clean."""

    __slots__ = ("inners", "compact", "calls", "outputs", "clean", "reads", "values", "slots", "indexed")

    def __init__(self) -> None:
        #: the plain attributes the call read, as (module index in the subtree order, name),
        #: and their values then; None: not known (an entry that is not clean matches any)
        self.reads: Optional[Tuple[Tuple[int, str], ...]] = None
        self.values: Tuple[Any, ...] = ()
        #: the call's distinct module stacks below the called module, as positions in the
        #: subtree order, and its events as (call, which of those stacks, phase)
        self.inners: List[Tuple[int, ...]] = []
        self.compact: Tuple[Tuple[Any, int, Any], ...] = ()  # shared by every ReplayedCall booked from it
        self.calls: List[Tuple[int, int]] = []  # (module index in the subtree order, calls)
        self.outputs: Any = None
        self.clean = False
        #: a call given caches: (slot accesses, their equality pattern, the slots' states before,
        #: after); accesses are ("rel", cache, module index) or ("abs", cache, slot)
        self.slots: Optional[Tuple[Tuple[Any, ...], Tuple[int, ...], Tuple[Any, ...], Tuple[Any, ...]]] = None
        #: a call whose ops checked an index of known value against its table (fake/indices.py):
        #: its tensor arguments' known values (:meth:`Reuse._argument_values`), which a call booked
        #: from it must have (the key holds their metadata only); None: no index checked
        self.indexed: Optional[Tuple[Any, ...]] = None


class _Held:
    """A plain object's own attributes as they are now (:func:`~flopcount.core.state.plain_object`:
    a config, a counter's holder), for a call's key: equal to another when it names the same
    attributes bound to the same objects (identity: an equal value bound anew, or ``1`` for
    ``True``, does not match, and the call is traced) and its attributes that are not scalars key
    alike (``contents``, :meth:`Reuse._held`: a list the parent changes in place between two blocks;
    before branch ``heldlists`` such a change was not seen and the later blocks were booked from the
    first).
    ~3 us for a transformers config, where keying each attribute took ~25 us. Before, such an object
    was keyed by identity alone: layers sharing one config whose flag their parent sets per layer were
    booked from the first layer."""

    __slots__ = ("names", "values", "contents")

    def __init__(self, state: Dict[str, Any], contents: Tuple[Any, ...]) -> None:
        self.names = tuple(state)
        self.values = tuple(state.values())
        self.contents = contents

    def __eq__(self, other: object) -> bool:
        return (type(other) is _Held and self.names == other.names
                and all(map(operator.is_, self.values, other.values)) and self.contents == other.contents)

    def __hash__(self) -> int:
        return hash(self.names)


class _Identical:
    """Values compared by identity (a function's closure variables, :class:`~flopcount.core.state.ClosureValues`):
    equal to another when it holds the very same objects, so ``1`` and ``True`` (equal, alike in hash)
    key apart, and the key holds them alive (an id is not reused while it is compared)."""

    __slots__ = ("values",)

    def __init__(self, values: Tuple[Any, ...]) -> None:
        self.values = values

    def __eq__(self, other: object) -> bool:
        return (type(other) is _Identical and len(self.values) == len(other.values)
                and all(map(operator.is_, self.values, other.values)))

    def __hash__(self) -> int:
        return len(self.values)


class _Paths(Sequence[Tuple[str, ...]]):
    """A replay's module stacks (:attr:`~flopcount.types.ReplayedCall.stacks`), each made when read:
    the call's own stack, then the names of its subtree's modules at the positions its first call's
    stack held (``inners``, the first call's entry's, shared). A replay holds one tuple of its
    modules' names, not a tuple per stack (issue #32: a LLaMA layer's 13 stacks were ~1 KiB of the
    count per layer, alive until booked)."""

    __slots__ = ("prefix", "names", "inners")

    def __init__(self, prefix: Tuple[str, ...], names: Tuple[str, ...], inners: List[Tuple[int, ...]]):
        self.prefix = prefix
        self.names = names
        self.inners = inners

    def __len__(self) -> int:
        return len(self.inners)

    @overload
    def __getitem__(self, k: int) -> Tuple[str, ...]: ...

    @overload
    def __getitem__(self, k: slice) -> Tuple[Tuple[str, ...], ...]: ...

    def __getitem__(self, k: Any) -> Any:
        if isinstance(k, slice):
            return tuple([self[i] for i in range(len(self.inners))[k]])
        return (*self.prefix, *map(self.names.__getitem__, self.inners[k]))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and tuple(self) == tuple(other)

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return repr(tuple(self))


class _Call:
    """The ``forward`` a wrapped module of the copy holds while the run lasts: a small object
    rather than a closure (issue #32: the wrappers were a tenth of a deep model's count memory)."""

    __slots__ = ("reuse", "module", "unkeyed", "keyed")
    __flopcount_reuse__ = True

    def __init__(self, reuse: Reuse, module: nn.Module, unkeyed: bool):
        self.reuse = reuse
        self.module = module
        self.unkeyed = unkeyed  # the next call runs without a key (a module without a twin, once)
        # keyed once in this count: its structure is remembered from the second call (a slot here,
        # not a set of ids beside: ~0.13 KiB per LLaMA layer, issue #32)
        self.keyed = False

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.reuse._call(self, args, kwargs)


class Reuse:
    """Wraps the forward of each eligible submodule of ``model`` (a fake copy) so that
    matching calls are booked from the first one; ``reused`` counts the calls booked so."""

    def __init__(
        self,
        model: nn.Module,
        names: Mapping[nn.Module, str],
        modules: Any,
        recorder: Any,
        shape_cache: Any,
        fake_mode: Any,
        fake_type: type,
        index_proxies: bool = True,
        metas: Optional[Mapping[int, Tuple[torch.Tensor, Tuple[Any, ...]]]] = None,
        lazy: Optional[LazyCopy] = None,
        watch_random: bool = False,
    ):
        self._names = names
        # a first call that draws from Python's or numpy's generator is not booked again (read around
        # each first call, ~13 us, numpy's ~50 us more: on when a count's forward drew, ``tracers._fake_run``)
        self._watch_random = watch_random
        # a copy lazy in depth (fake.copies.LazyCopy): a subtree is keyed from the caller's modules
        # where they are not copied yet, and copied whole only when a first call runs it
        self._lazy = lazy
        self._originals: Mapping[nn.Module, str] = lazy.originals if lazy is not None else {}
        self._modules = modules
        self._recorder = recorder
        self._cache = shape_cache
        self._mode = fake_mode
        self._fake_type: Any = fake_type
        # a replay's outputs made as the copy's parameters are (fake.making.FakeMaker: ~3x cheaper
        # than FakeTensor's constructor); None: by the constructor
        self._maker = lazy.copier.faker.maker if lazy is not None and lazy.copier is not None else None
        self._entries: Dict[Tuple[Any, ...], List[_Entry]] = {}
        self._meta = torch.device("meta")
        self.reused = 0
        self.traced = 0
        self._model = model
        self._structures: Dict[int, Tuple[List[Any], Any]] = {}
        self._last_fingerprint: Optional[List[Any]] = []
        # id(tensor) -> (tensor, its key): the copy's parameters and buffers come read by the
        # faker (``FakeCopy.metas``), others are read on first use
        self._tensors: Dict[int, Tuple[torch.Tensor, Tuple[Any, ...]]] = dict(metas or {})
        # attribute reads of the copy's modules while a first call runs: (module, name)
        self._box = _LogBox()
        # a module class -> its tracking class (None: its instances' plain attributes are all keyed);
        # a tracking class -> the class it tracks. Per class, not per module (issue #32: nothing per layer)
        self._classes: Dict[type, Optional[type]] = {}
        self._owners: Dict[type, type] = {}
        # a leaf under its tracking class (a first call runs) is answered as one under its own class
        # (its reads logged as one, ``LEAF_READ``: its forward does not run)
        self._leaves = LeafCalls(recorder, shape_cache, fake_type, fake_mode, _switches,
                                 lazy.fakes_made if lazy is not None else dict, self._owners, self._box)
        self._made_with: Dict[type, frozenset[str]] = {}  # a tracking class -> the names it was made with
        self._lonely = _Ids(())  # modules with no twin: their first call runs unkeyed
        # the positions in the read-ahead (``LazyCopy.read_all``) of the keys the call being keyed found:
        # let go if it is booked (its subtree is never copied for it), else left (its copies take them)
        self._found: Optional[List[int]] = None
        self._root: Any = lazy.root if lazy is not None else model
        self._swapped: List[Tuple[nn.Module, type]] = []  # swapped in now, innermost last
        self._wrapped: List[nn.Module] = []
        self._held_calls: Dict[int, Tuple[int, Tuple[str, ...]]] = {}
        self._holding: set = set()  # the plain objects being keyed now (``_held``)
        # id(long container) -> (it, its items then or None, the ``original`` its tensors were keyed for or None, its
        # key's number);
        # each distinct long content key -> a number (hashed once: a per-call key holds the number)
        self._long_keys: Dict[int, Tuple[Any, Optional[Tuple[Any, ...]], Optional[bool], Tuple[str, int]]] = {}
        self._long_contents: Dict[Any, int] = {}
        # each distinct own part and subtree key -> a number: a parent's key holds its children's numbers,
        # so a key is hashed once, not again inside each enclosing key (CPython does not keep a tuple's hash)
        self._interned: Dict[Tuple[Any, ...], int] = {}
        # the module calls of replays, added to the stack's counts when they are read (``_flush_calls``):
        # a replay's modules' names (its record's own tuple) and its entry's (index, calls) list, two
        # references per replay; ``_marks``: (the stack's count of names then, where its run starts
        # here), two machine integers per run of replays with no traced module's first call between
        # them (a replayed layer's own call is traced: a run per layer). 32 B per LLaMA layer where a
        # dictionary entry per replayed module was ~0.3 KiB, alive through the trace (issue #32)
        self._replayed: List[Any] = []
        self._marks = array("q")
        # KV caches (_reuse_cache.py): stand-ins for layer indices in first calls given a cache
        self._index_proxies = index_proxies
        self._states = States(fake_type, fake_mode)
        self._cache_active = False  # a first call given a cache is running: inner ones given it are traced
        #: a first call failed after using a layer-index stand-in: the count is not to be trusted
        self.refused = False
        self._cache_events = 0  # first calls and replays that changed a cache
        #: id(cache) -> (cache, its own attributes' description) as the call being keyed read them
        self._owns: Dict[int, Tuple[Any, Any]] = {}
        #: a module class -> where the functions its code runs are bound and what they held when this
        #: count first saw it, or saw it rebound (``core.state.code_bound``), and how often it saw that
        self._code: Dict[type, Tuple[CodeBound, int]] = {}
        #: a subtree's structural key -> its classes' places of ``_code`` in one, and ``_rebound``'s answer then
        self._code_of: Dict[Any, Tuple[CodeBound, Tuple[Tuple[type, int], ...]]] = {}

    @property
    def _log(self) -> Optional[List[Tuple[Any, str]]]:
        return self._box.log

    @_log.setter
    def _log(self, log: Optional[List[Tuple[Any, str]]]) -> None:
        self._box.log = log

    def install(self) -> int:
        """Wrap every submodule whose forward is its class's (of a lazy copy: each as it is
        copied); returns how many were wrapped now."""
        if hooks.process_hooks_present() and _process_hooks_here():  # a process-wide module hook could see a skipped call
            return 0
        lazy = self._lazy
        # the facts' names list the modules: no walk of the tree (issue #19: one per count); of a
        # lazy copy, the caller's modules (the copies are made as the forward reaches them)
        pool: Mapping[nn.Module, str] = self._originals if lazy is not None else self._names
        eligible = [module for module in pool if self._eligible(module)]
        # a module with no twin (same class and parameter shapes) can only match its own
        # earlier call: its first call runs unkeyed (keying a call that cannot match costs
        # more than it saves), from its second on it is keyed as every other
        twins: Dict[Any, List[nn.Module]] = {}
        memo: Dict[int, Any] = {}
        # the keys of the caller's tensors, read before the run (``LazyCopy.read_all``): a signature's
        # shapes and dtypes from them, not read again; as a dictionary while the signatures are made
        # (a lookup 8x faster than the table's bisection: 0.2 ms of a 70B count; let go before the run)
        keys = lazy.keys_read().as_dict() if lazy is not None else _NO_KEYS
        table: Dict[Any, int] = {}
        signatures = [_signature(module, memo, table, keys) for module in eligible]
        for module, signature in zip(eligible, signatures):
            twins.setdefault(signature, []).append(module)
        # a twin group the policy leaves traced is run as modules without a twin are (``_keyed_groups``)
        keyed = _keyed_groups(twins, pool) if reuse_policy() == "auto" else None
        # read as each copy is made, through the forward: kept as a sorted array (issue #32)
        self._lonely = _Ids([
            id(module) for signature, members in twins.items()
            if len(members) == 1 or (keyed is not None and signature not in keyed) for module in members
        ])
        before = len(self._wrapped)
        if lazy is None:
            for module in eligible:
                self._adopt(module, module)
        else:
            for original in pool:
                made = lazy.copied(original)
                if made is not None:  # copied already (the root)
                    self._adopt(made, original)
            lazy.adopt = self._adopt
            lazy.unread_kinds = ANSWERABLE  # their copies' tensors read when used: an answered call reads none
        return len(self._wrapped) - before

    def _eligible(self, module: nn.Module) -> bool:
        # a leaf runs a few ops the shape cache answers already: keying it costs more
        state = vars(module)
        if type(state.get("_modules")) is dict and not state["_modules"]:
            return False  # a leaf with a plain dictionary (most modules of a model): said at once
        return module is not self._root and "forward" not in state and _plain(state) and bool(dict.__len__(raw_children(state["_modules"])))

    def _adopt(self, module: nn.Module, original: nn.Module) -> None:
        """Wrap ``module`` (a copy of ``original``) when it is eligible; a copy of one of torch's own
        convolution and batch-norm modules (exactly) is answered from an earlier call of its key
        (``_leaf_calls``)."""
        if original not in (self._originals if self._lazy is not None else self._names):
            return
        if self._lazy is not None and answerable(type(original)) and "forward" not in vars(original):
            vars(module)["forward"] = LeafCall(self._leaves, module)
            self._wrapped.append(module)
            return
        if not self._eligible(original):
            return
        # straight into the instance's dictionary: nn.Module.__setattr__'s registry checks
        # find nothing for a callable (a thousand modules on a 70B model)
        vars(module)["forward"] = _Call(self, module, id(original) in self._lonely)
        self._wrapped.append(module)

    def uninstall(self) -> None:
        """Give the copy's modules their own classes back, and take the wrapped forwards off
        them: a wrapper holds its module and this object (hence the recorder and its events),
        a cycle that would keep the whole copy and trace alive until the garbage collector's
        next full pass (tens of thousands of objects per count on a 70B model, each pass
        over the whole heap some 100 ms)."""
        for module, cls in reversed(self._swapped):
            object.__setattr__(module, "__class__", cls)
        for module in self._wrapped:
            state = vars(module)
            if getattr(state.get("forward"), "__flopcount_reuse__", False):
                del state["forward"]
        if self._lazy is not None:
            self._lazy.release()  # no module is copied any more: the copier lets the copies go
        self._wrapped = []
        self._swapped = []
        self._entries = {}
        self._classes = {}
        self._owners.clear()  # the leaf calls hold it
        self._owns = {}
        self._long_keys = {}
        self._long_contents = {}
        self._code = {}
        self._code_of = {}
        # the trace reads the counts next; added once the caches and the copies are let go (they were the
        # peak's: the counts' dictionary made beside them was issue #32's count's peak on a 70B model)
        self._flush_calls(final=True)

    def _own_class(self, kind: type) -> Optional[type]:
        """The class of a module of type ``kind`` whose attribute reads are logged while a first
        call runs, so that its plain attributes are keyed only when read (``layer_idx``
        differs between layers that use it only to index a cache they were not given); None
        when all its plain attributes are keyed. While a first call of a subtree that holds
        it runs (``_swap_in``), a copy's class is swapped for a subclass of it whose
        ``__getattribute__`` logs the name first. Outside first calls it keeps its own class:
        most attribute reads of a count (the keys' own, replays' callers, the root's forward:
        ~3,200 per ResNet-50 count) are made at C speed. Decided once per class, the swap
        tried on a blank instance (never on a module of the caller's)."""
        owner = self._owners.get(kind)
        if owner is not None:
            return owner  # swapped in now
        made = self._classes.get(kind, _UNSET)
        if made is _UNSET:
            made = self._tracking_class(kind)
            if made is not None:
                try:
                    if any("__del__" in vars(k) for k in kind.__mro__[:-1]):
                        raise TypeError("a finalizer would run on the blank instance")
                    blank: Any = object.__new__(kind)
                    object.__setattr__(blank, "__class__", made)
                except TypeError:
                    made = None
                else:
                    self._owners[made] = kind
            self._classes[kind] = made
        return kind if made is not None else None

    def _swap_in(self, order: List[nn.Module]) -> List[Tuple[nn.Module, type]]:
        """The tracking classes on the subtree's tracked modules that do not have them yet (an
        enclosing first call swapped the others); returns what to give back."""
        swapped: List[Tuple[nn.Module, type]] = []
        classes, owners = self._classes, self._owners
        for module in order:
            kind = type(module)
            if kind in owners or self._own_class(kind) is None:
                continue
            made = classes[kind]
            object.__setattr__(module, "__class__", made)
            swapped.append((module, kind))
        self._swapped.extend(swapped)
        return swapped

    def _swap_out(self, swapped: List[Tuple[nn.Module, type]]) -> None:
        for module, cls in reversed(swapped):
            made = type(module)
            object.__setattr__(module, "__class__", cls)
            made_with = self._made_with[made]
            if len(vars(made)) != len(made_with):
                self._give_to_tracked(made, cls, made_with)
        del self._swapped[len(self._swapped) - len(swapped):]

    @staticmethod
    def _give_to_tracked(made: type, cls: type, made_with: frozenset[str]) -> None:
        """Move what a first call set on its module's class (``type(self).calls += 1``, which
        landed on the tracking class ``made``) onto the class it tracks, where a run without the
        tracking class sets it: a later call reads it there (and the globals key, which holds the
        class's data attributes, sees that the call wrote them)."""
        for name in [name for name in vars(made) if name not in made_with]:
            setattr(cls, name, vars(made)[name])
            delattr(made, name)

    def _tracking_class(self, cls: type) -> Optional[type]:
        # a metaclass or __init_subclass__ of the user's could act on a new subclass: not made
        if type(cls) not in (type, ABCMeta) or any("__init_subclass__" in vars(k) for k in cls.__mro__[:-1]):
            return None
        reads: Callable[[Any, str], Any] = cls.__getattribute__  # type: ignore[assignment]  # unbound: (obj, name)
        # the class is cyclic garbage when the count ends (a class refers to itself): it holds
        # only this small box, not the Reuse (whose recorder holds every event of the count)
        box = self._box
        getframe = sys._getframe
        module_code = _MODULE_CODE
        skip = _SKIP

        def __getattribute__(obj: Any, name: str) -> Any:
            log = box.log
            if log is not None and name not in skip and (name != "__dict__" or getframe(1).f_code not in module_code):
                log.append((obj, name))
            return reads(obj, name)

        namespace = {
            "__getattribute__": __getattribute__,
            "__module__": cls.__module__,
            "__qualname__": cls.__qualname__,
            "__doc__": cls.__doc__,
        }
        try:
            made = type(cls.__name__, (cls,), namespace)
        except Exception:
            return None
        self._made_with[made] = frozenset(vars(made))  # a name beyond these was set by a first call
        return made

    # ------------------------------------------------------------------ the call

    def _call(self, wrapped: _Call, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
        """A call of a wrapped module: booked from an earlier call of equal key, or run."""
        module = wrapped.module
        forward = type(module).forward.__get__(module)
        recorder = self._recorder
        if recorder.muted or recorder.phase != "forward":
            return forward(*args, **kwargs)
        if wrapped.unkeyed:
            wrapped.unkeyed = False
            return forward(*args, **kwargs)
        log = self._log
        self._log = None  # the reads made here to key the call are not the call's
        self._owns.clear()
        lazy = self._lazy
        read_ahead = self._found = [] if lazy is not None else None
        try:
            order: List[nn.Module] = []
            tensors: List[Any] = []
            caches: List[Any] = []
            structure = self._structure(wrapped, order)
            raw = _tensors_of(order)
            reals = [t.real if type(t) is Pending else t for t in raw] if lazy is not None else raw
            structure = self._tied(structure, raw, reals)
            arguments = (self._value(args, tensors, caches), self._value(kwargs, tensors, caches))
            held, keyed = self._held_fakes(order, reals)
            # the arguments' tensors by their metadata and the subtree's fakes' requires_grad, read in
            # one call below the run's modes
            metadata, grads = _fake_keys(tensors, held[0])
            changed = _changed(grads, keyed, held[1]) if held[0] and grads != keyed else ()
            if changed:
                structure = (structure, ("requires_grad", changed))
            key = (structure, arguments, metadata, _settings(), self._globals_key(order, structure))
            found = self._entries.get(key)
            entry, slots = self._match(found, order, caches) if found is not None else (None, None)
            if entry is not None and entry.clean and (
                entry.indexed is None or entry.indexed == _digest(self._argument_values(tensors))
            ):
                if lazy is not None and read_ahead:
                    lazy.forget(read_ahead)
                return self._replay(entry, order, tensors, log, caches, slots)
        except Unkeyable:
            found = entry = None
            key = None
        finally:
            self._log = log
            self._found = None
        if key is None or entry is not None:  # unkeyable, or seen and not clean: traced
            return forward(*args, **kwargs)
        return self._first(key, module, order, tensors, caches, forward, args, kwargs, changed)

    def _match(
        self, entries: List[_Entry], order: List[nn.Module], caches: List[Any]
    ) -> Tuple[Optional[_Entry], Optional[List[Tuple[int, int]]]]:
        """The entry whose first call read the same attribute values as this subtree holds
        now, and found the cache slots this call would index in the states they are in now
        (an entry with reads unknown matches any: such a call is traced); with the slots."""
        for entry in entries:
            if entry.reads is None:
                return entry, None
            if self._read_values(order, entry.reads) != entry.values:
                continue
            if entry.slots is None:
                return entry, None
            slots = self._slots_now(entry.slots, order, caches)
            if slots is not None:
                return entry, slots
        return None, None

    def _slots_now(self, recorded: Any, order: List[nn.Module], caches: List[Any]) -> Optional[List[Tuple[int, int]]]:
        """The (cache, slot) pairs a call of this subtree would index, when they repeat as in
        the first call and hold what it found there; None otherwise."""
        accesses, pattern, befores, _ = recorded
        where: List[Tuple[int, int]] = []
        for access in accesses:
            if access[0] == "rel":
                index = vars(order[access[2]]).get(INDEX_ATTRIBUTE)
                if type(index) is not int:
                    return None
                where.append((access[1], index))
            else:
                where.append((access[1], access[2]))
        if _pattern(where) != pattern:
            return None
        distinct = list(dict.fromkeys(where))
        for (ci, s), before in zip(distinct, befores):
            layers = vars(caches[ci])["layers"]
            if not 0 <= s < len(layers):
                return None
            try:
                if self._states.slot(layers[s]) != before:
                    return None
            except Unkeyable:
                return None
        return distinct

    def _read_values(self, order: List[nn.Module], reads: Tuple[Tuple[int, str], ...]) -> Tuple[Any, ...]:
        """The values of ``reads`` in the subtree ``order``; :class:`Unkeyable` where a module not
        copied yet holds a tensor in a read attribute (timm LeViT's attention-bias cache after an
        eval forward): its copy's key is not known without copying it, so the call is traced."""
        values: List[Any] = []
        originals = self._originals
        attribute = self._attribute
        last = -1
        state: Dict[str, Any] = {}
        original = False
        try:
            for i, name in reads:  # sorted: each module's reads together, its state looked up once
                if i != last:
                    last = i
                    module = order[i]
                    state = vars(module)
                    original = module in originals  # not copied yet: its attributes as its copy will hold them
                if name == "*":
                    values.append(tuple([(k, attribute(v, original)) for k, v in state.items() if k not in _SKIP]))
                elif name == LEAF_READ:  # a leaf answered in the first call: what its key held (plain values only)
                    values.append(leaf_attributes(state))
                else:
                    # most reads are of names the instance does not hold (methods, children, parameters)
                    value = state.get(name, _MISSING)
                    values.append(_MISSING if value is _MISSING else attribute(value, original))
        except _NeedsCopy:
            raise Unkeyable("a tensor held by an attribute of a module not copied yet") from None
        return tuple(values)

    def _first(
        self,
        key: Tuple[Any, ...],
        module: nn.Module,
        order: List[nn.Module],
        tensors: List[Any],
        caches: List[Any],
        forward: Callable[..., Any],
        args: Tuple[Any, ...],
        kwargs: Dict[str, Any],
        changed: Tuple[Tuple[int, bool], ...] = (),
    ) -> Any:
        recorder, stack, cache = self._recorder, self._modules, self._cache
        self.traced += 1
        lazy, originals = self._lazy, self._originals
        if lazy is not None and any(m in originals for m in order):
            # a first call runs its whole subtree: copied now, in the order it was keyed
            made = iter(lazy.copies_of([m for m in order if m in originals]))
            order[:] = [next(made) if m in originals else m for m in order]
            self._last_fingerprint = None
        watch = _Watch(caches) if caches else None
        events = self._cache_events
        outer = self._log
        log: List[Tuple[Any, str]] = outer if outer is not None else []
        self._log = None
        try:
            before = (len(recorder.assumptions), recorder.conds, len(cache.disabled) if cache is not None else 0)
            start = len(recorder.events)
            self._flush_calls()
            calls_before = dict(stack.calls)
            fingerprint = self._last_fingerprint  # the one the key was made from, just before
            if fingerprint is None:  # the subtree as it is now, unchanged since it was keyed
                fingerprint = []
                _fingerprint(module, [], fingerprint, set(), lazy)
            try:
                containers: Optional[List[Any]] = self._containers(order)
            except Unkeyable:  # a state the key cannot hold (objects nested deeper than it goes): never booked again
                containers = None
            entry = _Entry()
            self._entries.setdefault(key, []).append(entry)
            read_from = len(log)
            drawn = random_states() if self._watch_random else None
            # the arguments' versions: a write into one (or a view of it) during the call moves them
            checked, versions = recorder.indices_checked, [version_of(t) for t in tensors]
            swapped = self._swap_in(order)
            try:
                if watch is not None:
                    self._watch(watch, order)
                self._log = log
                out = forward(*args, **kwargs)
            except BaseException as exc:
                if watch is not None and any(p.seen for _, p in watch.proxies):
                    # the forward may catch this and go on another way than a real int would
                    # take it: the tracer runs the count again without stand-ins (``refused``)
                    self.refused = True
                    raise IndexRefused(f"a layer index stand-in was refused in {type(module).__name__}") from exc
                raise
            finally:
                self._log = None
                self._swap_out(swapped)
                if watch is not None:
                    self._unwatch(watch, order)
            if watch is None and self._cache_events != events:
                return out  # a cache changed inside it (replayed there, or a first call): not booked again
            if self._globals_key(order, key[0]) != key[-1]:
                return out  # it wrote a global its forwards name (a counter, a flag): traced from now on
            if drawn is not None and not same_random_states(drawn, random_states()):
                return out  # it drew from Python's or numpy's generator (LayerDrop): a next call may branch otherwise
            if self._grads_changed(order) != changed:
                return out  # it froze (or unfroze) a tensor of its subtree: a replay would leave it as it was
            if recorder.indices_checked != checked:
                # booked again only for arguments of these values (read now: none was written since)
                # (an inference tensor keeps no version: never booked again)
                unwritten = None not in versions and [version_of(t) for t in tensors] == versions
                entry.indexed = _digest(self._argument_values(tensors)) if unwritten else (object(),)
            self._finish(entry, module, order, tensors, out, before, start, calls_before, fingerprint, containers,
                         log, read_from, watch)
            return out
        finally:
            self._log = outer

    def _finish(
        self,
        entry: _Entry,
        module: nn.Module,
        order: List[nn.Module],
        tensors: List[Any],
        out: Any,
        before: Tuple[Any, ...],
        start: int,
        calls_before: Dict[str, int],
        fingerprint: List[Any],
        containers: Optional[List[Any]],
        log: List[Tuple[Any, str]],
        read_from: int,
        watch: Optional[_Watch] = None,
    ) -> None:
        """Makes ``entry`` clean when the first call can be booked again exactly."""
        recorder, stack, cache = self._recorder, self._modules, self._cache
        after = (len(recorder.assumptions), recorder.conds, len(cache.disabled) if cache is not None else 0)
        if after != before or containers is None:
            return
        try:
            again: List[Any] = []
            _fingerprint(module, [], again, set(), self._lazy)
            if again != fingerprint or self._containers(order) != containers:
                return  # the call changed its own subtree's state (a counter, a new attribute)
            slots, made = self._effects(watch, tensors) if watch is not None else (None, [])
            # the outputs' metadata read below the run's torch-function modes (one pass, not one per read:
            # ~30 us of a ResNet-50 bottleneck's first call)
            entry.outputs = outside_modes(self._describe, _outputs_of(out), out, tensors, {id(t) for t in made})
            reads = self._reads(order, log, read_from)
            if watch is not None:  # a stand-in's index was not used but to index the cache: not keyed
                proxied = {i for i, _ in watch.proxies}
                reads = tuple([r for r in reads if r[0] not in proxied or r[1] != INDEX_ATTRIBUTE])
            values = self._read_values(order, reads)
        except Unkeyable:
            return
        names = self._names
        by_name: Dict[str, int] = {}
        for i, m in enumerate(order):
            by_name.setdefault(names.get(m, "\0"), i)
        own = names.get(module)
        depth = len(stack.path)
        events = list(expand(recorder.events[start:]))  # calls booked from earlier ones inside it: their ops
        for event in events:
            inner = event.module_stack[depth:]
            if event.phase != "forward" or event.module_stack[:depth] != stack.path:
                return
            if any(name not in by_name for name in inner):
                return  # an op booked to a module outside the subtree
        calls: List[Tuple[int, int]] = []
        self._flush_calls()  # replays inside this call
        for name, n in stack.calls.items():
            extra = n - calls_before.get(name, 0)
            if extra and name != own:
                if name not in by_name:
                    return
                calls.append((by_name[name], extra))
        inners: Dict[Tuple[str, ...], int] = {}
        compact: List[Tuple[Any, int, Any]] = []
        for event in events:
            inner = event.module_stack[depth:]
            k = inners.get(inner)
            if k is None:
                k = inners[inner] = len(inners)
            compact.append((event.call, k, event.phase))
        entry.inners = [tuple([by_name[name] for name in inner]) for inner in inners]
        entry.compact = tuple(compact)
        entry.calls = calls
        entry.reads, entry.values = reads, values
        entry.slots = slots
        entry.clean = True

    # ------------------------------------------------------------------ KV caches

    def _watch(self, watch: _Watch, order: List[nn.Module]) -> None:
        """Before a first call given caches: stand-ins for the subtree's layer indices, a
        recording list for each cache's slots, and what every slot holds."""
        states = self._states
        self._cache_active = True
        self._cache_events += 1
        if self._index_proxies:
            for i, m in enumerate(order):
                if self._own_class(type(m)) is not None:
                    state = vars(m)
                    index = state.get(INDEX_ATTRIBUTE)
                    if type(index) is int:
                        proxy = LayerIndex(index)
                        state[INDEX_ATTRIBUTE] = proxy
                        watch.proxies.append((i, proxy))
        for cache in watch.caches:
            state = vars(cache)
            layers = state["layers"]
            slots: List[Tuple[Any, Optional[Dict[str, Any]], Any]] = []
            for layer in layers:
                try:
                    held = dict(vars(layer))
                except TypeError:
                    slots.append((layer, None, None))
                    continue
                try:
                    described: Any = states.slot(layer)
                except Unkeyable:
                    described = None  # never booked again if indexed (``_effects``): no tensor descriptions needed
                else:
                    # each tensor's description, read once: the slot's (``("tensor",) + States.tensor``)
                    for name, part in described[1]:
                        if part[0] == "tensor" and type(held[name]) is states.fake_type:
                            held["\0" + name] = part[1:]
                slots.append((layer, held, described))
            watch.slots.append(slots)
            own = self._owns.get(id(cache))  # read when the call was keyed, just before (``_cache_key``)
            watch.owns.append((dict(state), own[1] if own is not None and own[0] is cache else states.own(cache)))
            recording = SlotList(layers)
            state["layers"] = recording
            watch.lists.append((layers, recording))

    def _unwatch(self, watch: _Watch, order: List[nn.Module]) -> None:
        """After it: the layer indices and the caches' own lists back (with what the call did
        to the recording list, which makes the call not reusable)."""
        self._cache_active = False
        for i, proxy in watch.proxies:
            state = vars(order[i])
            if state.get(INDEX_ATTRIBUTE) is proxy:
                state[INDEX_ATTRIBUTE] = proxy.value
            else:
                watch.dirty = True
        for cache, (layers, recording) in zip(watch.caches, watch.lists):
            state = vars(cache)
            if state.get("layers") is recording:
                state["layers"] = layers
            else:
                watch.dirty = True
            now = list.__getitem__(recording, slice(None))
            if len(now) != len(layers) or any(a is not b for a, b in zip(now, layers)):
                layers[:] = now
                watch.dirty = True

    def _effects(self, watch: _Watch, tensors: List[Any]) -> Tuple[Any, List[Any]]:
        """What a first call given caches indexed and left there (raises :class:`Unkeyable`
        when it cannot be booked again): see ``_Entry.slots``; and the tensors it made."""
        if watch.dirty or any(p.seen for _, p in watch.proxies):
            raise Unkeyable("a layer index used, or a cache's list changed")
        owner = {id(p): i for i, p in watch.proxies}
        accesses: List[Tuple[Any, ...]] = []
        where: List[Tuple[int, int]] = []
        for ci, (_, recording) in enumerate(watch.lists):
            for access in recording.accesses:
                if access[0] == "rel":
                    m = owner.get(id(access[1]))
                    if m is None:
                        raise Unkeyable("an index of another call")
                    accesses.append(("rel", ci, m))
                    where.append((ci, access[1].value))
                elif access[0] == "abs":
                    accesses.append(("abs", ci, access[1]))
                    where.append((ci, access[1]))
                else:
                    raise Unkeyable("the cache's slots read as a whole")
        unique: Dict[Tuple[Any, ...], Tuple[int, int]] = {}
        for access, w in zip(accesses, where):  # an access repeated (update, then a read) once
            unique.setdefault(access, w)
        accesses, where = list(unique), list(unique.values())
        distinct = list(dict.fromkeys(where))
        states = self._states
        befores: List[Any] = []
        afters: List[Any] = []
        made: List[Any] = []
        for ci, cache in enumerate(watch.caches):
            held_then, own_then = watch.owns[ci]
            state = vars(cache)
            if len(state) != len(held_then) or any(held_then.get(k, _MISSING) is not v for k, v in state.items()):
                raise Unkeyable("the cache's own attributes changed")
            if states.own(cache) != own_then:
                raise Unkeyable("the cache's own attributes changed")
            for s, (layer, held, _described) in enumerate(watch.slots[ci]):
                if (ci, s) in distinct:
                    continue
                if held is None:
                    continue  # not described, not indexed: still the same object (checked above)
                now = vars(layer)
                if sum(1 for k in held if not k.startswith("\0")) != len(now) or any(
                    held.get(k, _MISSING) is not v for k, v in now.items()
                ):
                    raise Unkeyable("a slot not indexed changed")
        for ci, s in distinct:
            layer, held, described = watch.slots[ci][s]
            if described is None or held is None:
                raise Unkeyable("a slot the key cannot describe")
            befores.append(described)
            afters.append(states.after(held, layer, tensors, made))
        return (tuple(accesses), _pattern(where), tuple(befores), tuple(afters)), made

    def _apply(self, slots: List[Tuple[int, int]], afters: Tuple[Any, ...], caches: List[Any], tensors: List[Any]) -> None:
        """Writes a first call's effect on its slots into the slots a reused call indexes."""
        made: List[Any] = []
        for (ci, s), after in zip(slots, afters):
            layer = vars(caches[ci])["layers"][s]
            state = vars(layer)
            new: Dict[str, Any] = {}
            for name, described in after[1]:
                tag = described[0]
                if tag == "kept":
                    new[name] = state[name]
                elif tag == "value":
                    new[name] = described[1]
                elif tag == "arg":
                    new[name] = tensors[described[1]]
                elif tag == "made":
                    new[name] = made[described[1]]
                else:
                    made.append(self._make_state(described))
                    new[name] = made[-1]
            _overwrite(state, new)

    def _make_state(self, described: Tuple[Any, ...]) -> Any:
        if described[0] == "new":
            return self._make(described, [])
        _, numel, shape, stride, offset, dtype, device = described
        with torch._C._DisableTorchDispatch():
            base = self._fake_type(self._mode, torch.empty(numel, dtype=dtype, device=self._meta), device)
        recorder = self._recorder
        recorder.muted += 1  # a view as the first call's was (its base's size, strides, offset): not an op of the model
        try:
            return base.as_strided(shape, stride, offset)
        finally:
            recorder.muted -= 1

    def _reads(self, order: List[nn.Module], log: List[Tuple[Any, str]], start: int) -> Tuple[Tuple[int, str], ...]:
        """The plain attributes of tracked subtree modules the call read (from ``log[start:]``);
        an untracked module's attributes are all in the key already."""
        position = {id(m): i for i, m in enumerate(order) if self._own_class(type(m)) is not None}
        reads = set()
        for obj, name in log[start:]:
            i = position.get(id(obj))
            if i is None or name in _SKIP or (name.startswith("__") and name != "__dict__"):
                continue
            reads.add((i, "*" if name == "__dict__" else name))
        return tuple(sorted(reads))

    def _argument_values(self, tensors: List[Any]) -> List[Optional[torch.Tensor]]:
        """The known value of each tensor argument of a call, as the index checks read it
        (``recorder.indices``; None where not known)."""
        known = self._recorder.indices
        return [known(tensor) for tensor in tensors]

    def _replay(
        self,
        entry: _Entry,
        order: List[nn.Module],
        tensors: List[Any],
        log: Optional[List[Tuple[Any, str]]],
        caches: List[Any],
        slots: Optional[List[Tuple[int, int]]],
    ) -> Any:
        recorder, stack, names = self._recorder, self._modules, self._names
        self.reused += 1
        if entry.indexed is not None:
            recorder.indices_checked += 1  # its checks hold for these values: an enclosing first call keys them too
        if entry.slots is not None and slots is not None:
            self._cache_events += 1
            # the slots' new fakes made below the run's torch-function modes, as the outputs below
            outside_modes(self._apply, tensors, slots, entry.slots[3], caches, tensors)
        if log is not None and entry.reads:  # an enclosing first call read these too
            log.extend((order[i], name if name != "*" else "__dict__") for i, name in entry.reads)
        originals = self._originals  # a module not copied (booked, never run): the caller's one's name
        new_names = tuple([names[m] if m in names else originals.get(m, "") for m in order])
        prefix = stack.path
        # the events as one record: the first call's ops under this call's stacks, each distinct
        # inner stack (13 in a LLaMA layer's 54 events) made from these names when read (the ledger
        # books the record as a group)
        recorder.events.append(ReplayedCall(entry.compact, _Paths(prefix, new_names, entry.inners), prefix))
        if entry.calls:
            marks, replayed = self._marks, self._replayed
            at = len(stack.calls)
            if not marks or marks[-2] != at:
                marks.extend((at, len(replayed)))
            replayed += (new_names, entry.calls)
        # the outputs made below the run's torch-function modes (one pass, not one per fake made)
        return outside_modes(self._make, tensors, entry.outputs, tensors)

    def _flush_calls(self, final: bool = False) -> None:
        """Add the replays' module calls to the stack's counts, each name where its first call
        puts it (``ModuleStack.calls`` is in order of first call): the counts as a count that
        added them at each replay has them. ``final``: the stack's hooks are off, its dictionary is
        replaced (not refilled: one full dictionary alive, not two)."""
        marks, replayed = self._marks, self._replayed
        if not marks:
            return
        calls = self._modules.calls
        merged: Dict[str, int] = {}
        get = merged.get
        bounds = [*marks[1::2], len(replayed)]  # where each run starts, and the end

        def add(run: int) -> None:
            for j in range(bounds[run], bounds[run + 1], 2):
                names = replayed[j]
                for i, n in replayed[j + 1]:
                    merged[names[i]] = get(names[i], 0) + n

        run, runs = 0, len(marks) // 2
        for position, (name, n) in enumerate(calls.items()):
            while run < runs and marks[2 * run] == position:  # replays made when ``position`` names were in
                add(run)
                run += 1
            merged[name] = get(name, 0) + n
        while run < runs:  # replays after the last first call
            add(run)
            run += 1
        if final:
            self._modules.calls = merged
        else:  # the stack's hooks hold its dictionary
            calls.clear()
            calls.update(merged)
        del marks[:]
        replayed.clear()

    # ------------------------------------------------------------------ keys

    def _structure(self, wrapped: _Call, order: List[nn.Module]) -> Any:
        """:meth:`_subtree` of the wrapped module, remembered per module while no attribute of
        its subtree is rebound (a fingerprint of the objects each module's attributes hold)."""
        module = wrapped.module
        if not wrapped.keyed:
            # its first key (most modules run once per count): no fingerprint to remember it by;
            # a first call makes its own (``_first``)
            wrapped.keyed = True
            self._last_fingerprint = None
            return self._subtree(module, order)
        fingerprint: List[Any] = []
        _fingerprint(module, order, fingerprint, set(), self._lazy)
        self._last_fingerprint = fingerprint
        found = self._structures.get(id(module))
        if found is not None and found[0] == fingerprint:
            return found[1]
        key = self._subtree(module, [])
        self._structures[id(module)] = (fingerprint, key)  # called again (a block in a loop): remembered
        return key

    def _subtree(self, module: nn.Module, order: List[nn.Module], seen: Optional[Dict[int, int]] = None) -> Any:
        """The structural key of ``module`` and its descendants; ``order`` gets them in visit order.
        Of a lazy copy, a module not copied yet is keyed from the caller's module, as its copy
        would be (``_own_part(original=True)``), and stays the caller's in ``order`` (nothing is copied for a
        call that is booked, not run); one that cannot be keyed so is copied here."""
        lazy = self._lazy
        if lazy is not None:
            module = lazy.live(module)
        if seen is None:
            seen = {id(m): i for i, m in enumerate(order)}
        if id(module) in seen:
            return ("same", seen[id(module)])
        state = vars(module)
        forward = state.get("forward")
        if forward is not None and not getattr(forward, "__flopcount_reuse__", False):
            raise Unkeyable("an instance-level forward")
        if hooks.has_call_hooks(module):
            raise Unkeyable("a hook")
        if not _plain(state):
            raise Unkeyable("a scripted module")  # its forward is TorchScript's: not followed here
        own: Optional[int] = None
        if lazy is not None and module in self._originals:
            try:
                own = self._own_part(module, state, original=True)
            except _NeedsCopy:
                module = lazy.copy_of(module)
                state = vars(module)
        seen[id(module)] = len(order)
        order.append(module)
        if own is None:
            own = self._own_part(module, state)
        children = raw_children(state["_modules"])
        made = (
            own,
            tuple([(k, None if m is None else self._subtree(m, order, seen)) for k, m in dict.items(children)]),
        )
        return self._interned.setdefault(made, len(self._interned))

    def _tied(self, key: Any, raw: List[Any], reals: List[Any]) -> Any:
        """``key`` (a subtree's, :meth:`_subtree`), with which of its modules' parameters and buffers
        are one tensor where some are (``b.weight = a.weight``: each tensor's first position in the
        subtree order), since a forward may branch on ``a.weight is b.weight``. ``raw``: the subtree's
        tensors as its dictionaries hold them (:func:`_tensors_of`); ``reals``: the caller's tensor for
        each :class:`~flopcount.tracers.fake.copies.Pending` of a lazy copy (one per tensor of the
        caller's), else as ``raw``. On every keyed call, in C where no fake is among them. Before
        branch ``exact3``, the key held each tensor's metadata only: blocks 1 and 3 tied (before the
        count, or by their parent in its forward) were booked from block 0."""
        lazy = self._lazy
        if lazy is None or self._fake_type not in set(map(type, reals)):
            ids = list(map(id, reals))  # a lazy copy's caller's tensors and Pendings, or an eager copy's fakes
        else:  # a fake a parent assigned beside a Pending (``b.weight = a.weight``): each to its tensor of the caller's
            ids = lazy.identities(raw)
        if len(set(ids)) == len(ids):
            return key
        return (key, ("ties", _pattern(ids)))

    def _grads_changed(self, order: List[nn.Module]) -> Tuple[Tuple[int, bool], ...]:
        """:func:`_changed` of the subtree now (a first call's, after it ran)."""
        reals = _tensors_of(order)
        if self._lazy is not None:
            reals = [t.real if type(t) is Pending else t for t in reals]
        held, keyed = self._held_fakes(order, reals)
        if not held[0]:
            return ()
        grads = _fake_keys([], held[0])[1]
        return _changed(grads, keyed, held[1]) if grads != keyed else ()

    def _held_fakes(self, order: List[nn.Module], reals: List[Any]) -> Tuple[Tuple[List[Any], List[int]], Tuple[bool, ...]]:
        """The fakes made so far of the subtree's parameters and buffers, in subtree order, and the
        ``requires_grad`` the subtree's key holds for each (its fake's key as first read, a
        :class:`~flopcount.tracers.fake.copies.Pending`'s key read from the caller's tensor). The
        keys are read once per count, so a parent freezing a block's weights in its forward
        (``p.requires_grad_(False)`` on the copy's fakes) between two blocks left the later block's
        key as it was before branch ``exact3`` (booked from the first, whose forward branched on
        it). A tensor with no fake yet is as its key says: only the forward changes a fake. One pass
        over the subtree's tensors (~0.1 us each); their flags are read with the arguments' metadata.
        ``reals``: as :meth:`_tied`'s. Returns (the fakes, their positions among the subtree's
        tensors), the flags keyed."""
        lazy = self._lazy
        made = lazy.fakes_made() if lazy is not None else _NO_KEYS
        originals = self._originals
        if lazy is not None and not any(map(made.__contains__, map(id, reals))) and self._fake_type not in set(
            map(type, reals)
        ):
            return _NONE_HELD  # none faked (a block booked from an earlier one): in C
        tensor = self._tensor
        fakes: List[Any] = []
        where: List[int] = []
        keyed: List[bool] = []
        position = -1
        for module in order:  # as :func:`_tensors_of` gives them
            original = module in originals
            for which in ("_parameters", "_buffers"):
                for t in dict.values(raw_tensors(_STATE(module)[which])):
                    if t is None:
                        continue
                    position += 1
                    if type(t) is Pending:
                        fake = made.get(id(t.real))
                        if fake is not None:
                            fakes.append(fake)
                            where.append(position)
                            keyed.append(t.key[5])
                    elif original:  # a caller's tensor, keyed as its copy's (``_original_tensors``)
                        fake = made.get(id(t))
                        if fake is not None and lazy is not None:
                            key = lazy.tensor_keys([t])[0]
                            fakes.append(fake)
                            where.append(position)
                            keyed.append(key[5] if type(key) is tuple else tensor(key)[5])
                    else:
                        fakes.append(t)
                        where.append(position)
                        keyed.append(tensor(t)[5])
        return (fakes, where), tuple(keyed)

    def _own_part(self, module: nn.Module, state: Dict[str, Any], original: bool = False) -> int:
        """The key of ``module`` without its children: its class, its parameters' and
        buffers' metadata, and (untracked modules) its plain attributes; one object for equal
        parts (the 80 layers of a model share theirs: keys compare by identity first).
        ``original``: ``module`` is a module of the caller's not copied yet, and this is the part its
        copy will have, read from it: each tensor by the key its fake will have, each object by its
        copy's identity where it is copied already; :class:`_NeedsCopy` where that cannot be said
        without copying (a tensor faked another way than from its metadata)."""
        tensors = self._original_tensors if original else self._tensors_part
        own = self._own_class(type(module))
        if own is not None:
            # a tracked module: torch's structure only (its plain attributes are keyed when read),
            # looked up by name rather than found among its thirty-odd attributes
            part: Tuple[Any, ...] = (
                own,
                state.get("training", _MISSING),
                tensors(state.get("_parameters")),
                tensors(state.get("_buffers")),
                tuple([self._attribute(state[k], original) if k in state else _MISSING for k in _FLAGS]),
            )
            return self._interned.setdefault(part, len(self._interned))
        parts: List[Any] = [type(module)]
        for name, value in state.items():
            if name == "_modules":
                continue  # children: keyed by the caller
            if name in _OWN:
                if not value or name in hooks.call_hook_names() or name == "forward":
                    continue  # empty hook and state-dict dictionaries; hooks refused above
            if name in ("_parameters", "_buffers"):
                parts.append((name, tensors(value)))
            else:
                parts.append((name, self._attribute(value, original)))
        made = tuple(parts)
        return self._interned.setdefault(made, len(self._interned))

    def _tensors_part(self, tensors: Any) -> Tuple[Any, ...]:
        """A parameter or buffer dictionary's key: raw values (a parameter not faked yet is
        keyed by its Pending's key, not faked here)."""
        if not tensors:
            return () if tensors is not None else _MISSING
        return tuple([(k, None if t is None else t.key if type(t) is Pending else self._tensor(t)) for k, t in dict.items(tensors)])

    def _original_tensors(self, tensors: Any) -> Tuple[Any, ...]:
        """:meth:`_tensors_part` of the copy of a caller's parameter or buffer dictionary."""
        if not tensors:
            return () if tensors is not None else _MISSING
        lazy = self._lazy
        assert lazy is not None
        keys = iter(lazy.tensor_keys([t for t in dict.values(tensors) if t is not None], self._found))  # read before the run
        found: List[Any] = []
        for k, t in dict.items(tensors):
            if t is None:
                found.append((k, None))
                continue
            key = next(keys)
            if key is None:
                raise _NeedsCopy()
            found.append((k, key if type(key) is tuple else self._tensor(key)))
        return tuple(found)

    def _attribute(self, value: Any, original: bool = False) -> Any:
        """An attribute's key. ``original``: the attribute of a module of the caller's not copied
        yet, keyed as its copy will hold it (:class:`_NeedsCopy` for a tensor: faked when copied,
        its fake's metadata is not known before)."""
        kind = type(value)
        if kind in _SCALARS:
            if kind in _SELF_KEYED:
                return value
            return (kind, value) if kind is not float or value == value else ("nan",)
        if original:
            lazy = self._lazy
            copied = lazy.copied(value) if lazy is not None else None
            if copied is not None:
                return self._attribute(copied)
            if isinstance(value, torch.Tensor):
                raise _NeedsCopy()
        elif kind is LayerIndex:  # read while a stand-in is in place: the index it stands for
            return value.value
        elif isinstance(value, torch.Tensor):
            return self._tensor(value)
        if kind is ClosureValues:  # a function's closure variables: by identity, and what is not a scalar by content
            return ("closure", _Identical(value), tuple([self._attribute(v, original) for v in value
                                                         if type(v) not in _SCALARS]))
        if kind is tuple or kind is list or isinstance(value, (dict, set, frozenset)):
            if len(value) > _LONG:
                return self._long(value, original)
            return self._contents(value, original)
        if isinstance(value, (tuple, list)):  # a namedtuple, a list's subclass: its items and its own attributes
            return self._subclassed(value, original)
        if isinstance(value, nn.Module):  # not a child: the same object, or not equal, and its plain state
            return self._outside(value, original)
        if kind is functools.partial:  # one per module (transformers' GELU): equal when its parts are
            return (kind, id(value.func), self._attribute(value.args, original), self._attribute(value.keywords, original))
        special = _special_of(id(kind))  # one lookup per class, in C
        if special is None:
            special = _SPECIAL.fill(kind)
        if special is _GENERATOR:  # its state is in C: a draw or a reseed changes it
            return ("generator", id(value), generator_state(value))
        if plain_object(value):
            # a config or a holder (one the layers share: its flag set by their parent per layer)
            return self._held(value, original)
        if special is _SEQUENCE:  # a deque, a bytearray, an array: by content, as a list
            return (kind, getattr(value, "maxlen", None), self._contents(list(value), original))
        if special is _WEAKREF:  # what it refers to, keyed as an attribute is (None once it is gone)
            return ("weakref", self._attribute(value(), original))
        if special is _NDARRAY:  # by content: a parent may write it in place
            if value.dtype.hasobject:
                return (kind, value.shape, self._contents(value.ravel().tolist(), original))
            return (kind, str(value.dtype), value.shape, value.tobytes())
        if special is _ITERATOR:  # ``itertools.count()``: a ``next`` in a call changes what it gives
            raise Unkeyable("an iterator")
        # functions, classes and other objects (of a module not copied yet: an object not copied
        # yet, not equal to any copy's: a call keyed so is traced, never wrongly booked)
        return ("id", id(value))

    def _contents(self, value: Any, original: bool) -> Any:
        """A tuple, list, dict or set's key, by content: each item keyed as an attribute is."""
        kind = type(value)
        if kind is tuple or kind is list:
            if all(type(v) in _TUPLE_ITEMS for v in value):  # a convolution's stride, padding...: keyed as itself
                return (kind, value if kind is tuple else tuple(value))
            return (kind, tuple([self._attribute(v, original) for v in value]))
        if isinstance(value, dict):
            return (kind, tuple([(k, self._attribute(v, original)) for k, v in value.items()]))
        if all(type(v) in _SCALARS for v in value):
            return (kind, frozenset((type(v), v) for v in value))
        return (kind, frozenset([self._attribute(v, original) for v in value]))

    def _held(self, value: Any, original: bool) -> Any:
        """A plain object's key: its identity, its own attributes as :class:`_Held`, and each of them
        that is not a scalar keyed as an attribute is (a holder's list by content, a config's
        sub-config as a plain object, a function by identity): ~1-2 % of a transformers model's count,
        where keying the containers found by :func:`plain_object` per attribute cost 3-8 %. An object
        met again below itself (a cycle) is keyed by identity there, its state being in the key
        already."""
        if id(value) in self._holding:
            return ("object", id(value))
        state = object_state(value)
        return ("object", id(value), _Held(state, self._inside(value, state, original, True)))

    def _outside(self, module: nn.Module, original: bool) -> Any:
        """A module held as a plain attribute, not a child (a parent kept in a list, a shared module
        set with ``object.__setattr__``): its identity, training flag and plain attributes, keyed as
        :meth:`_held` keys an object's (its parameters, buffers and children are not: by identity of
        their dictionaries). Before branch ``advreuse2``, its identity only: a flag the parent set on
        itself between two blocks that read it through such a reference was not seen."""
        if id(module) in self._holding:
            return ("module", id(module))
        return ("module", id(module), self._inside(module, vars(module), original, False))

    def _inside(self, value: Any, state: Dict[str, Any], original: bool, objects: bool) -> Tuple[Any, ...]:
        """The keys of ``value``'s attributes ``state`` (``objects``: a plain object's, its scalars left
        to :class:`_Held`; else a module's, torch's own names left out), each keyed as an attribute is,
        while ``value`` is marked as being keyed (met again below itself, a cycle, its caller keys it by
        identity there); :class:`Unkeyable` more than :data:`_HELD_DEPTH` deep (a linked list of
        objects: traced, not keyed without end). The guard :meth:`_held` and :meth:`_outside` share;
        one comprehension each, so that neither pays the other's filter per attribute."""
        holding = self._holding
        if len(holding) >= _HELD_DEPTH:
            raise Unkeyable(f"plain objects nested more than {_HELD_DEPTH} deep")
        holding.add(id(value))
        attribute = self._attribute
        try:
            if objects:
                return tuple([(k, attribute(v, original)) for k, v in state.items() if type(v) not in _SCALARS])
            return tuple([(k, attribute(v, original)) for k, v in state.items() if k not in _SKIP])
        finally:
            holding.discard(id(value))

    def _subclassed(self, value: Any, original: bool) -> Any:
        """The key of a tuple's or list's subclass (a namedtuple, a user's list type): its type, the
        items it stores (read through the base type's own iteration, keyed by content on every call:
        no memo holds a copy made per call) and its own attributes if it has any. Before, such a
        value was keyed as a plain object (its ``__dict__`` only) or by identity, so a list subclass
        or a namedtuple's list changed between two blocks had the later blocks booked from the first."""
        base = tuple if isinstance(value, tuple) else list
        items = self._contents(base(base.__iter__(value)), original)
        try:
            own = vars(value)
        except TypeError:  # no __dict__ (a namedtuple's empty slots)
            return ("subclass", type(value), items)
        return ("subclass", type(value), items, self._attribute(own, original))

    def _long(self, value: Any, original: bool) -> Any:
        """The key of a container of more than :data:`_LONG` items (a user's global list of 100,000
        floats, a dict of tensors): its key by content (:meth:`_contents`), made once per count and
        given again, as one number, while the container holds the same objects in the same order
        (compared by identity in C: no item is keyed again) when each item's key is fixed by its
        identity (:func:`_fixed`: scalars, tensors, tuples of those); a tuple or frozenset of such items
        cannot change, so it is not compared at all. A container with other items (lists, objects)
        is keyed by content each time. Before, a dict or set of more than 64 items was keyed by
        identity: a parent adding an entry between two blocks that read its length was not seen."""
        found = self._long_keys.get(id(value))
        if found is not None and found[0] is value and found[2] in (None, original):
            snapshot = found[1]
            if snapshot is None or _same_items(value, snapshot):
                return found[3]
        key = self._contents(value, original)
        items = _items(value)
        tensors = _fixed(items)
        if tensors is None:
            return key  # an item whose key can change without its identity changing: no memo
        number = ("contents", self._long_contents.setdefault(key, len(self._long_contents)))
        # a tuple or frozenset of fixed items cannot change; the memo holds it, so its id is not reused.
        # Tensors are keyed as the copy will hold them where ``original``: the memo serves that side only
        snapshot = None if type(value) in (tuple, frozenset) else items
        self._long_keys[id(value)] = (value, snapshot, original if tensors else None, number)
        return number

    def _object(self, value: Any) -> Tuple[Any, ...]:
        """A plain object's state for a first call's writes (``_containers``): its identity and its
        own attributes, each keyed as an attribute is (by content: a list it holds appended to; a
        plain object among them as :meth:`_held` keys it)."""
        return ("object", id(value), tuple([(k, self._attribute(v)) for k, v in object_state(value).items()]))

    def _value(self, value: Any, tensors: List[Any], caches: List[Any]) -> Any:
        kind = type(value)
        if kind in _SCALARS:
            return (kind, value)
        if kind is self._fake_type:
            if value.fake_mode is not self._mode or value.constant is not None:
                raise Unkeyable("a tensor of another kind")
            for i, seen in enumerate(tensors):
                if seen is value:
                    return ("same", i)
            tensors.append(value)
            return _TENSOR  # its metadata: the key's part read by _fake_keys, in this order
        if kind is tuple or kind is list:
            return (kind, tuple([self._value(v, tensors, caches) for v in value]))
        if kind is dict:
            return (kind, tuple([(k, self._value(v, tensors, caches)) for k, v in value.items()]))
        known = cache_type()
        if known is not None and isinstance(value, known):
            return self._cache_key(value, caches)
        raise Unkeyable(f"an argument of type {kind.__name__}")

    def _cache_key(self, cache: Any, caches: List[Any]) -> Any:
        """A KV cache argument: its class, own attributes and number of slots (the slots a
        call indexes are compared when an entry is matched, ``_slots_now``)."""
        if self._cache_active:
            raise Unkeyable("a cache given inside a first call that watches it")
        for i, seen in enumerate(caches):
            if seen is cache:
                return ("same cache", i)
        layers = vars(cache).get("layers")
        if type(layers) is not list:
            raise Unkeyable("a cache without a list of slots")
        caches.append(cache)
        own = self._states.own(cache)
        self._owns[id(cache)] = (cache, own)  # a first call's watch starts from it (``_watch``)
        return ("cache", own, len(layers))

    def _containers(self, order: List[nn.Module]) -> List[Any]:
        """The contents of the subtree's mutable attribute containers (lists, dicts, sets
        other than torch's own), which a call may change without rebinding them, and the own
        attributes of the plain objects the subtree holds (a config, a counter's holder: keyed by
        identity, so a call writing ``self.config.step`` would otherwise leave its key as it was),
        each keyed as an attribute is (a plain object among them with the objects it holds, up to
        16 deep: a first call appending to ``self.config.sub.items`` is seen)."""
        found: List[Any] = []
        held = self._held_calls
        for module in order:
            state = vars(module)
            known = held.get(id(module))
            if known is None or known[0] != len(state):
                # which attributes hold a container or a plain object, per module while its attribute
                # count stays (a rebinding changes the fingerprint, which is compared too)
                # a scalar or a tuple is none of these (its type says so, in C: the checks below
                # raise and catch an error per int, ~1 us; most of a layer's attributes are such)
                names = tuple([k for k, v in state.items() if k not in _SKIP and type(v) not in _UNHELD
                               and (_container(v) or plain_object(v) or random_generator(v))])
                known = held[id(module)] = (len(state), names)
            for name in known[1]:
                value = state.get(name)
                if _container(value) or random_generator(value):  # a generator: a draw changes its state
                    found.append((name, self._attribute(value)))
                elif plain_object(value):
                    found.append((name, self._object(value)))
        return found

    def _globals_key(self, order: List[nn.Module], structure: Any = None) -> Tuple[Any, ...]:
        """The Python data bound to the globals the subtree's forwards name
        (:func:`~flopcount.core.state.forward_globals`), each keyed as an attribute is."""
        rebound = self._rebound(order, structure)  # first: a class rebound has its code's globals read again
        found = tuple([(name, self._attribute(value)) for _, name, value in forward_globals(order)])
        return found if not rebound else (*found, ("code rebound", rebound))

    def _rebound(self, order: List[nn.Module], structure: Any = None) -> Tuple[Tuple[type, int], ...]:
        """The classes of ``order`` whose code (a ``forward``, a method it calls, a helper function of
        their Python module: :func:`~flopcount.core.state.code_bound`) was rebound since this count first
        saw them, each with how often: empty when none was (the key as before). A tracking class is its
        module class's (it only adds ``__getattribute__``). Compared on every keyed call, in C. Before
        branch ``exact3``, code was keyed by class only: a parent setting ``Block.forward = other``
        between two blocks had the later blocks booked from the first. ``structure``: the subtree's
        structural key (the same classes), under which its classes' places are compared as one (a
        BERT layer's ~30 places in one pass) while none is rebound."""
        if structure is not None:
            known_all = self._code_of.get(structure)
            if known_all is not None and still_bound(known_all[0]):
                return known_all[1]
        code, owners = self._code, self._owners
        rebound: Tuple[Tuple[type, int], ...] = ()
        seen = set()
        for module in order:
            kind = type(module)
            if kind in seen:
                continue
            seen.add(kind)
            kind = owners.get(kind, kind)
            known = code.get(kind)
            if known is None:
                known = code[kind] = (code_bound(kind), 0)
            elif not still_bound(known[0]):
                forget_code(kind)
                made = self._classes.get(kind)
                if made is not None:  # its tracking class's paths were read from the same functions
                    forget_code(made)
                known = code[kind] = (code_bound(kind), known[1] + 1)
            if known[1]:
                rebound += ((kind, known[1]),)
        if structure is not None:
            records = [code[owners.get(kind, kind)][0] for kind in seen]
            self._code_of[structure] = (
                (sum([r[0] for r in records], ()), sum([r[1] for r in records], ()), sum([r[2] for r in records], ())),
                rebound,
            )
        return rebound

    def _tensor(self, t: torch.Tensor) -> Tuple[Any, ...]:
        # a module's tensors are the fake copy's own: their metadata is read once (the shape
        # cache refuses ops that change metadata in place, and a rebinding changes the object)
        found = self._tensors.get(id(t))
        if found is not None and found[0] is t:
            return found[1]
        if t.layout != torch.strided:
            raise Unkeyable("a sparse tensor")
        meta = tensor_key(t)
        if getattr(t, "constant", None) is not None:
            # a fake made from a value (``torch.tensor(2)`` in a forward): ``int(t)`` reads its value,
            # which the metadata does not hold; keyed by identity (the memo keeps it alive)
            meta = (*meta, ("constant", id(t)))
        self._tensors[id(t)] = (t, meta)
        return meta

    # ------------------------------------------------------------------ outputs

    def _describe(self, out: Any, tensors: List[Any], made: Any = frozenset()) -> Any:
        kind = type(out)
        if kind in _SCALARS:
            return ("value", out)
        if kind is self._fake_type:
            for i, seen in enumerate(tensors):
                if seen is out:
                    return ("arg", i)
            if out.fake_mode is not self._mode or out.constant is not None or out.layout != torch.strided:
                raise Unkeyable("an output of another kind")
            if out.storage_offset() or out.requires_grad:
                raise Unkeyable("an output with an offset or a gradient")
            if id(out) in made:
                raise Unkeyable("an output held by a cache")
            return ("new", tuple(out.shape), out.stride(), out.dtype, out.fake_device)
        if kind is tuple or kind is list:
            return ("seq", kind, tuple([self._describe(o, tensors, made) for o in out]))
        raise Unkeyable(f"an output of type {kind.__name__}")

    def _make(self, described: Any, tensors: List[Any]) -> Any:
        tag = described[0]
        if tag == "value":
            return described[1]
        if tag == "arg":
            return tensors[described[1]]
        if tag == "new":
            _, shape, stride, dtype, device = described
            with torch._C._DisableTorchDispatch():
                if self._maker is not None:
                    return self._maker.make(shape, stride, dtype, device)
                meta = torch.empty_strided(shape, stride, dtype=dtype, device=self._meta)
                return self._fake_type(self._mode, meta, device)
        _, kind, items = described
        return kind(self._make(item, tensors) for item in items)


_GENERATOR, _SEQUENCE, _WEAKREF, _NDARRAY, _ITERATOR = "generator", "sequence", "weakref", "ndarray", "iterator"
_OTHER = "other"


def _special_read(kind: type) -> str:
    """How :meth:`Reuse._attribute` keys an object of class ``kind`` that is not a scalar, container,
    tensor, module or partial: a random generator by its state, a deque, bytearray or array by
    content, a weak reference by its referent, a numpy array by its bytes, an iterator not at all;
    ``_OTHER``: as a plain object or by identity. Per class."""
    if issubclass(kind, random.Random) or (kind.__name__ in ("Generator", "RandomState")
                                           and (kind.__module__ or "").startswith("numpy.random")):
        return _GENERATOR
    if kind in _SEQUENCES:
        return _SEQUENCE
    if issubclass(kind, weakref.ref) and not issubclass(kind, weakref.WeakMethod):
        return _WEAKREF
    if kind.__name__ == "ndarray" and kind.__module__ == "numpy":
        return _NDARRAY
    if hasattr(kind, "__next__"):
        return _ITERATOR
    return _OTHER


# per class, a lookup in C that keeps no class alive (an lru_cache held every class a count saw)
_SPECIAL = PerObject(_special_read)
_special_of = _SPECIAL.lookup


def _fake_keys(fakes: List[Any], held: List[Any]) -> Tuple[Tuple[Tuple[Any, ...], ...], Tuple[bool, ...]]:
    """The metadata a call's fake arguments (each once, in the order :meth:`Reuse._value` met them)
    are keyed by, and the ``requires_grad`` of ``held`` (the subtree's fakes, :meth:`Reuse._held_fakes`),
    read in one call below the run's torch-function modes (``outside_modes``: a LLaMA layer's four
    arguments were 28 passes through the vocabulary mode per replay). :class:`Unkeyable` for a
    tensor that is not strided."""
    found, grads = outside_modes(_fake_metadata, fakes + held if held else fakes, fakes, held)
    if None in found:
        raise Unkeyable("a tensor of another kind")
    return found, grads


def _fake_metadata(fakes: List[Any], held: List[Any]) -> Tuple[Tuple[Optional[Tuple[Any, ...]], ...], Tuple[bool, ...]]:
    """:func:`_fake_keys`' reads (None for a tensor that is not strided), through whatever modes are active."""
    return tuple([
        (tuple(t.shape), t.stride(), t.storage_offset(), t.dtype, t.fake_device, t.requires_grad, t._base is not None)
        if t.layout == torch.strided else None
        for t in fakes
    ]), tuple([t.requires_grad for t in held])


# a module's ``__dict__``, read past any ``__getattribute__`` (the tracking classes')
_STATE = cast(Callable[[nn.Module], Dict[str, Any]], vars(nn.Module)["__dict__"].__get__)
_NONE_HELD: Tuple[Tuple[List[Any], List[int]], Tuple[bool, ...]] = (([], []), ())


def _digest(known: List[Optional[torch.Tensor]]) -> Tuple[Any, ...]:
    """The values :meth:`Reuse._argument_values` read, as dtype, shape and bytes (any dtype:
    bfloat16 has no numpy form)."""
    digest: List[Any] = []
    with torch._C._DisableTorchDispatch():  # read below the run's fake mode (a real CPU value)
        for value in known:
            digest.append(None if value is None else (
                value.dtype, tuple(value.shape), value.reshape(-1).contiguous().view(torch.uint8).numpy().tobytes(),
            ))
    return tuple(digest)


def _tensors_of(order: List[nn.Module]) -> List[Any]:
    """The raw values of the parameter and buffer dictionaries of ``order``'s modules, in order, each
    module's parameters then its buffers (None left out); empty dictionaries (most modules') skipped.
    Each ``__dict__`` read by its descriptor, in C: a module inside a first call has its tracking
    class, whose Python ``__getattribute__`` took ~0.7 us per read (13 us per BERT layer's key)."""
    found: List[Any] = []
    for state in map(_STATE, order):
        held = state["_parameters"]
        if held:  # an unread dictionary (fake.copies.UnreadTensors) takes its entries in here
            found += dict.values(held)
        held = state["_buffers"]
        if held:
            found += dict.values(held)
    return [t for t in found if t is not None]


def _outputs_of(out: Any) -> List[Any]:
    """The tensors a call returned (itself, or the items of a tuple or list), for :func:`outside_modes`."""
    if isinstance(out, torch.Tensor):
        return [out]
    if type(out) is tuple or type(out) is list:
        return [o for o in out if isinstance(o, torch.Tensor)]
    return []


def _changed(grads: Tuple[bool, ...], keyed: Tuple[bool, ...], where: List[int]) -> Tuple[Tuple[int, bool], ...]:
    """Where (among the subtree's tensors) a fake's ``requires_grad`` is not what the key holds: (position, flag now)."""
    return tuple([(at, now) for at, now, then in zip(where, grads, keyed) if now is not then])


def _signature(
    module: nn.Module, memo: Dict[int, Any], table: Optional[Dict[Any, int]] = None, keys: Mapping[int, Any] = _NO_KEYS
) -> Any:
    """What two modules whose calls can share a key have in common: class, own parameter
    shapes and dtypes, children's signatures (coarser than the key: equal keys, equal
    signatures); with ``table``, as a number: equal signatures, one number. Built bottom-up through
    ``_modules``, once per module (``memo``); a parameter's shape and dtype from its key in ``keys``
    (id -> :func:`reuse_key`, read before the run) where it is there."""
    found = memo.get(id(module))
    if found is not None:
        return found
    if not _plain(vars(module)):
        return ("unique", id(module))  # a scripted module: never keyed (``_subtree``)
    memo[id(module)] = ("cycle", id(module))  # a module reachable from itself: its own signature
    try:
        params: Tuple[Any, ...] = tuple([
            (p.key[0], p.key[3]) if type(p) is Pending
            else (key[0], key[3]) if (key := keys.get(id(p))) is not None
            else (tuple(p.shape), p.dtype)
            for p in dict.values(raw_tensors(module._parameters)) if p is not None
        ])
    except Exception:  # a lazy parameter has no shape yet: a signature of its own
        params = (("unique", id(module)),)
    children = tuple([None if m is None else _signature(m, memo, table, keys) for m in dict.values(raw_children(module._modules))])
    # one number per distinct signature: an equal one made again is freed at once (a deep model's
    # repeated layers left as many tuples in CPython's free lists, counted by tracemalloc). A tuple
    # made and let go per module is built from a list, never from a generator or a ``map``: CPython
    # (3.11) makes a tuple from an iterator of unknown length with ``malloc`` and ``realloc``, never
    # from its free list, and puts it on the free list when freed, so each such tuple left a block
    # there until the next full collection (issue #32: ~2 KiB per 70B layer at the count's peak)
    made: Any = (type(module), params, children)
    if table is not None:
        made = table.setdefault(made, len(table))
    memo[id(module)] = made
    return made


# Structural reuse's default policy (``reuse_policy() == "auto"``): a twin group of ``calls`` blocks
# of ``modules`` modules each (the block and everything below it), ``answered`` of them leaves a traced
# call answers from an earlier call of their key (``_leaf_calls``: torch's own convolutions and batch
# norms), is keyed when
# ``calls * (_SAVED + _SAVED_PER_MODULE * (modules - answered) + _SAVED_PER_ANSWERED * answered)
# > _SPENT + _SPENT_PER_MODULE * modules + _SPENT_PER_ANSWERED * answered``, in microseconds of CPU
# time: what each call of the group saves when keyed (traced, lazily copied and faked, less a key and a
# replay) against what keying the group costs once (the first call's record beyond its forward, and a
# trace saved one time fewer than there are calls). Fitted to paired counts on this project's 2-vCPU VM
# (docs/performance.md, branch resnet11): stacks of blocks of 3, 9 and 25 modules in groups of 2, 3 and
# 6, and ResNet-50's bottlenecks (8 modules) in groups of 2, 3 and 5; a block of 3 modules pays from 6
# calls, of 4 from 4, a block of 25 from 2. An answered leaf (branch resnet14, from ResNet-50's
# bottlenecks timed per call: traced ~0.39 ms, a first call ~1.2-1.5 ms, a replay ~0.15 ms) saves less
# when its block is booked (its traced call is a key and a fresh result) and costs more in a first call
# (which runs it, its reads logged): a ResNet-50 bottleneck (6 of its 8 modules answered) pays from 5 calls.
# Since branch resnet16 a first call answers its leaves too (~1.14-1.19 ms, not ~1.39-1.45, for ResNet-50's
# first bottleneck, of which ~0.2 ms the count's first tracking classes and code reads): keying its group
# of 3 was measured and is still not faster (1.007-1.038 of this policy, paired), so the constants stay.
_SAVED = -100.0
_SAVED_PER_MODULE = 60.0
_SAVED_PER_ANSWERED = 35.0
_SPENT = 200.0
_SPENT_PER_MODULE = 85.0
_SPENT_PER_ANSWERED = 25.0


def _pays(calls: int, modules: int, answered: int = 0) -> bool:
    """Whether keying a twin group of ``calls`` calls of blocks of ``modules`` modules, ``answered`` of them
    leaves a traced call answers (:func:`_block_size`), costs less than tracing them."""
    saved = _SAVED + _SAVED_PER_MODULE * (modules - answered) + _SAVED_PER_ANSWERED * answered
    return calls * saved > _SPENT + _SPENT_PER_MODULE * modules + _SPENT_PER_ANSWERED * answered


class _Ids:
    """A fixed set of object ids as a sorted array, found by bisection: 8 B an id where a ``set``
    of them held ~50-80 B (the ``int`` object and the table's slots). :attr:`Reuse._lonely` is one:
    two ids a LLaMA layer (its attention and MLP, left unkeyed inside keyed layers), alive
    through the forward (issue #32: the count's own memory per layer)."""

    __slots__ = ("_ids",)

    def __init__(self, ids: Iterable[int]) -> None:
        self._ids = array("Q", sorted(ids))

    def __contains__(self, ident: int) -> bool:
        ids = self._ids
        at = bisect_left(ids, ident)
        return at < len(ids) and ids[at] == ident

    def __len__(self) -> int:
        return len(self._ids)


def _keyed_groups(twins: Mapping[Any, List[nn.Module]], names: Mapping[nn.Module, str]) -> set:
    """The twin groups (by signature) the default policy keys, outermost first. A group's calls
    are its members' but, for members inside members of a group keyed already, only those inside
    one of those (the rest are inside calls booked from the first: a BERT layer's attention is
    called once a count when the layers are keyed)."""
    keyed: set = set()
    inside_keyed: set[str] = set()  # names of the keyed groups' members
    groups = sorted(
        [(min([names[m].count(".") for m in members]), k, signature) for k, (signature, members) in enumerate(twins.items())
         if len(members) > 1],
        key=operator.itemgetter(0, 1),
    )
    for _, _, signature in groups:
        members = twins[signature]
        per_outer: Dict[Optional[str], int] = {}
        for member in members:
            outer = _keyed_ancestor(names[member], inside_keyed)
            per_outer[outer] = per_outer.get(outer, 0) + 1
        alone = per_outer.pop(None, 0)
        if _pays(alone + max(per_outer.values(), default=0), *_block_size(members[0])):
            keyed.add(signature)
            inside_keyed.update([names[m] for m in members])
    return keyed


def _keyed_ancestor(name: str, keyed: set[str]) -> Optional[str]:
    """The innermost module of the names in ``keyed`` that holds the module of qualified ``name``."""
    parts = name.split(".")
    for end in range(len(parts) - 1, 0, -1):
        outer = ".".join(parts[:end])
        if outer in keyed:
            return outer
    return None


def _block_size(module: nn.Module) -> Tuple[int, int]:
    """How many modules a call of ``module`` can run (itself and those below it, each once), and how
    many of them are leaves its traced call would answer from an earlier call (``answered_leaf``)."""
    seen = {id(module)}
    pending = [module]
    answered = 0
    while pending:
        children = vars(pending.pop()).get("_modules")
        for child in dict.values(raw_children(children)) if isinstance(children, dict) else ():
            if child is not None and id(child) not in seen:
                seen.add(id(child))
                pending.append(child)
                answered += answered_leaf(child)
    return len(seen), answered


def _items(value: Any) -> Tuple[Any, ...]:
    """What a container's key is made of, in its order: a dict's keys then its values."""
    if isinstance(value, dict):
        return (*value.keys(), *value.values())
    return tuple(value)


def _same_items(value: Any, items: Tuple[Any, ...]) -> bool:
    """Whether ``value`` holds the very objects ``items`` (:func:`_items`) held, in that order:
    then its key is the one made from them (each of them :func:`_fixed`). In C, item by item."""
    if isinstance(value, dict):
        n = len(value)
        return (2 * n == len(items) and all(map(operator.is_, value.keys(), items))
                and all(map(operator.is_, value.values(), items[n:])))
    return len(value) == len(items) and all(map(operator.is_, value, items))


def _fixed(items: Any) -> Optional[bool]:
    """Whether the key of each of ``items`` is fixed by its identity within a count: False where
    they are scalars (or tuples or frozensets of such), True where a tensor is among them (its key
    read once per count, :meth:`Reuse._tensor`; a module's attribute not copied yet keys no tensor),
    None otherwise (a list, a dict, an object: keyed by content each time). By their types, in C:
    a long container is mostly of one or two."""
    tensors = False
    for kind in set(map(type, items)):
        if kind in _SCALARS:
            continue
        if issubclass(kind, torch.Tensor):
            tensors = True
        elif kind is tuple or kind is frozenset:
            for item in items:
                if type(item) is kind:
                    fixed = _fixed(item)
                    if fixed is None:
                        return None
                    tensors = tensors or fixed
        else:
            return None
    return tensors


def _container(value: Any) -> bool:
    """A list, dict or set (or a deque, bytearray, array) a module holds as a plain attribute (a
    layer index stand-in is not one)."""
    return type(value) is not LayerIndex and (isinstance(value, (list, dict, set)) or type(value) in _SEQUENCES)


def _fingerprint(module: nn.Module, order: List[nn.Module], into: List[Any], seen: Any, lazy: Optional[LazyCopy] = None) -> None:
    """The subtree's modules in visit order, and the identity of every object their
    attributes (and parameter, buffer and child dictionaries) hold; of a lazy copy, a child's
    copy where it is made, the caller's child where not (raw values: nothing is copied)."""
    if lazy is not None:
        module = lazy.live(module)
    if id(module) in seen:
        into.append(("same", id(module)))
        return
    seen.add(id(module))
    order.append(module)
    state = vars(module)
    into.append(module)
    into.append((*map(id, state.values()),))
    into.append((*map(id, dict.values(raw_tensors(state["_parameters"]))),))  # raw: a Pending is not faked by a look
    into.append((*map(id, dict.values(raw_tensors(state["_buffers"]))),))
    into.append(hooks.call_hook_sizes(state))  # hooks live in dictionaries changed in place: their sizes
    for child in dict.values(raw_children(state["_modules"])):
        if child is not None:
            _fingerprint(child, order, into, seen, lazy)


def _plain(state: Dict[str, Any]) -> bool:
    """Whether a module's parameters, buffers and children are held in dictionaries (a
    ``torch.jit.script``ed module holds them in TorchScript's wrappers, which ``dict``'s own
    methods refuse: a scripted block in a stack made every count with reuse on fail)."""
    return (isinstance(state.get("_modules"), dict) and isinstance(state.get("_parameters"), dict)
            and isinstance(state.get("_buffers"), dict))


def _process_hooks_here() -> bool:
    """Whether a process-wide module hook acts in this thread: any hook but flopcount's own that
    answer another thread only (a jit trace's, in another thread, while this count runs: it
    would turn reuse off here for nothing). The hook dictionaries' flag entries are not hooks."""
    from torch.nn.modules import module as module_impl

    me = threading.get_ident()
    for name, value in vars(module_impl).items():
        if not hooks.is_hook_name(name) or not isinstance(value, dict):
            continue
        for hook in list(value.values()):
            if callable(hook) and getattr(hook, hooks.THREAD_ATTRIBUTE, me) == me:
                return True
    return False


def _pattern(where: List[Any]) -> Tuple[int, ...]:
    """Which of ``where`` are the same (slot, tensor): each item's first position."""
    first: Dict[Any, int] = {}
    return tuple([first.setdefault(w, len(first)) for w in where])


def _overwrite(state: Dict[str, Any], new: Dict[str, Any]) -> None:
    """``state`` (a cache slot's ``__dict__``) made to hold ``new``'s items in ``new``'s order.
    When its names are the first of ``new``'s, in that order (a replayed layer's slot, made as
    the first call's was: HF's ``DynamicLayer`` holds three names and gains a fourth), written in
    place: the dictionary keeps the table whose keys the class's instances share (CPython's split
    table, as the model's own forward leaves it); cleared and filled it gets a table of its own,
    120 B more a slot (issue #32's memory: a KV cache holds a slot per layer). The same items in
    the same order either way."""
    if len(state) <= len(new) and all(a == b for a, b in zip(state, new)):
        state.update(new)
    else:
        state.clear()
        state.update(new)


def _settings() -> Tuple[Any, ...]:
    """The process settings a forward's ops (or the forward itself) can read: default dtype, grad and
    inference mode, autocast; and the switches that choose an op or that a forward may branch on
    (deterministic algorithms, float32 matmul precision, which attention kernels are enabled,
    cuDNN on or off): before branch ``advreuse2`` a parent setting one between two blocks was not
    seen. Not the switches that choose a kernel inside an op (TF32, cuDNN's benchmark and
    deterministic flags): ~0.3-0.9 us each, on every keyed call."""
    return (
        *_switches(),
        torch.is_grad_enabled(),
        torch.is_autocast_enabled("cpu"),
        torch.get_autocast_dtype("cpu"),
        torch.is_autocast_enabled("cuda"),
        torch.get_autocast_dtype("cuda"),
    )


def _switches() -> Tuple[Any, ...]:
    """:func:`_settings` but grad mode and autocast: what a call keyed only where grad mode and every
    autocast are off (a leaf answered from an earlier call, ``_leaf_calls``) is keyed by (autocast's
    dtypes choose nothing while it is off: ~1.6 us less a call)."""
    backends = torch.backends
    return (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        torch.get_float32_matmul_precision(),
        backends.cuda.flash_sdp_enabled(),
        backends.cuda.mem_efficient_sdp_enabled(),
        backends.cuda.math_sdp_enabled(),
        backends.cuda.cudnn_sdp_enabled(),
        backends.cudnn.enabled,
        torch.get_default_dtype(),
        torch.is_inference_mode_enabled(),
    )
