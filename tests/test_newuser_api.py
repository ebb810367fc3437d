"""A new user's mistakes with the Python API, each answered by an error that says what was given and
what to give instead, or by a count whose rows say how they were booked (the second newuser audit,
docs/performance.md). Counts are checked against hand-derived formulas."""

from __future__ import annotations

import warnings

import pytest
import torch
from _small_models import Mlp
from torch import nn

import flopcount
from flopcount import TraceError, UsageError, count_flops


class WithScripted(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = _scripted(Mlp())
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        return self.head(self.inner(x))


class Masked(nn.Module):
    """A forward with keyword parameters, as a Hugging Face model has (``input_ids``, ``attention_mask``)."""

    def __init__(self):
        super().__init__()
        self.l = nn.Linear(16, 8)

    def forward(self, input_ids, attention_mask=None):
        return self.l(input_ids) * attention_mask.sum()


def _scripted(module: nn.Module) -> torch.jit.ScriptModule:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch 2.13 deprecates torch.jit.script
        return torch.jit.script(module)


# Mlp on a 4x16 batch: Linear(16, 32) then Linear(32, 8); 1 MAC = 2 FLOPs, ReLU one FLOP per element
MLP_MACS = 4 * 16 * 32 + 4 * 32 * 8
MLP_FLOPS = 2 * MLP_MACS + 4 * 32
HEAD_MACS = 4 * 8 * 4


def test_jit_tracer_reads_a_torchscript_models_graph_per_layer():
    """Branch jitrows: a TorchScript root is read from its graph (before: refused), each Linear on its row."""
    model = _scripted(Mlp())
    result = count_flops(model, torch.randn(4, 16), tracer="jit")
    assert result.macs == MLP_MACS
    assert result.by_module("macs")["l1"] == 4 * 16 * 32 and result.by_module("macs")["l2"] == 4 * 32 * 8


@pytest.mark.parametrize("build, place", [(WithScripted, "module 'inner'")])
def test_jit_tracer_refuses_a_torchscript_module_naming_it(build, place):
    """torch.jit cannot trace a ScriptModule again: before, torch's "not part of the active trace"."""
    model = build()
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    with pytest.raises(TraceError, match="the jit tracer cannot trace a TorchScript module again") as info:
        count_flops(model, torch.randn(4, 16), tracer="jit")
    assert place in str(info.value) and "tracer='dispatch' or 'auto'" in str(info.value)
    assert all(torch.equal(before[name], tensor) for name, tensor in model.state_dict().items())


@pytest.mark.parametrize("tracer", ["auto", "dispatch"])
def test_a_torchscript_modules_rows_say_where_its_submodules_work_went(tracer):
    """TorchScript runs its submodules without module hooks: 'inner.l1' reads 0, and a warning says
    its work is booked on 'inner' (before: the zeros, no word)."""
    result = count_flops(WithScripted(), torch.randn(4, 16), tracer=tracer)
    assert result.macs == MLP_MACS + HEAD_MACS
    rows = result.by_module()
    assert rows["inner"] == MLP_FLOPS and rows["inner.l1"] == rows["inner.l2"] == 0
    said = [w for w in result.warnings if w.startswith("TorchScript runs the submodules of module 'inner'")]
    assert len(said) == 1, result.warnings


def test_a_plain_model_gets_no_torchscript_warning():
    result = count_flops(Mlp(), torch.randn(4, 16), tracer="dispatch")
    assert result.macs == MLP_MACS and not any("TorchScript" in w for w in result.warnings)


def test_a_failure_inside_torchscript_names_the_failing_line():
    """TorchScript's own first line ("The following operation failed in the TorchScript
    interpreter.") said nothing; the line now names the failing call."""
    with pytest.raises(TraceError) as info:
        count_flops(_scripted(Mlp()), torch.randn(4, 15), tracer="dispatch")
    text = str(info.value)
    assert "The following operation failed" not in text
    assert "(in TorchScript, File " in text and "linear.py" in text and "F.linear(input, self.weight, self.bias)" in text


@pytest.mark.parametrize(
    "inputs, fragment",
    [
        ((4, 16), "the inputs are the numbers (4, 16), not tensors: give example tensors, e.g. torch.randn(4, 16)"),
        (torch.Size([4, 16]), "the inputs are the numbers (4, 16), not tensors"),
        ([4, 16], "the inputs are the numbers (4, 16), not tensors"),
        ("4x16", "the input is the string '4x16': SPECs are the command line's"),
    ],
    ids=["tuple", "size", "list", "spec"],
)
def test_a_shape_where_tensors_go_says_to_give_tensors(inputs, fragment):
    model = Mlp()
    with pytest.raises(TraceError) as info:
        count_flops(model, inputs)
    assert fragment in str(info.value)


def test_a_dict_of_keyword_arguments_as_inputs_points_to_kwargs():
    """A tokenizer's output given as inputs is forward's first argument; kwargs= spreads it."""
    batch = {"input_ids": torch.randn(2, 16), "attention_mask": torch.ones(2, 5)}
    with pytest.raises(TraceError) as info:
        count_flops(Masked(), batch)
    assert ("the dict of input_ids, attention_mask went in as forward's first argument ('input_ids'): "
            "to pass its entries as keyword arguments give it as kwargs=") in str(info.value)
    result = count_flops(Masked(), kwargs=batch)  # the remedy it names: Linear(16, 8) on 2 rows, then the scale
    assert result.macs == 2 * 16 * 8


def test_a_dict_that_is_not_forwards_keywords_gets_no_hint():
    with pytest.raises(TraceError) as info:
        count_flops(Masked(), {"pixels": torch.randn(2, 16)})
    assert "kwargs=" not in str(info.value)


def test_an_unknown_part_is_called_a_part():
    """``on=`` names a modeled part; ``device`` is where the model runs (docs/api.md's one vocabulary)."""
    with pytest.raises(UsageError, match="unknown part 'h1000'; known parts: H100 SXM"):
        flopcount.predict(Mlp(), torch.randn(4, 16), on="h1000")
    with pytest.raises(UsageError, match="on must be a part name"):
        flopcount.predict(Mlp(), torch.randn(4, 16), on=100)


class KeywordOnly(nn.Module):
    def __init__(self):
        super().__init__()
        self.l = nn.Linear(16, 8)

    def forward(self, *, x, scale=1.0):
        return self.l(x) * scale


class ReturnsNothing(nn.Module):
    def __init__(self):
        super().__init__()
        self.l = nn.Linear(16, 8)
        self.seen = None

    def forward(self, x):
        self.seen = self.l(x).shape
        return None


class ReturnsIndices(nn.Module):
    def __init__(self):
        super().__init__()
        self.l = nn.Linear(16, 8)

    def forward(self, x):
        return self.l(x).argmax(-1)


def test_positional_inputs_to_a_keyword_only_forward_point_to_kwargs():
    with pytest.raises(TraceError) as info:
        count_flops(KeywordOnly(), torch.randn(4, 16))
    assert ("forward takes 0 positional input(s) and 1 were given; its keyword-only x, scale go in kwargs=, "
            "e.g. count_flops(model, kwargs={'x': x})") in str(info.value)
    # the remedy it names: Linear(16, 8) on 4 rows
    assert count_flops(KeywordOnly(), kwargs={"x": torch.randn(4, 16)}).macs == 4 * 16 * 8


@pytest.mark.parametrize("model, returned", [(ReturnsNothing, "None"), (ReturnsIndices, "a tensor of int64")])
def test_backward_of_a_forward_returning_nothing_to_differentiate_says_what_it_returned(model, returned):
    """Before: "nothing requires grad: no parameter or input has requires_grad=True, or ...", with
    every parameter requiring grad. Said the same by count_flops and profile."""
    built = model()
    assert all(p.requires_grad for p in built.parameters())
    said = f"backward=True but the forward returned {returned}, no floating tensor that depends on a parameter or input"
    with pytest.raises(UsageError, match=said):
        count_flops(built, torch.randn(4, 16), backward=True)
    with pytest.raises(UsageError, match=said):
        flopcount.profile(built, torch.randn(4, 16), backward=True, steps=1, warmup=0)


def test_backward_with_nothing_requiring_grad_says_only_that():
    frozen = Mlp().requires_grad_(False)
    with pytest.raises(UsageError, match="no parameter or input has requires_grad=True$"):
        count_flops(frozen, torch.randn(4, 16), backward=True)


def test_a_torchscript_model_s_fake_copy_refusal_names_torchscript():
    """estimate_memory runs on fake copies only: before, copy's "TypeError: cannot pickle
    'torch._C.ParameterDict' object"."""
    from flopcount.memory import estimate_memory

    with pytest.raises(UsageError, match=r"the model holds a TorchScript module \(a scripted Mlp\), which cannot be copied"):
        estimate_memory(WithScripted(), torch.randn(4, 16))
