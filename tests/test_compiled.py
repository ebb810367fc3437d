"""A torch.compile'd module counts like the module it wraps: same numbers, original module
names (no ``_orig_mod.`` prefix), no compilation and no torch warning reaching the user."""

from __future__ import annotations

import warnings

import pytest
import torch
from _toy_stack import B, D, H, Stack
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

import flopcount
from flopcount import count_flops


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))


@pytest.mark.parametrize("tracer", ["auto", "jit", "dispatch"])
def test_compiled_module_counts_like_its_original(tracer):
    torch.manual_seed(0)
    model = _mlp().eval()
    x = torch.randn(3, 16)
    compiled = torch.compile(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no torch warning about global hooks may reach the user
        r = count_flops(compiled, x, tracer=tracer)
    assert r.macs == 3 * (16 * 32 + 32 * 4)  # hand formula: batch x (in x out) per Linear
    assert set(r.by_module()) == {"", "0", "1", "2"}
    assert r.by_module("macs")["0"] == 3 * 16 * 32


# ---- compiled parts inside a model (torch.compile of a submodule, Module.compile() in place)
#
# The default count ran a compiled part's compiled code on the fake copy's tensors, which killed
# the process (SIGSEGV in the Inductor kernel) for a submodule wrapped by torch.compile, for one
# compiled in place with Module.compile(), and for a whole model compiled with model.compile();
# `tracer="jit"` refused a wrapped submodule. A copy now runs a compiled part eagerly (the module
# it wraps), as the top-level wrapper was already counted.

LAYERS = 4


def _stack(how: str) -> nn.Module:
    torch.manual_seed(0)
    model = Stack(LAYERS).eval()
    if how == "wrapped":
        model.blocks[1] = torch.compile(model.blocks[1])
    elif how == "in place":
        model.blocks[2].compile()
    elif how == "whole, in place":
        model.compile()
    return model


def _live_flops(model: nn.Module, x: torch.Tensor) -> int:
    with FlopCounterMode(display=False) as mode:
        model(x)
    return mode.get_total_flops()


@pytest.mark.parametrize("tracer", ["auto", "dispatch", "jit"])
@pytest.mark.parametrize("how", ["wrapped", "in place", "whole, in place"])
def test_a_compiled_part_is_counted_through_the_module_it_compiles(how, tracer):
    model = _stack(how)
    x = torch.randn(B, D)
    eager = _stack("eager")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no torch warning about the count's hooks reaches the user
        r = count_flops(model, x, tracer=tracer)
    assert r.macs == LAYERS * B * 2 * D * H  # hand formula (tests/_toy_stack.py)
    assert r.flops == count_flops(eager, x).flops
    assert r.by_operator("flops")["aten::linear"] == _live_flops(eager, x)  # FlopCounterMode counts the Linears
    wrapped = "_orig_mod." if how == "wrapped" else ""
    assert r.by_module("macs")[f"blocks.1.{wrapped}up"] == B * D * H
    model.get_submodule(f"blocks.1.{wrapped}up")  # the row names a module of the caller's model


def test_the_training_step_readings_of_a_compiled_part_are_those_of_the_module_it_compiles():
    x = torch.randn(B, D)
    eager, model = _stack("eager"), _stack("wrapped")
    model.blocks[2].compile()
    compiled_step, eager_step = flopcount.estimate_memory(model, x).to_dict(), flopcount.estimate_memory(eager, x).to_dict()
    assert compiled_step["peak_bytes"] == eager_step["peak_bytes"]
    wrapped_row = dict(compiled_step["by_module"]["blocks.1._orig_mod.up"], depth=3)  # one level deeper, below the wrapper
    assert wrapped_row == eager_step["by_module"]["blocks.1.up"]
    assert compiled_step["by_module"]["blocks.2.down"] == eager_step["by_module"]["blocks.2.down"]
    trained, trained_eager = count_flops(model, x, backward=True), count_flops(eager, x, backward=True)
    assert (trained.flops, trained.macs) == (trained_eager.flops, trained_eager.macs)
    assert trained.by_operator("flops") == trained_eager.by_operator("flops")
