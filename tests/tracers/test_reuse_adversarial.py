"""Structural reuse against models built to break it (issue #32 item 2: "a reuse that cannot be
proven exact is not taken"; branch ``advreuse``). Each model is a stack of identical blocks whose
calls differ only in state outside the blocks' parameters, buffers and arguments: Python's or
numpy's random generator, a class attribute, a flag of another Python module, a global object's
attribute. Oracles: the count with reuse off (every call traced), the MACs derived by hand from
which blocks do the extra work, and ``FlopCounterMode`` live on the real model."""

from __future__ import annotations

import copy
import pickle
import random
import re
import types

import numpy as np
import pytest
import torch
from _toy_stack import B, D, off_and_on, rows
from conftest import torch_contraction_flops
from torch import nn

from flopcount import count_flops

LAYERS = 6
BLOCK_MACS = 2 * B * D * D  # two D x D Linears on a (B, D) input
EXTRA_MACS = B * D * D  # the extra ``@ eye(D)`` a block does when its branch says so


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(D, D)
        self.b = nn.Linear(D, D)

    def forward(self, x):
        return self.b(torch.relu(self.a(x))) + x


class Stack(nn.Module):
    def __init__(self, block: type) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList(block() for _ in range(LAYERS))

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


def _inputs():
    return (torch.randn(B, D, generator=torch.Generator().manual_seed(0)),)


def _off_and_on(monkeypatch, model, inputs):
    # ``off_and_on`` without its check that the model is left as found (it compares values: none on meta)
    if inputs[0].device.type != "meta":
        return off_and_on(monkeypatch, model, inputs)
    monkeypatch.setenv("FLOPCOUNT_REUSE", "0")
    off = count_flops(model, inputs)
    monkeypatch.setenv("FLOPCOUNT_REUSE", "1")
    return off, count_flops(model, inputs)


def _macs(extra_blocks: int, skipped: int = 0) -> int:
    return (LAYERS - skipped) * BLOCK_MACS + extra_blocks * EXTRA_MACS


@pytest.fixture(autouse=True)
def _reuse_on(monkeypatch):
    monkeypatch.setenv("FLOPCOUNT_REUSE", "1")


# ---------------------------------------------------------------- Python's and numpy's generators


class PythonLayerDrop(Block):
    """LayerDrop as fairseq writes it: in train mode a block is skipped when a Python draw says so."""

    def forward(self, x):
        if self.training and random.random() < 0.5:
            return x
        return super().forward(x)


class NumpyLayerDrop(Block):
    def forward(self, x):
        if self.training and np.random.rand() < 0.5:
            return x
        return super().forward(x)


def _states():
    numpy_state = np.random.get_state()
    return random.getstate(), numpy_state[0], numpy_state[1].tolist(), numpy_state[2:]


@pytest.mark.parametrize("meta", [False, True], ids=["real", "meta"])
@pytest.mark.parametrize("block", [PythonLayerDrop, NumpyLayerDrop], ids=["random", "numpy"])
def test_a_block_that_draws_from_python_or_numpy_is_traced_and_the_generators_are_left_as_found(monkeypatch, block, meta):
    model = Stack(block).train()
    inputs = _inputs()
    if meta:
        model, inputs = copy.deepcopy(model).to("meta"), tuple(t.to("meta") for t in inputs)
    random.seed(6)
    np.random.seed(6)
    before = _states()
    # the blocks the caller's next forward would skip, drawn here from the same states
    draws = [random.random() if block is PythonLayerDrop else np.random.rand() for _ in range(LAYERS)]
    skipped = sum(draw < 0.5 for draw in draws)
    random.setstate(before[0])
    np.random.seed(6)
    assert skipped == 3 and draws[0] >= 0.5  # seed 6: block 0 runs, 3 of the 6 are skipped
    off, on = _off_and_on(monkeypatch, model, inputs)
    # before: blocks 1-5 were booked from block 0 (all 6 counted), and each count advanced the
    # caller's generators (the count with reuse on drew after the one with it off)
    assert _states() == before
    assert on.macs == off.macs == _macs(0, skipped)
    assert rows(on) == rows(off)
    assert on.reused_calls == 0


# ---------------------------------------------------------------- state outside the blocks

# a Python module of its own, as a model's package would have one: a flag, a helper that reads
# it, and a config object (its functions' globals are this module's, not the test file's)
flags = types.ModuleType("flags")
exec(
    "FLAG = False\n"
    "class Config:\n"
    "    def __init__(self):\n"
    "        self.flag = False\n"
    "CONFIG = Config()\n"
    "def extra():\n"
    "    return FLAG\n",
    vars(flags),
)
extra = flags.extra
CONFIG = flags.CONFIG


