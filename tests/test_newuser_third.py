"""A new user's mistakes with the Python API, third audit (docs/performance.md, branch papercuts3):
``benchmark`` and ``profile`` answer a failing forward as ``count_flops`` does (the module, the
inputs, the hint for inputs given in the wrong form), and a failure line names the tracer the user
chose, the default by its own name ("auto"). Module names and shapes come from the models below."""

from __future__ import annotations

import pytest
import torch
from _small_models import Mlp
from conftest import assert_same_state, snapshot
from torch import nn

import flopcount
from flopcount import TraceError, UsageError, count_flops
from flopcount.devices.roofline import Roofs

ROOFS = Roofs({"float32": 1e11}, 1e10, "test roofs", "given")  # given: nothing measured


class KeywordOnly(nn.Module):
    def __init__(self):
        super().__init__()
        self.l = nn.Linear(16, 8)

    def forward(self, *, x, scale=1.0):
        return self.l(x) * scale


class Masked(nn.Module):
    def __init__(self):
        super().__init__()
        self.l = nn.Linear(16, 8)

    def forward(self, input_ids, attention_mask=None):
        return self.l(input_ids) * attention_mask.sum()


def _benchmark(model, inputs=(), kwargs=None):
    return flopcount.benchmark(model, inputs, kwargs, iters=1, warmup=1)


def _profile(model, inputs=(), kwargs=None):
    return flopcount.profile(model, inputs, kwargs, steps=1, warmup=1, roofs=ROOFS)


def _module_latency(model, inputs=(), kwargs=None):
    return flopcount.module_latency(model, inputs, kwargs, iters=1, warmup=1)


READINGS = pytest.mark.parametrize(
    "who, run", [("benchmark", _benchmark), ("profile", _profile), ("module_latency", _module_latency)]
)


@READINGS
@pytest.mark.parametrize(
    "build, inputs, place, fragment",
    [
        (Mlp, (4, 16), "the root module (model)",
         "the inputs are the numbers (4, 16), not tensors: give example tensors, e.g. torch.randn(4, 16)"),
        (Mlp, "4x16", "module 'l1'", "the input is the string '4x16': SPECs are the command line's"),
        (KeywordOnly, torch.randn(4, 16), "the root module (model)",
         "its keyword-only x, scale go in kwargs=, e.g. {who}(model, kwargs={{'x': x}})"),
        (Masked, {"input_ids": torch.randn(2, 16), "attention_mask": torch.ones(2, 5)}, "module 'l'",
         "the dict of input_ids, attention_mask went in as forward's first argument ('input_ids'): to pass its "
         "entries as keyword arguments give it as kwargs=, e.g. {who}(model, kwargs=batch)"),
    ],
    ids=["shape", "spec", "keyword-only", "tokenizer-dict"],
)
def test_benchmark_and_profile_give_count_flops_hints(who, run, build, inputs, place, fragment):
    """Before: benchmark let torch's TypeError through as it was (no module, no inputs, no hint),
    profile named the module but gave no hint."""
    model = build()
    before = snapshot(model)
    with pytest.raises(TraceError) as info:
        run(model, inputs)
    text = str(info.value)
    assert text.startswith(f"forward failed in {place} ({who}) with inputs "), text
    assert fragment.format(who=who) in text
    assert_same_state(model, before)


@READINGS
def test_a_wrong_shape_names_the_module_and_both_shapes(who, run):
    """A 4x15 batch meets Linear(16, 32) in 'l1': torch's "(4x15 and 16x32)", with where and what was given."""
    with pytest.raises(TraceError) as info:
        run(Mlp(), torch.randn(4, 15))
    assert str(info.value) == (f"forward failed in module 'l1' ({who}) with inputs Tensor[4, 15] float32: "
                               "RuntimeError: mat1 and mat2 shapes cannot be multiplied (4x15 and 16x32)")
    assert info.value.module_path == "l1"


