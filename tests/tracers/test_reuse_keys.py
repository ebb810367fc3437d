"""Structural reuse's keys after issue #32's fifth speed pass (branch ``reuse2``): a subtree's key is a
number per distinct part (a parent's key holds its children's numbers), a tuple or list of plain
values read in a forward is keyed as itself, each module's reads are looked up together, the
caller's tensors are read with ``is_meta``, and a fake's ``__dict__`` is a copy of one split table.
Speed is not asserted (no timed tests: benchmarks/bench_reuse.py); what is asserted is that the
count stays exact where those shortcuts could break it: MACs and FLOPs derived by hand (the
derivation beside each model), the same rows with reuse off (``FLOPCOUNT_REUSE=0``: every call
traced), every tracer, train and eval, batch > 1, and the caller's model left as found."""

from __future__ import annotations

import math
import sys

import pytest
import torch
import torch.nn.functional as F
from _toy_stack import B, D
from _toy_stack import off_and_on as _both
from _toy_stack import rows as _rows
from torch import nn

from flopcount import count_flops
from flopcount.tracers.fake import copies

# the reuse key on stacks of 2 or 3 small blocks: every twin group keyed (the default policy would trace
# them: tests/conftest.py, ``reuse_always``)
pytestmark = pytest.mark.usefixtures("reuse_always")

TRACERS = ["auto", "dispatch", "jit"]


def _muls(result, name: str) -> int:
    """The FLOPs of ``aten::mul`` booked to module ``name`` itself."""
    return int(result.by_module_and_operator("flops").get(name, {}).get("aten::mul", 0))


class _Narrow(nn.Module):
    """Linear(D, D), then ``cut[1]`` of its D columns from ``cut[0]`` times a scale (``cut[2]``, else
    2.0), padded back and added: the scale's product is ``B * cut[1]`` FLOPs, the only product."""

    def __init__(self, cut) -> None:
        super().__init__()
        self.lin = nn.Linear(D, D)
        self.cut = cut

    def forward(self, x):
        y = self.lin(x)
        scale = self.cut[2] if len(self.cut) > 2 else 2.0
        return y + F.pad(y.narrow(1, self.cut[0], self.cut[1]) * scale, (0, D - self.cut[1]))


_CUTS = [(0, 4), (0, 4), (2, 4), (0, 6), [0, 6], [0, 6], (0, 6, 3.0), (0, 6, math.nan), (0, 6, math.nan)]


class _Cuts(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(_Narrow(cut) for cut in _CUTS)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


@pytest.mark.parametrize("tracer", TRACERS)
@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_layers_differing_only_in_a_tuple_or_list_they_read_count_each_their_own(monkeypatch, tracer, train):
    # A tuple of plain values is keyed as itself (not item by item): (0, 4) and (2, 4) must not match,
    # a list must not match the tuple of the same items, a float must stay keyed as a float (NaN
    # included: NaN != NaN, yet two NaN scales are one key)
    torch.manual_seed(0)
    model, inputs = _Cuts().train(train), (torch.randn(B, D),)
    off, on = _both(monkeypatch, model, inputs, tracer=tracer)
    assert _rows(on) == _rows(off)
    assert on.macs == len(_CUTS) * B * D * D  # one Linear(D, D) per block on B rows
    for i, cut in enumerate(_CUTS):
        assert _muls(on, f"blocks.{i}") == B * cut[1], i  # the scale's product on B x cut[1] values
    if tracer == "auto":
        assert on.reused_calls == 3  # blocks 1, 5 and 8 booked from 0, 4 and 7; the others read other values


class _Gate(nn.Module):
    def __init__(self, power: int) -> None:
        super().__init__()
        self.power = power

    def forward(self, x):
        for _ in range(self.power):
            x = x * x  # B * D products each
        return x


class _Pair(nn.Module):
    """Linear(D, D) -> gate (``power`` squarings) -> Linear(D, D), ``self.extra`` more squarings:
    2 * B * D * D MACs and (power + extra) * B * D products."""

    def __init__(self, power: int, extra: int) -> None:
        super().__init__()
        self.a = nn.Linear(D, D)
        self.gate = _Gate(power)
        self.b = nn.Linear(D, D)
        self.extra = extra

    def forward(self, x):
        x = self.b(self.gate(self.a(x)))
        for _ in range(self.extra):
            x = x * x
        return x


# (gate power, extra): blocks differ in what the child reads, in what the block reads, or not at all
_POWERS = [(1, 0), (1, 0), (2, 0), (1, 1), (1, 0), (2, 0)]


class _Pairs(nn.Module):
    def __init__(self, hooked: int = -1) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(_Pair(p, e) for p, e in _POWERS)
        self.shared = self.blocks[4]  # one block under two names: blocks.4 and shared
        if hooked >= 0:  # a hook on one block's child, doubling its output: B * D products more
            self.blocks[hooked].gate.register_forward_hook(lambda module, args, out: out * 2)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.shared(x)


@pytest.mark.parametrize("tracer", TRACERS)
@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("hooked", [-1, 1], ids=["no-hook", "hook"])
def test_layers_differing_in_a_childs_read_a_hook_or_shared_under_two_names(monkeypatch, tracer, train, hooked):
    # Each module's reads are looked up together: a block whose child reads another value (block 2),
    # whose own read differs (block 3), or whose child has a hook (block 1, second case) is traced;
    # the block shared under two names is called twice, its calls and rows under its canonical name
    torch.manual_seed(0)
    model, inputs = _Pairs(hooked).train(train), (torch.randn(B, D),)
    off, on = _both(monkeypatch, model, inputs, tracer=tracer)
    assert _rows(on) == _rows(off)
    calls = [*range(len(_POWERS)), 4]  # the shared block runs again at the end
    assert on.macs == len(calls) * 2 * B * D * D
    products = sum(_POWERS[i][0] + _POWERS[i][1] for i in calls) + (1 if hooked >= 0 else 0)
    muls = sum(v for k, v in on.by_operator("flops").items() if "mul" in k)
    assert muls == products * B * D
    assert {m.name: m.calls for m in on.modules}["blocks.4"] == 2
    if tracer == "auto":
        # booked from block 0: block 4 twice (its two calls), and block 1 when it has no hook; block 5
        # from block 2 (the same gate power)
        assert on.reused_calls == (4 if hooked < 0 else 3)


class _Resized(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(D, D), nn.ReLU()) for _ in range(4))

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