class Shared:
    """A config the blocks share (as transformers' layers share theirs)."""

    def __init__(self) -> None:
        self.flag = False


class ByHelper(Block):  # a flag of another Python module, read by that module's function
    def forward(self, x):
        y = super().forward(x)
        return y @ torch.eye(D) if extra() else y


class ByModuleAttribute(Block):  # the same flag read as an attribute of that Python module
    def forward(self, x):
        y = super().forward(x)
        return y @ torch.eye(D) if flags.FLAG else y


class ByGlobalObject(Block):  # a global config object's attribute
    def forward(self, x):
        y = super().forward(x)
        return y @ torch.eye(D) if CONFIG.flag else y


class ByHeldConfig(Block):  # the attribute of a config the block holds and its parent changes
    def __init__(self) -> None:
        super().__init__()
        self.config = SHARED

    def forward(self, x):
        y = super().forward(x)
        return y @ torch.eye(D) if self.config.flag else y


class ByClass(Block):  # a class attribute, read through the class
    mode = False

    def forward(self, x):
        y = super().forward(x)
        return y @ torch.eye(D) if type(self).mode else y


SHARED = Shared()


def _set_flag(block: nn.Module, on: bool) -> None:
    # the one place each block's flag lives: what the parent sets before each layer
    kind = type(block)
    if kind is ByHelper or kind is ByModuleAttribute:
        flags.FLAG = on
    elif kind is ByGlobalObject:
        CONFIG.flag = on
    elif kind is ByHeldConfig:
        block.config.flag = on  # the config the blocks hold (on a count, the copy's: one for all blocks)
    else:
        kind.mode = on


class FlagPerLayer(Stack):
    """The parent sets the flag before each layer: on for layers 1 and 3 (2 of the 6)."""

    def forward(self, x):
        for i, block in enumerate(self.blocks):
            _set_flag(block, i in (1, 3))
            x = block(x)
        _set_flag(self.blocks[0], False)
        return x


@pytest.mark.parametrize("block", [ByHelper, ByModuleAttribute, ByGlobalObject, ByHeldConfig, ByClass],
                         ids=["helper", "module-attribute", "global-object", "held-config", "class-attribute"])
def test_a_flag_the_parent_sets_per_layer_outside_the_blocks_splits_the_key(monkeypatch, block):
    model = FlagPerLayer(block)
    inputs = _inputs()
    off, on = _off_and_on(monkeypatch, model, inputs)
    # before: every layer was booked from layer 0, whose flag is off (the 2 extra matmuls lost)
    assert on.macs == off.macs == _macs(2)
    assert rows(on) == rows(off)
    assert torch_contraction_flops(copy.deepcopy(model), inputs) == 2 * _macs(2)
    assert on.reused_calls == 4  # layers 2, 4, 5 booked from layer 0; layer 3 from layer 1


class MatchesAPattern(Block):
    """Calls a function of Python's standard library, ``re.fullmatch``, whose module caches each
    new pattern in a dict of its own (``re._cache``): the interpreter's state, not a flag of the
    model's. diffusers' blocks reach ``linecache.cache`` the same way, through ``deprecate`` and
    ``inspect`` (docs/performance.md, sweeprest)."""

    def forward(self, x):
        y = super().forward(x)
        return y @ torch.eye(D) if re.fullmatch("block", "block") else y  # always the extra matmul


def test_the_standard_library_s_own_state_is_not_in_the_key(monkeypatch):
    model = Stack(MatchesAPattern)
    inputs = _inputs()
    # an empty cache: block 0's call adds the pattern, so the cache differs from block 1 on
    monkeypatch.setattr(re, "_cache", {})
    off, on = _off_and_on(monkeypatch, model, inputs)
    assert on.macs == off.macs == _macs(LAYERS)
    assert rows(on) == rows(off)
    assert torch_contraction_flops(copy.deepcopy(model), inputs) == 2 * _macs(LAYERS)
    # before: ``re``'s functions were followed and their module's cache keyed by content, so
    # block 1 was traced again (4 reused; with linecache's source lines, the cost of diffusers'
    # tiled decoder six times over)
    assert on.reused_calls == LAYERS - 1


class CountsOnItsClass(Block):
    """Every other call of the class does the extra matmul: a count kept on the class."""

    calls = 0

    def forward(self, x):
        type(self).calls += 1
        y = super().forward(x)
        return y @ torch.eye(D) if type(self).calls % 2 == 0 else y


