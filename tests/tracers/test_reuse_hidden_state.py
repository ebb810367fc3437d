"""Structural reuse against state a block's forward reads that its key did not hold (issue #32: "a
reuse that cannot be proven exact is not taken"; branch ``advreuse2``). Each model is a stack of
six identical blocks whose work depends on state outside their parameters, buffers and arguments
that changes between two blocks (set by the parent, or advanced by the block itself): a
``__slots__`` config, a user's random generator, a class attribute holding an object, a property or
a static method reading a global, a closure's variable, an ``lru_cache``'d helper, ``globals()``,
torch's backend switches, a parent module read through a reference, a weak reference, a deque, an
array, an iterator, the environment, a global object handed to a function, a tensor made from a
value, a global of a module object gone since the class was read. Before, each of them had the
later blocks booked from the first. Oracles: the MACs derived by hand from which blocks do the
extra matmul, the count with reuse off (``FLOPCOUNT_REUSE=0``: every call traced) and
``FlopCounterMode`` live on the real model."""

from __future__ import annotations

import collections
import copy
import dataclasses
import functools
import gc
import os
import random
import sys
import types
import weakref
from array import array

import numpy as np
import pytest
import torch
from _toy_stack import B, D, off_and_on, rows
from conftest import torch_contraction_flops
from torch import nn

from flopcount import count_flops

LAYERS = 6
BLOCK_MACS = 2 * B * D * D  # two D x D Linears on a (B, D) input
EXTRA_MACS = B * D * D  # the extra ``@ eye(D)`` of a block whose flag is on
FLAGGED = (1, 3)  # the blocks the parent turns the flag on for


def _hand(extra_blocks: int) -> int:
    return LAYERS * BLOCK_MACS + extra_blocks * EXTRA_MACS


def _extra(y: torch.Tensor, on: bool) -> torch.Tensor:
    return y @ torch.eye(D) if on else y


