"""A call of one of torch's own batch-norm or convolution modules answered from an earlier call of
the same key (issue #32, branch resnet13), on structural reuse's path (forward-only fake runs of a
lazy copy).

Structural reuse keys modules with children; a leaf's ops are answered by the shape cache one torch
function at a time (``Recorder.run_function``: ``F.batch_norm``, ``F.conv2d``). Around that function
a BatchNorm2d call still ran its forward in Python and made a fake for each of the four tensors it
reads: ~75 us of CPU a call in a ResNet-50 count on this project's VM (a Conv2d ~44 us), 35 calls of
each a count. Here the copy of a module of exactly one of :data:`_CLASSES`, whose forward and the
functions it calls are bound as they were when this module was imported (:func:`_intact`: a class
method or ``torch.nn.functional`` function rebound since is run as written), holds a small
``forward`` (:class:`LeafCall`) that keys the call and, for a key answered before, appends the events
that call's ops recorded (the same calls, under this call's module stack) and returns a fresh fake of
the recorded metadata: its forward does not run and its tensors are not faked.

The key is everything that forward reads: the class; every plain attribute of the module by type and
value (``training``, ``eps``, ``momentum``, ``stride``, ``padding``, ``padding_mode``, the reversed
padding list...; a float zero with its sign, since handlers see -0.0 apart; NaN never matches); each
parameter and buffer by the key its fake will have (``Pending.key``: shape, stride, dtype, device,
requires_grad) and the real tensor's type; the argument's metadata (shape, stride, offset, dtype,
device, requires_grad, inference); and the process settings structural reuse keys but grad mode and
autocast, off wherever a call is answered or kept (``_reuse._switches``: inference mode, default
dtype, cuDNN on or off, deterministic algorithms...). A
module holding anything else (a tensor faked already, whose fake the forward may have changed since;
one tensor under two names; a child; an attribute of another kind) is run. An answer is kept only
from a call that ran as ``run_function`` keeps a function's: every op known to the shape cache by
its key, none writing an argument, no placeholder, fallback, stand-in kernel, index check or
``torch.cond``, every event under the module's own stack, one fresh fake returned; so a training
BatchNorm that tracks its statistics (written in place) is never answered. Only without autograd or
autocast, outside ``make_fx`` and any muted or marked run. Answers are kept per process, like the
shape cache's results (a pure function of the key; nothing of a tensor is kept), and let go at
:data:`_MAX_ANSWERS`.

A first call of structural reuse runs its subtree's modules under tracking classes (their reads are
logged): a leaf there is answered as under its own class (``tracked``: a tracking class -> the class it
tracks), and, its forward not run, logs one read for its reads (:data:`LEAF_READ`: the first call's entry
holds :func:`leaf_attributes`, what its key held; branch resnet16). ``FLOPCOUNT_REUSE=0`` answers none.
"""

from __future__ import annotations

import math
from types import MappingProxyType
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple, cast

import torch
from torch import nn
from torch.fx.experimental.proxy_tensor import get_proxy_mode
from torch.nn import functional

from flopcount.core.rebound import torch_own
from flopcount.tracers._recorder import (
    _shared as shared_call,  # the recorder's per-key calls, as run_function keeps them
)
from flopcount.tracers._vocabulary import _autocast_on as autocast_on
from flopcount.tracers.fake.copies import Pending, UnreadTensors, outside_modes, raw_children
from flopcount.types import OpEvent

__all__ = ["ANSWERABLE", "LEAF_READ", "LeafCall", "LeafCalls", "answerable", "answered_leaf", "leaf_attributes"]


def _places(kind: type, methods: Tuple[str, ...], functions: Tuple[str, ...]) -> Tuple[Tuple[Any, str, Any], ...]:
    """(owner, name, what it held when this module was imported) for the methods of ``kind`` and the
    ``torch.nn.functional`` functions its forward calls."""
    return tuple((kind, name, getattr(kind, name)) for name in methods) + tuple(
        (functional, name, getattr(functional, name)) for name in functions
    )


#: the classes answered (exact types), each with the places its forward's code is read from
_CLASSES: Dict[type, Tuple[Tuple[Any, str, Any], ...]] = {
    nn.BatchNorm1d: _places(nn.BatchNorm1d, ("forward", "_check_input_dim"), ("batch_norm",)),
    nn.BatchNorm2d: _places(nn.BatchNorm2d, ("forward", "_check_input_dim"), ("batch_norm",)),
    nn.BatchNorm3d: _places(nn.BatchNorm3d, ("forward", "_check_input_dim"), ("batch_norm",)),
    nn.Conv1d: _places(nn.Conv1d, ("forward", "_conv_forward"), ("conv1d", "pad")),
    nn.Conv2d: _places(nn.Conv2d, ("forward", "_conv_forward"), ("conv2d", "pad")),
    nn.Conv3d: _places(nn.Conv3d, ("forward", "_conv_forward"), ("conv3d", "pad")),
}
#: the classes answered, exactly (a lazy copy's copies of them hold unread tensor dictionaries)
ANSWERABLE = frozenset(_CLASSES)
#: the classes whose places held torch's own code at import (core/rebound.torch_own)
_OWN = frozenset(kind for kind, places in _CLASSES.items() if all(torch_own(held) for _, _, held in places))
#: answers kept per process: key -> (the ops' calls, the result's metadata)
_ANSWERS: Dict[Tuple[Any, ...], Tuple[Tuple[Any, ...], Any]] = {}
_MAX_ANSWERS = 50_000
_STRIDED = torch.strided
#: the attribute types keyed by value as they are (with their type: ``True == 1 == 1.0``)
_PLAIN = frozenset({bool, int, str, type(None)})
_NO_CLASSES: Mapping[type, type] = MappingProxyType({})


