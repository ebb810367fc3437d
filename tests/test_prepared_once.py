"""Issue #19 item 3: a count prepares its call and reads the model's facts once, then
hands both down (tracing, costing, aggregation, benchmarking, memory).

Oracles: the number of walks is the design's promise (one walk of the module tree for a
``tracer="auto"`` count, one flatten of the inputs on every path; 0.2 did 13 and 2);
the facts are checked against torch's own module API (``module.parameters()`` dedups
a tied tensor; ``named_modules(remove_duplicate=False)`` lists every name of a module)."""

from __future__ import annotations

import collections
import dataclasses
import warnings
from collections import namedtuple
from typing import Deque

import pytest
import torch
from torch import nn

import flopcount
import flopcount.core.inputs as inputs_module
from flopcount.core.inputs import PreparedCall, prepare_call
from flopcount.core.model_facts import model_facts


class Counting(nn.Sequential):
    """A root module that counts how often its tree is walked: ``modules()``,
    ``parameters()``, ``buffers()`` and ``named_*`` all go through ``named_modules``. One entry
    per walk in a deque of the class's: a reading sets a class's int, list, dict or set back as
    found (core/state.FoundState), a deque it leaves alone."""

    walks: Deque[None] = collections.deque()

    def named_modules(self, *args, **kwargs):  # type: ignore[override]
        type(self).walks.append(None)
        return super().named_modules(*args, **kwargs)


def _model() -> Counting:
    shared = nn.Linear(8, 8)
    model = Counting(nn.Linear(8, 8), nn.ReLU(), shared, nn.Sequential(shared, nn.BatchNorm1d(8)), nn.Linear(8, 3))
    return model.eval()


@pytest.fixture
def flattens(monkeypatch):
    seen = []
    original = inputs_module.flatten_tensors

    def counting(obj):
        seen.append(1)
        return original(obj)

    monkeypatch.setattr(inputs_module, "flatten_tensors", counting)
    return seen


@pytest.mark.parametrize("tracer, walks", [("auto", 1), ("dispatch", 3), ("jit", 4)])
def test_a_count_walks_the_model_and_the_inputs_once(flattens, tracer, walks):
    # auto: the facts' one walk; dispatch and jit also snapshot the real model's state to
    # give it back as found (two walks), jit its state once more for the trace's inputs
    model = _model()
    x = torch.randn(4, 8)
    Counting.walks.clear()
    result = flopcount.count_flops(model, (x,), tracer=tracer)
    assert len(flattens) == 1
    assert len(Counting.walks) == walks
    # the hand formula: three 8x8 linear calls (the shared one runs twice) and an 8x3 one, on 4 rows
    assert result.macs == 4 * (8 * 8 * 3 + 8 * 3)


def test_counting_and_timing_share_one_prepared_call(flattens):
    model = _model()
    flopcount.count_flops(model, torch.randn(4, 8), measure={"warmup": 0, "iters": 2})
    assert len(flattens) == 1


def test_memory_prepares_its_call_once(flattens):
    flopcount.estimate_memory(_model(), torch.randn(4, 8))
    assert len(flattens) == 1


def test_generation_reads_the_model_facts_once_for_all_steps(monkeypatch):
    from flopcount.core import model_facts as facts_module
    from flopcount.decoding import counted as generation
    calls = []
    original = facts_module.model_facts

    def counting(model):
        calls.append(model)
        return original(model)

    monkeypatch.setattr(generation, "model_facts", counting)
    from test_generation import VOCAB, _llama

    ids = torch.randint(0, VOCAB, (2, 5))
    flopcount.count_generation(_llama("cpu"), ids, new_tokens=4, trace_every_step=True)
    assert len(calls) == 1  # 4 steps traced, the model's facts read once


def test_facts_agree_with_torchs_module_api():
    model = _model()
    model[0].weight = model[2].weight  # a tied tensor in two modules, besides the shared module
    facts = model_facts(model)
    named = list(model.named_modules())
    assert [name for name, _ in facts.modules] == [name for name, _ in named]
    # a module's parameters: its own and its children's, a shared tensor once (torch dedups)
    for name, module in named:
        assert facts.owned.get(name, 0) == sum(p.numel() for p in module.parameters()), name
    every = {}
    for name, module in model.named_modules(remove_duplicate=False):
        every.setdefault(id(module), []).append(name)
    assert dict(facts.aliases) == {names[0]: tuple(names) for names in every.values() if len(names) > 1}
    assert facts.aliases == {"2": ("2", "3.0")}
    assert [id(p) for p in facts.parameters] == [id(p) for p in model.parameters()]
    assert [id(b) for b in facts.buffers] == [id(b) for b in model.buffers()]
    # by hand: linear 8x8 (bias 8, weight tied), shared 8x8 + 8, BatchNorm 8 + 8, head 8x3 + 3
    assert facts.summary.total == sum(p.numel() for p in model.parameters()) == 8 + 72 + 16 + 27
    assert facts.owned[""] == 123 and facts.owned["3"] == 72 + 16
    assert facts.summary.buffer_bytes_by_dtype == {"float32": 4 * (8 + 8), "int64": 8}
    assert not facts.lazy and facts.packed is None