def test_a_block_counting_its_calls_on_its_class_is_traced(monkeypatch):
    model = Stack(CountsOnItsClass)
    inputs = _inputs()
    CountsOnItsClass.calls = 0
    monkeypatch.setenv("FLOPCOUNT_REUSE", "0")
    off = count_flops(model, inputs)
    CountsOnItsClass.calls = 0
    monkeypatch.setenv("FLOPCOUNT_REUSE", "1")
    on = count_flops(model, inputs)
    # before: the first call's write landed on reuse's tracking subclass, the class kept 0, and
    # blocks 1-5 were booked from block 0 (no extra matmul at all)
    assert on.macs == off.macs == _macs(LAYERS // 2)
    assert rows(on) == rows(off)
    # each block's call counted on the class within the run, as a real run counts it (the extra
    # matmuls above), and the class left as found after it (asfound: before, it was left at LAYERS)
    assert CountsOnItsClass.calls == 0
    assert on.reused_calls == 0


# ---------------------------------------------------------------- modules reuse cannot key


def test_a_scripted_block_in_a_stack_counts_as_with_reuse_off(monkeypatch):
    model = Stack(Block)
    model.blocks[1] = torch.jit.script(model.blocks[1])
    inputs = _inputs()
    # before: reuse read the scripted block's children with ``dict``'s own methods, which
    # TorchScript's wrappers refuse: the count raised a TypeError with reuse on (off: one real run)
    off, on = _off_and_on(monkeypatch, model, inputs)
    assert on.macs == off.macs == _macs(0)
    assert [(m.name, m.calls) for m in on.modules] == [(m.name, m.calls) for m in off.modules]
    assert on.by_module("macs") == off.by_module("macs")
    assert torch_contraction_flops(model, inputs) == 2 * _macs(0)
    # one wording on and off: the scripted block cannot be copied (its parameters are in TorchScript's
    # ParameterDict, which copy's pickling refuses). Before, reuse on's lazy copy met it inside the
    # forward and said "the forward failed on fake tensors in the root module (model)"; the reason
    # names the TorchScript module since branch newuser's second audit (before: copy's TypeError)
    with pytest.raises(TypeError):
        pickle.dumps(model.blocks[1]._parameters)
    said = "the model holds a TorchScript module (a scripted Block), which cannot be copied with fake tensors"
    booked = ("TorchScript runs the submodules of module 'blocks.1' without Python module hooks: their work is "
              "booked on the scripted module, and their own rows read 0")
    assert off.warnings == on.warnings == (f"tracer auto: counted one real run (dispatch) because {said}", booked)


def test_count_generation_of_layers_that_draw_is_reuse_off_s_and_leaves_the_generators(monkeypatch):
    pytest.importorskip("transformers")
    from transformers.models.llama import modeling_llama

    from examples import hf
    from flopcount import count_generation

    class DroppedLayer(modeling_llama.LlamaDecoderLayer):
        def forward(self, hidden_states, *args, **kwargs):
            if random.random() < 0.5:
                return hidden_states
            return super().forward(hidden_states, *args, **kwargs)

    torch.manual_seed(0)
    model = hf.llama(num_hidden_layers=6, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                     intermediate_size=96, vocab_size=128)
    for layer in model.model.layers:
        layer.__class__ = DroppedLayer
    model = model.to("meta")
    ids = torch.zeros(1, 6, dtype=torch.long, device="meta")
    counts = {}
    for reuse in ("0", "1"):
        monkeypatch.setenv("FLOPCOUNT_REUSE", reuse)
        random.seed(6)
        before = random.getstate()
        counts[reuse] = count_generation(model, ids, new_tokens=3)
        assert random.getstate() == before
    # before: reuse on booked layers from a layer that drew (2,763,764 FLOPs against 1,662,846
    # with reuse off), and both advanced the caller's generator
    assert counts["1"].flops == counts["0"].flops
    assert [step.flops for step in counts["1"].steps] == [step.flops for step in counts["0"].steps]


@pytest.mark.parametrize("block", [PythonLayerDrop, NumpyLayerDrop], ids=["random", "numpy"])
def test_estimate_memory_leaves_python_s_and_numpy_s_generators_as_found(monkeypatch, block):
    from flopcount import estimate_memory

    model = Stack(block).train()
    random.seed(6)
    np.random.seed(6)
    before = _states()
    for reuse in ("0", "1"):
        monkeypatch.setenv("FLOPCOUNT_REUSE", reuse)
        estimate_memory(model, _inputs())
        # before: each estimate drew the forward's numbers from the caller's generators
        assert _states() == before