def answerable(kind: type) -> bool:
    """Whether a module of class ``kind`` (exactly) may be answered from an earlier call."""
    return kind in _CLASSES


def answered_leaf(module: nn.Module) -> bool:
    """Whether a traced call of ``module`` (a caller's module, before the run) is expected to be answered
    from an earlier call of its key: of an answerable class, its forward its class's, and not a batch
    norm that tracks its statistics in training (written in place: it runs every call). What structural
    reuse's policy weighs a block's leaves by; a guess only (the key decides at the call)."""
    state = vars(module)
    if type(module) not in _CLASSES or "forward" in state:
        return False
    return not (state.get("training") and state.get("track_running_stats"))


def _intact(kind: type) -> bool:
    """Whether ``kind``'s forward and what it calls are torch's own, as they were at import (a
    function the caller rebound before this module was imported is not torch's own: run)."""
    return kind in _OWN and all(getattr(owner, name) is held for owner, name, held in _CLASSES[kind])


class LeafCall:
    """The ``forward`` the copy of an answerable module holds while the run lasts."""

    __slots__ = ("calls", "module")
    __flopcount_reuse__ = True  # structural reuse's own: not an instance-level forward of the user's

    def __init__(self, calls: LeafCalls, module: nn.Module):
        self.calls = calls
        self.module = module

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.calls.call(self.module, args, kwargs)