def test_facts_see_lazy_and_packed_modules():
    assert model_facts(nn.Sequential(nn.LazyLinear(4))).lazy
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization's deprecation notices
        quantized = torch.ao.quantization.quantize_dynamic(nn.Sequential(nn.Linear(8, 4)), {nn.Linear}, dtype=torch.qint8)
    assert model_facts(quantized).packed == "0._packed_params"  # the module holding the packed object


Pair = namedtuple("Pair", "a b")


def test_prepared_call_follows_the_input_convention_and_rebuilds():
    x, y, z = torch.zeros(2, 3), torch.ones(4), torch.full((1,), 2.0)
    call = prepare_call((Pair(x, [y]), {"k": 3}), {"mask": z})
    assert call.args[0] == Pair(x, [y]) and call.args[1] == {"k": 3} and call.kwargs == {"mask": z}
    assert [id(t) for t in call.tensors] == [id(x), id(y), id(z)]
    assert call.description == "((Tensor[2, 3] float32, [Tensor[4] float32]), {'k': 3}) with kwargs {mask=Tensor[1] float32}"
    twins = [t + 1 for t in call.tensors]
    moved = call.with_tensors(twins)
    assert isinstance(moved.args[0], Pair) and moved.args[0].a is twins[0] and moved.args[0].b[0] is twins[1]
    assert moved.kwargs["mask"] is twins[2] and moved.args[1] == {"k": 3}
    assert call.args[0].a is x  # the original is untouched
    assert prepare_call(call) is call
    single = prepare_call(x)
    assert single.args == (x,) and single.kwargs == {} and single.description == "Tensor[2, 3] float32"
    assert prepare_call(None).args == ()
    with pytest.raises(flopcount.UsageError, match="kwargs go into the PreparedCall"):
        prepare_call(call, {"extra": 1})
    assert isinstance(call, PreparedCall)


# One container walker (inputs.flatten_tensors) for call arguments and outputs, dataclasses included.


@dataclasses.dataclass
class Batch:
    x: torch.Tensor
    scale: float = 2.0


@dataclasses.dataclass(frozen=True)
class Frozen:
    a: torch.Tensor
    rest: dict
    cached: torch.Tensor = dataclasses.field(init=False, default=None)  # type: ignore[assignment]


@dataclasses.dataclass
class Out:
    y: torch.Tensor
    aux: list


class OnBatch(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 4)

    def forward(self, batch: Batch) -> Out:
        y = self.lin(batch.x) * batch.scale
        return Out(y, [y.sum()])


@pytest.mark.parametrize("tracer", ["auto", "dispatch", "jit"])
def test_a_dataclass_input_is_walked_by_every_tracer(tracer):
    batch = Batch(torch.randn(3, 8))
    kept = batch.x.clone()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fake tensor deep-copied, no jit constant
        result = flopcount.count_flops(OnBatch(), batch, tracer=tracer)
    assert result.macs == 3 * 8 * 4  # by hand: Linear(8, 4) on 3 rows
    assert result.input_description == "Batch(x=Tensor[3, 8] float32, scale=2.0)"
    assert result.complete
    assert torch.equal(batch.x, kept) and batch.scale == 2.0


def test_a_dataclass_output_gives_its_tensors_to_the_backward():
    from torch.utils.flop_counter import FlopCounterMode

    model = OnBatch()
    batch = Batch(torch.randn(5, 8, requires_grad=True))
    counted = flopcount.count_flops(model, batch, backward=True)
    with FlopCounterMode(display=False) as live:  # the oracle: a real forward and backward
        out = model(batch)
        (out.y.sum() + out.aux[0]).backward()
    # contractions only (FlopCounterMode's scope): forward 5x8x4, backward grad input and grad weight
    assert 2 * counted.macs == live.get_total_flops() == 2 * 3 * 5 * 8 * 4
    assert counted.by_phase("macs") == {"forward": 5 * 8 * 4, "backward": 2 * 5 * 8 * 4}


def test_the_walker_rebuilds_frozen_dataclasses_non_init_fields_and_cycles():
    a, b, c = torch.zeros(2), torch.ones(3), torch.full((1,), 5.0)
    frozen = Frozen(a, {"b": b})
    object.__setattr__(frozen, "cached", c)
    loop: list = [a]
    loop.append(loop)  # a list that holds itself
    tensors, rebuild = inputs_module.flatten_tensors((frozen, loop))
    assert [id(t) for t in tensors] == [id(a), id(b), id(c), id(a)]
    twins = [t + 1 for t in tensors]
    new_frozen, new_loop = rebuild(twins)
    assert new_frozen.a is twins[0] and new_frozen.rest["b"] is twins[1] and new_frozen.cached is twins[2]
    assert new_loop[0] is twins[3] and new_loop[1] is loop  # the cycle is kept as it was
    assert frozen.a is a and frozen.cached is c  # the original is untouched
    assert inputs_module.output_tensors(Out(a, [b, {"c": c}])) == [a, b, c]