class Block(nn.Module):
    """Two Linears and a residual; ``flag()`` says whether the extra matmul runs."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(D, D)
        self.b = nn.Linear(D, D)

    def flag(self) -> bool:
        raise NotImplementedError

    def forward(self, x):
        return _extra(self.b(torch.relu(self.a(x))) + x, self.flag())


class Stack(nn.Module):
    """Runs the blocks in turn; ``before(stack, i)`` is what the parent does before block ``i``
    (and with ``i = -1`` after the last: the state as it found it)."""

    def __init__(self, block: type, before=None, **held) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList(block(**held) for _ in range(LAYERS))
        self.before = before

    def forward(self, x):
        for i, block in enumerate(self.blocks):
            if self.before is not None:
                self.before(self, i)
            x = block(x)
        if self.before is not None:
            self.before(self, -1)
        return x


def _inputs():
    return (torch.randn(B, D, generator=torch.Generator().manual_seed(0)),)


def _check(monkeypatch, model, extra_blocks, reused):
    off, on = off_and_on(monkeypatch, model, _inputs())
    assert torch_contraction_flops(copy.deepcopy(model), _inputs()) == 2 * _hand(extra_blocks)
    assert on.macs == off.macs == _hand(extra_blocks)
    assert rows(on) == rows(off)
    assert on.reused_calls == reused


@pytest.fixture(autouse=True)
def _reuse_on(monkeypatch):
    monkeypatch.setenv("FLOPCOUNT_REUSE", "1")


# ---------------------------------------------------------------- a shared object the parent sets per block


class Slotted:
    __slots__ = ("on",)

    def __init__(self) -> None:
        self.on = False


@dataclasses.dataclass(slots=True)
class SlottedData:
    on: bool = False


class SlottedHolder:
    __slots__ = ("flags",)

    def __init__(self) -> None:
        self.flags = [False]


def _set_on(held, on):
    held.on = on


def _set_first(held, on):
    held[0] = on


SHARED = {
    # name: (make the shared object, read its flag, set it)
    "slots": (Slotted, lambda held: held.on, _set_on),
    "dataclass-slots": (SlottedData, lambda held: held.on, _set_on),
    "slots-holding-a-list": (SlottedHolder, lambda held: held.flags[0], lambda held, on: _set_first(held.flags, on)),
    "deque": (lambda: collections.deque([False]), lambda held: held[0], _set_first),
    "bytearray": (lambda: bytearray(1), lambda held: held[0] == 1, lambda held, on: _set_first(held, int(on))),
    "array": (lambda: array("b", [0]), lambda held: held[0] == 1, lambda held, on: _set_first(held, int(on))),
    "numpy-array": (lambda: np.zeros(1), lambda held: held[0] == 1, lambda held, on: _set_first(held, int(on))),
    "weakref": (lambda: weakref.ref(GLOBAL_CONFIG), lambda held: held().on, lambda held, on: _set_on(held(), on)),
}


class HoldsShared(Block):
    def __init__(self, held, read) -> None:
        super().__init__()
        self.held = held
        self.read = read

    def flag(self) -> bool:
        return self.read(self.held)


@pytest.mark.parametrize("kind", list(SHARED))
def test_a_shared_object_the_parent_sets_per_block_splits_the_key(monkeypatch, kind):
    make, read, set_ = SHARED[kind]

    def before(stack, i):
        set_(stack.blocks[0].held, i in FLAGGED)  # the object every block holds (a count's: its copy's)

    # before: a slotted object, a deque, a bytearray, an array, a numpy array and a weak reference
    # were keyed by identity: blocks 1-5 booked from block 0 (2,304 MACs with reuse on, 2,688 off)
    _check(monkeypatch, Stack(HoldsShared, before, held=make(), read=read), len(FLAGGED), LAYERS - 2)


class CountsInASlot(Block):
    """Advances a counter held in a slot; every other call does the extra matmul."""

    def __init__(self, held) -> None:
        super().__init__()
        self.held = held

    def flag(self) -> bool:
        self.held.on += 1
        return self.held.on % 2 == 0


def test_a_first_call_advancing_a_slot_is_not_booked_again(monkeypatch):
    def before(stack, i):
        if i < 1:
            stack.blocks[0].held.on = 0

    # before: the slot's write was not seen: 2,304 MACs with reuse on, 2,880 off
    _check(monkeypatch, Stack(CountsInASlot, before, held=Slotted()), LAYERS // 2, 0)


# ---------------------------------------------------------------- a user's random generator


class DrawsFromItsGenerator(Block):
    def __init__(self, held) -> None:
        super().__init__()
        self.held = held

    def flag(self) -> bool:
        draw = self.held.random()
        return bool(draw < 0.5)


@pytest.mark.parametrize("kind", ["random", "numpy"])
def test_a_block_drawing_from_a_generator_of_the_user_s_is_traced(monkeypatch, kind):
    def make():
        return random.Random(6) if kind == "random" else np.random.default_rng(6)

    def before(stack, i):
        if i < 1:  # reseeded at the start (and the end): each forward draws the same numbers
            held = stack.blocks[0].held
            if kind == "random":
                held.seed(6)
            else:
                held.bit_generator.state = np.random.default_rng(6).bit_generator.state

    drawn = make()
    extra_blocks = sum(bool(drawn.random() < 0.5) for _ in range(LAYERS))
    assert 0 < extra_blocks < LAYERS  # seed 6: some blocks do the extra matmul, some do not
    # before: its state (in C) was not in the key: blocks 1-5 booked from block 0
    _check(monkeypatch, Stack(DrawsFromItsGenerator, before, held=make()), extra_blocks, 0)


# ---------------------------------------------------------------- code the forward reaches


class Config:
    def __init__(self) -> None:
        self.on = False

    def is_on(self) -> bool:
        return self.on


GLOBAL_CONFIG = Config()
FLAGS = {"on": False}


def _read_on(config: Config) -> bool:
    return config.on


class ByClassObject(Block):  # an object held by the class, read as ``self.config.on``
    config = Config()

    def flag(self) -> bool:
        return self.config.on


class ByProperty(Block):  # a property whose getter reads a global dict
    @property
    def on(self) -> bool:
        return FLAGS["on"]

    def flag(self) -> bool:
        return self.on


class ByStaticMethod(Block):
    @staticmethod
    def on() -> bool:
        return FLAGS["on"]

    def flag(self) -> bool:
        return self.on()


class ByClassMethod(Block):
    @classmethod
    def on(cls) -> bool:
        return FLAGS["on"]

    def flag(self) -> bool:
        return self.on()


@functools.cache
def _cached_flag() -> bool:
    return FLAGS["on"]


class ByCachedHelper(Block):  # an lru_cache'd helper (the parent clears its cache when it sets the flag)
    def flag(self) -> bool:
        return _cached_flag()


class ByGlobals(Block):  # a global read by name through ``globals()``
    def flag(self) -> bool:
        return globals()["FLAGS"]["on"]


class ByHandedObject(Block):  # a global object handed to a function
    def flag(self) -> bool:
        return _read_on(GLOBAL_CONFIG)


class ByObjectMethod(Block):  # a global object asked by its method
    def flag(self) -> bool:
        return GLOBAL_CONFIG.is_on()


class ByEnvironment(Block):
    def flag(self) -> bool:
        return os.environ.get("FLOPCOUNT_TEST_FLAG") == "1"


class ByBackend(Block):  # torch's switches, which a forward (or an op) can branch on
    def flag(self) -> bool:
        return torch.are_deterministic_algorithms_enabled()


class ByMatmulPrecision(Block):
    def flag(self) -> bool:
        return torch.get_float32_matmul_precision() == "high"


def _set(kind: type, on: bool) -> None:
    if kind is ByClassObject:
        kind.config.on = on
    elif kind in (ByHandedObject, ByObjectMethod):
        GLOBAL_CONFIG.on = on
    elif kind is ByEnvironment:
        os.environ["FLOPCOUNT_TEST_FLAG"] = "1" if on else "0"
    elif kind is ByBackend:
        torch.use_deterministic_algorithms(on)
    elif kind is ByMatmulPrecision:
        torch.set_float32_matmul_precision("high" if on else "highest")
    else:
        FLAGS["on"] = on
        _cached_flag.cache_clear()


@pytest.mark.parametrize("block", [ByClassObject, ByProperty, ByStaticMethod, ByClassMethod, ByCachedHelper, ByGlobals,
                                   ByHandedObject, ByObjectMethod, ByEnvironment, ByBackend, ByMatmulPrecision],
                         ids=lambda block: block.__name__)
def test_state_the_forward_reaches_outside_its_module_splits_the_key(monkeypatch, block):
    monkeypatch.delenv("FLOPCOUNT_TEST_FLAG", raising=False)

    def before(stack, i):
        _set(block, i in FLAGGED)

    try:
        # before: none of these was in the key: blocks 1-5 booked from block 0 (2,304 MACs, 2,688 off)
        _check(monkeypatch, Stack(block, before), len(FLAGGED), LAYERS - 2)
    finally:
        _set(block, False)
        os.environ.pop("FLOPCOUNT_TEST_FLAG", None)


def _closure_blocks():
    """A block class made in a function, reading that function's variable (``nonlocal``), and a
    setter for it: what a model's factory does."""
    on = False

    def set_on(value: bool) -> None:
        nonlocal on
        on = value

    class ByClosure(Block):
        def flag(self) -> bool:
            return on

    return ByClosure, set_on