class LeafCalls:
    """The leaf calls of one run: ``recorder`` (its events, counters and module stack), ``cache`` (the
    shape cache: the results it makes), ``fake_type`` and ``mode`` (the run's fakes), ``settings`` (the
    process settings in the key: structural reuse's), ``fakes`` (the lazy copy's fakes made so far, by
    ``id`` of the caller's tensor: a :class:`Pending` read already has one, which the forward may have
    changed since)."""

    def __init__(
        self, recorder: Any, cache: Any, fake_type: type, mode: Any, settings: Callable[[], Tuple[Any, ...]],
        fakes: Callable[[], Mapping[int, Any]], tracked: Mapping[type, type] = _NO_CLASSES, reads: Any = None,
    ):
        self._recorder = recorder
        self._tracked = tracked
        self._reads = reads
        self._fakes = fakes
        self._cache = cache
        self._fake_type = fake_type
        self._mode = mode
        self._settings = settings
        #: calls answered from an earlier one in this run
        self.answered = 0

    def call(self, module: nn.Module, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
        kind = type(module)
        forward = kind.forward.__get__(module)
        tracked = self._tracked.get(kind)  # under its tracking class: a first call of structural reuse runs
        if tracked is not None:
            kind = tracked
        recorder, cache = self._recorder, self._cache
        if (
            kwargs or len(args) != 1 or kind not in _CLASSES or cache is None or recorder.muted
            or recorder.phase != "forward" or recorder.marker is not None or torch.is_grad_enabled() or autocast_on()
            or get_proxy_mode() is not None or type(args[0]) is not self._fake_type or not _intact(kind)
        ):
            return forward(*args, **kwargs)
        x = args[0]
        # the argument's metadata read (and an answer made) below the run's torch-function modes: one pass
        out, key = outside_modes(self._answer, [x], module, kind, x)
        if out is not None:
            if tracked is not None and self._reads is not None and self._reads.log is not None:
                self._reads.log.append((module, LEAF_READ))  # its forward's reads, not made: what its key held
            return out
        start, unkeyed, checked = len(recorder.events), recorder.unkeyed, recorder.indices_checked
        before = (len(recorder.assumptions), recorder.conds, len(cache.disabled))
        out = forward(x)
        if key is None or recorder.unkeyed != unkeyed or recorder.indices_checked != checked:
            return out
        if (len(recorder.assumptions), recorder.conds, len(cache.disabled)) != before or out is x:
            return out
        stack, phase = recorder.module_stack(), recorder.phase
        window = recorder.events[start:]
        if not all(type(e) is OpEvent and e.module_stack == stack and e.phase == phase for e in window):
            return out
        described = outside_modes(cache.fresh_result, [out], out, args) if isinstance(out, torch.Tensor) else None
        if described is not None:
            if len(_ANSWERS) >= _MAX_ANSWERS:
                _ANSWERS.clear()
            _ANSWERS[key] = (tuple([shared_call(e.call) for e in window]), described)
        return out

    def _answer(self, module: nn.Module, kind: type, x: Any) -> Tuple[Any, Optional[Tuple[Any, ...]]]:
        """(a fresh result, None) for a key answered before, its events appended; else (None, the
        call's key, or None when it cannot be keyed). ``kind``: the module's class (of a module under
        its tracking class, the class it tracks). Runs below the torch-function modes."""
        key = self._key(module, kind, x)
        if key is None:
            return None, None
        found = _ANSWERS.get(key)
        if found is None:
            return None, key
        ops, described = found
        out = self._cache.made(type(module).forward, described)
        if out is None:  # make_fx tracing, or a constructor that changed: run as written
            return None, None
        recorder = self._recorder
        stack, phase = recorder.module_stack(), recorder.phase
        recorder.events.extend([OpEvent(call, stack, phase) for call in ops])
        self.answered += 1
        return out, None

    def _key(self, module: nn.Module, cls: type, x: Any) -> Optional[Tuple[Any, ...]]:
        """What the call of ``module`` (of class ``cls``) on ``x`` depends on (module docstring), or
        None: not keyed."""
        if x.fake_mode is not self._mode or x.constant is not None or x.layout is not _STRIDED:
            return None
        state = _STATE(module)  # past a tracking class's logging: an answer logs its reads as one (``call``)
        attributes = leaf_attributes(state)
        children = state.get("_modules")
        if attributes is None or (children is not None and raw_children(children)):
            return None
        held: List[int] = []
        parameters = self._tensors_key(state.get("_parameters"), held)
        buffers = self._tensors_key(state.get("_buffers"), held)
        if parameters is None or buffers is None:
            return None
        if len(held) > 1 and len(set(held)) != len(held):
            return None  # one tensor under two names
        argument = (x.shape, x.stride(), x.storage_offset(), x.dtype, x.fake_device, x.requires_grad, x.is_inference())
        return ((cls, attributes, parameters, buffers), argument, self._settings())

    def _tensors_key(self, value: Any, held: List[int]) -> Optional[Tuple[Any, ...]]:
        """A parameter or buffer dictionary's part of the key: each entry by name, its fake's key and
        the real tensor's type (``held`` gets the real tensors' ids); None where one is faked already
        (read before: the fake may have changed since) or held another way."""
        tensors: List[Any] = []
        if type(value) is UnreadTensors:  # not taken in (an answered call never reads them)
            unread = value.unread_keys()
            if unread is None:
                return None
            for key, tensor_key, real in unread:
                if real is None:
                    tensors.append((key, None))
                else:
                    tensors.append((key, tensor_key, type(real)))
                    held.append(id(real))
        elif value:
            made = self._fakes()
            for key, tensor in dict.items(value):
                if tensor is None:
                    tensors.append((key, None))
                elif type(tensor) is Pending and id(tensor.real) not in made:
                    tensors.append((key, tensor.key, type(tensor.real)))
                    held.append(id(tensor.real))  # one Pending per tensor: as an unread one's
                else:
                    return None
        return tuple(tensors)


def leaf_attributes(state: Mapping[str, Any]) -> Optional[Tuple[Any, ...]]:
    """The plain attributes of an answerable module (its ``__dict__``, ``state``) its call's key holds:
    every one but torch's hooks and registries (run around the forward, not in it), its tensor and
    child dictionaries and its :class:`LeafCall`, by name, type and value; None where one is of
    another kind (the call is run). What a first call of structural reuse that got this call's answer
    keys the module by (:data:`LEAF_READ`)."""
    parts: List[Any] = []
    plain = _PLAIN
    for name, value in state.items():
        if name in _NOT_ATTRIBUTES:
            continue
        kind = type(value)
        if kind in plain:
            parts.append((name, kind, value))
        elif kind is float:
            # -0.0 == 0.0, yet an argument shown to handlers keeps its sign (NaN: never equal, never answered)
            parts.append((name, kind, value, math.copysign(1.0, value)) if value == 0.0 else (name, kind, value))
        elif kind is tuple or kind is list:  # a stride, a padding (a list: the reversed padding)
            for item in value:
                if type(item) is not int:
                    return None
            parts.append((name, kind, tuple(value)))
        elif name != "forward" or kind is not LeafCall:  # this call's own wrapper, or anything else
            return None
    return tuple(parts)


#: torch's own per-module hook dictionaries, their flags and registries (every name a bare module holds
#: but its training flag and its parameter, buffer and child dictionaries): read around a forward, not in it
_REGISTRIES = frozenset(vars(nn.Module())) - {"training", "_parameters", "_buffers", "_modules"}
#: the names :func:`leaf_attributes` leaves to the key's other parts, or out
_NOT_ATTRIBUTES = _REGISTRIES | {"_parameters", "_buffers", "_modules"}
#: a module's ``__dict__``, read past any ``__getattribute__`` (a first call's tracking class)
_STATE = cast(Callable[[nn.Module], Dict[str, Any]], vars(nn.Module)["__dict__"].__get__)
#: the read a first call of structural reuse logs for a leaf it got answered under its tracking class
#: (its forward not run, so none of its reads logged): its key's plain attributes, :func:`leaf_attributes`
LEAF_READ = "\0leaf"