def test_the_remedy_the_benchmark_names_runs():
    """kwargs= as the line says: one timed call of Linear(16, 8) on 4 rows, batch 4 from x's dim 0."""
    result = flopcount.benchmark(KeywordOnly(), kwargs={"x": torch.randn(4, 16)}, iters=1, warmup=0)
    assert result.iters == 1 and result.batch_size == 4


def test_a_failure_outside_the_forward_is_not_called_the_forwards():
    """The wrapping reads the traceback: an error no module's code raised (here the timer's) goes on as it is."""

    def broken_clock() -> int:
        raise ZeroDivisionError("the clock")

    with pytest.raises(ZeroDivisionError, match="the clock"):
        flopcount.benchmark(Mlp(), torch.randn(4, 16), iters=1, warmup=0, timer=broken_clock)


@pytest.mark.parametrize("tracer, said", [(None, "auto tracer"), ("auto", "auto tracer"), ("dispatch", "dispatch tracer"),
                                          ("jit", "jit tracer")])
def test_a_forward_failure_names_the_tracer_chosen(tracer, said):
    """Before: a default count's real run said "(dispatch tracer)" and its dtype refusal "(auto tracer)"."""
    options = {} if tracer is None else {"tracer": tracer}
    with pytest.raises(TraceError) as info:
        count_flops(Mlp(), torch.randn(4, 15), **options)
    assert f"forward failed in module 'l1' ({said}) with inputs" in str(info.value)


@pytest.mark.parametrize("tracer, said", [(None, "auto tracer"), ("dispatch", "dispatch tracer")])
def test_a_dtype_refusal_names_the_tracer_chosen(tracer, said):
    """bfloat16 inputs on a float32 Linear: refused on fakes by the real kernel's own check (auto),
    or by the real kernel (dispatch); one wording either way."""
    options = {} if tracer is None else {"tracer": tracer}
    with pytest.raises(TraceError) as info:
        count_flops(Mlp(), torch.randn(4, 16, dtype=torch.bfloat16), **options)
    assert f"forward failed in module 'l1' ({said}) with inputs" in str(info.value)


def test_a_failing_loss_names_the_tracer_chosen():
    def loss(out):
        raise ValueError("no loss here")

    with pytest.raises(TraceError, match=r"^loss_fn failed \(auto tracer\) with inputs .*ValueError: no loss here"):
        count_flops(Mlp(), torch.randn(4, 16), backward=True, loss_fn=loss)


# the fresh-eyes pass over the other readings' Python calls


def _tiny_gpt2():
    from flopcount.examples import hf

    return hf.gpt2(n_layer=1, n_embd=64, n_head=4, vocab_size=100, n_positions=32)


def test_serve_refuses_a_tp_that_splits_heads_unevenly():
    """4 heads over tp=3 ranks: 2, 1, 1; the per-rank figures (work, weights, cache / 3) would understate the
    busiest rank. plan refuses it the same way; tp=2 divides 4 and is priced."""
    ids = torch.randint(0, 100, (1, 8))
    with pytest.raises(UsageError, match=r"serve: tp=3 does not divide the model's 4 attention heads .*\(e\.g\. 2, 4\)"):
        flopcount.serve(_tiny_gpt2(), ids, 2, on="h100", tp=3)
    assert flopcount.serve(_tiny_gpt2(), ids, 2, on="h100", tp=2).tp == 2


def test_benchmark_names_an_unknown_part():
    """Before: on="h1000" (a typo of h100) timed the model and left the MFU out without a word."""
    with pytest.raises(UsageError, match="unknown part 'h1000'; known parts: H100 SXM"):
        flopcount.benchmark(Mlp(), torch.randn(4, 16), iters=1, warmup=0, on="h1000")


def test_estimate_memory_gives_count_flops_hint():
    with pytest.raises(TraceError) as info:
        flopcount.estimate_memory(Mlp(), (4, 16))
    assert "the inputs are the numbers (4, 16), not tensors: give example tensors, e.g. torch.randn(4, 16)" in str(info.value)