def _counter():
    calls = 0

    def step() -> int:
        nonlocal calls
        calls += 1
        return calls

    def reset() -> None:
        nonlocal calls
        calls = 0

    return step, reset


STEP, RESET = _counter()


class ByCounter(Block):  # a helper counting its calls in a closure: every other call does the extra matmul
    def flag(self) -> bool:
        return STEP() % 2 == 0


class ByDefault(Block):  # a mutable default argument the parent sets
    def flag(self, options={"on": False}) -> bool:  # the default is the state here
        return options["on"]


def test_a_closure_s_variable_set_per_block_splits_the_key(monkeypatch):
    block, set_on = _closure_blocks()
    _check(monkeypatch, Stack(block, lambda stack, i: set_on(i in FLAGGED)), len(FLAGGED), LAYERS - 2)


def test_a_mutable_default_set_per_block_splits_the_key(monkeypatch):
    def before(stack, i):
        ByDefault.flag.__defaults__[0]["on"] = i in FLAGGED

    _check(monkeypatch, Stack(ByDefault, before), len(FLAGGED), LAYERS - 2)


def test_a_helper_counting_in_its_closure_is_traced(monkeypatch):
    def before(stack, i):
        if i < 1:
            RESET()

    # before: its closure was not in the key: 2,304 MACs with reuse on, 2,880 off
    _check(monkeypatch, Stack(ByCounter, before), LAYERS // 2, 0)


# ---------------------------------------------------------------- other objects a block holds


class ByParent(Block):
    """Reads a flag of its parent module, held in a list (not a child)."""

    def __init__(self) -> None:
        super().__init__()
        self.parent = []

    def flag(self) -> bool:
        return self.parent[0].on


def test_a_flag_of_a_module_held_outside_the_subtree_splits_the_key(monkeypatch):
    def before(stack, i):
        stack.on = i in FLAGGED

    model = Stack(ByParent, before)
    model.on = False
    for block in model.blocks:
        block.parent.append(model)
    _check(monkeypatch, model, len(FLAGGED), LAYERS - 2)


class ByIterator(Block):
    def __init__(self, held) -> None:
        super().__init__()
        self.held = held

    def flag(self) -> bool:
        return next(self.held)


def test_a_block_reading_an_iterator_is_traced(monkeypatch):
    import itertools

    def before(stack, i):
        if i < 1:  # one iterator the blocks share, started again: each forward reads the same items
            shared = itertools.cycle([False, True])
            for block in stack.blocks:
                block.held = shared

    # before: keyed by identity, the iterator's position was not seen: blocks 1-5 booked from block 0
    _check(monkeypatch, Stack(ByIterator, before, held=iter(())), LAYERS // 2, 0)


class ByValue(Block):
    """Does ``n`` extra matmuls, ``n`` a tensor made from a value by the parent."""

    def __init__(self) -> None:
        super().__init__()
        self.n = 1

    def forward(self, x):
        y = self.b(torch.relu(self.a(x))) + x
        for _ in range(int(self.n)):
            y = y @ torch.eye(D)
        return y


def test_a_tensor_made_from_a_value_is_keyed_by_identity(monkeypatch):
    def before(stack, i):
        if i >= 0:
            stack.blocks[i].n = torch.tensor(2 if i in FLAGGED else 1)
        else:
            for block in stack.blocks:
                block.n = 1

    # every block does one extra matmul, the flagged ones two. Before: the tensor keyed by its
    # metadata only, blocks 1-5 were booked from block 0 (3,456 MACs with reuse on, 3,840 off)
    _check(monkeypatch, Stack(ByValue, before), LAYERS + len(FLAGGED), 0)


# ---------------------------------------------------------------- a module gone while its class lives

_GONE_MODULE_SOURCE = """
FLAGS = {"on": False}


class ByGoneModule(Block):
    def flag(self) -> bool:
        return FLAGS["on"]
"""


def test_a_global_of_a_module_gone_since_its_class_was_read_splits_the_key(monkeypatch):
    """The block's Python module object goes (taken out of ``sys.modules``, as ``runpy``'s
    temporary module is once the script has run) after a count read the class, while the class,
    its functions and so their globals live on."""
    module = types.ModuleType("_flopcount_test_gone_module")
    module.Block = Block  # type: ignore[attr-defined]
    sys.modules[module.__name__] = module
    try:
        exec(compile(_GONE_MODULE_SOURCE, "<gone module>", "exec"), vars(module))
        flags = module.FLAGS  # type: ignore[attr-defined]

        def before(stack, i):
            flags["on"] = i in FLAGGED

        model = Stack(module.ByGoneModule, before)  # type: ignore[attr-defined]
        # the first count reads the class (its globals' paths, once per class) while the module lives
        assert count_flops(model, _inputs()).macs == _hand(len(FLAGGED))
    finally:
        del sys.modules[module.__name__]
    gone = weakref.ref(module)
    del module
    gc.collect()
    assert gone() is None
    # before (branch weakcls, d1a5481): the class's memo held the module by a weak reference only,
    # so its globals left the key: blocks 1-5 booked from block 0 (2,304 MACs with reuse on, 2,688 off)
    _check(monkeypatch, model, len(FLAGGED), LAYERS - 2)