@pytest.mark.parametrize("tracer", TRACERS)
@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_a_parameter_reshaped_between_two_counts_is_seen_by_the_second(monkeypatch, tracer, train):
    torch.manual_seed(0)
    model, inputs = _Resized().train(train), (torch.randn(B, D),)
    first = count_flops(model, inputs, tracer=tracer)
    assert first.macs == 4 * B * D * D
    # block 2 made 2D wide inside and block 3 given 2D inputs: B * (D * 2D + 2D * D) more... exactly
    # B * (D * 2D) for block 2 and B * (2D * D) for block 3 instead of B * D * D each
    model.blocks[2][0] = nn.Linear(D, 2 * D)
    model.blocks[3][0] = nn.Linear(2 * D, D)
    off, on = _both(monkeypatch, model, inputs, tracer=tracer)
    assert _rows(on) == _rows(off)
    assert on.macs == 2 * B * D * D + 2 * B * D * 2 * D
    assert on.by_module("macs")["blocks.2"] == B * D * 2 * D
    if tracer == "auto":
        assert on.reused_calls == 1  # block 1 from block 0; blocks 2 and 3 have other shapes


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_a_meta_model_counts_as_its_real_twin(monkeypatch, train):
    # Parameters on meta stand for CPU ones (``is_meta``, read up front): a meta copy of a model
    # books the same rows as the model with real weights, reuse on and off
    torch.manual_seed(0)
    model, inputs = _Cuts().train(train), (torch.randn(B, D),)
    meta = _Cuts().train(train).to("meta")
    real = _both(monkeypatch, model, inputs)
    fake = []
    for reuse in ("0", "always"):  # (a meta model's state cannot be compared by value: counted as is)
        monkeypatch.setenv("FLOPCOUNT_REUSE", reuse)
        fake.append(count_flops(meta, (inputs[0].to("meta"),)))
    assert _rows(fake[1]) == _rows(fake[0])
    assert _rows(real[1])[1:] == _rows(fake[1])[1:]  # every row but to_dict() (its inputs say "meta")
    assert fake[1].macs == len(_CUTS) * B * D * D
    assert fake[1].reused_calls == 3
    assert all(p.is_meta for p in meta.parameters()) and meta.training == train


def test_a_fake_of_another_device_keeps_its_own():
    # A FakeTensor is meta underneath: the device it stands for is its own (``device``), not cpu
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    mode = FakeTensorMode()
    fake = FakeTensor(mode, torch.empty(2, 3, device="meta"), torch.device("cuda", 0))
    assert copies._stood_for(fake) == torch.device("cuda", 0)
    assert copies._stood_for(torch.empty(2, device="meta")) == torch.device("cpu")
    assert copies._stood_for(nn.Parameter(torch.empty(2, device="meta"))) == torch.device("cpu")


@pytest.mark.skipif(sys.implementation.name != "cpython", reason="CPython's split dictionaries")
def test_a_made_fake_holds_the_constructors_state_in_a_dictionary_no_larger():
    # A fake made from metadata (FakeMaker) holds the Python state a constructor-made fake holds,
    # as a copy of one split table, as the constructor's own (it sets them one at a time): its
    # __dict__ no larger than the constructor's (on CPython 3.11 it was 464 B against the
    # constructor's 304 B before, a dictionary filled by ``update``; 304 B now), the fast route taken
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    from flopcount.tracers.fake.making import FakeMaker

    mode = FakeTensorMode()
    maker = FakeMaker(mode, FakeTensor)
    cpu = torch.device("cpu")
    with torch._C._DisableTorchDispatch():
        maker.make((2, 3), (3, 1), torch.float32, cpu)  # the first: by the constructor, then checked
        made = maker.make((4, 5), (5, 1), torch.float16, cpu, requires_grad=True)
        built = FakeTensor(mode, torch.empty(4, 5, dtype=torch.float16, device="meta"), cpu)
    assert maker._fast is True
    assert type(made) is FakeTensor and made.fake_mode is mode and made.device == cpu
    assert (made.shape, made.stride(), made.dtype, made.requires_grad) == ((4, 5), (5, 1), torch.float16, True)
    assert vars(made).keys() == vars(built).keys()
    assert all(vars(made)[k] is v or vars(made)[k] == v for k, v in vars(built).items())
    assert sys.getsizeof(vars(made)) <= sys.getsizeof(vars(built))
