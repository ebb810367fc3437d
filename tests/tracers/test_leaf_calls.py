"""A call of torch's own BatchNorm module answered from an earlier call of the same key
(``tracers/_leaf_calls.py``, branch resnet13): its forward not run, its tensors not faked, its
events those the earlier call's ops recorded, under its own module stack.

Oracles: batch norm's FLOPs by hand (docs/conventions.md: eval, per element normalise 2 + affine 2,
per channel 2: ``4 N + 2 C``; training adds the statistics, ``4 N + 2 C`` more), the same count with
reuse off (``FLOPCOUNT_REUSE=0``: every call run) and on real weights (``tracer="dispatch"``), row
for row; the fakes made (one per tensor a forward that runs reads, counted by hand); the caller's
model left as found."""

from __future__ import annotations

import pytest
import torch
from _toy_stack import off_and_on, rows
from conftest import assert_same_state, snapshot
from torch import nn

from flopcount import count_flops
from flopcount.tracers import _leaf_calls
from flopcount.tracers.fake import copies

C, B = 16, 4  # channels, batch


def _eval_flops(batch: int = B) -> int:
    n = batch * C
    return 4 * n + 2 * C


class Norms(nn.Module):
    """``n`` BatchNorm1d(C) one after the other: one key when their settings agree."""

    def __init__(self, n: int = 6, **options) -> None:
        super().__init__()
        self.norms = nn.ModuleList(nn.BatchNorm1d(C, **options) for _ in range(n))

    def forward(self, x):
        for norm in self.norms:
            x = norm(x)
        return x


def _inputs(batch: int = B):
    return (torch.randn(batch, C, generator=torch.Generator().manual_seed(0)),)


@pytest.fixture
def fresh_answers(monkeypatch):
    """No answer kept from an earlier test; the fakes made from a pending tensor, counted."""
    monkeypatch.setattr(_leaf_calls, "_ANSWERS", {})
    made = []
    fake_pending = copies._Faker.fake_pending

    def counted(self, pending):
        made.append(pending)
        return fake_pending(self, pending)

    monkeypatch.setattr(copies._Faker, "fake_pending", counted)
    return made


def _same_as_off_and_real(monkeypatch, model, inputs, flops):
    off, on = off_and_on(monkeypatch, model, inputs)
    real = count_flops(model, inputs, tracer="dispatch")
    assert on.flops == off.flops == real.flops == flops
    assert rows(on) == rows(off)
    assert on.by_module() == real.by_module() and on.by_operator() == real.by_operator()
    return on


def test_equal_batch_norm_calls_after_the_first_run_no_forward_and_fake_nothing(monkeypatch, fresh_answers):
    torch.manual_seed(0)
    model = Norms(6).eval()
    _same_as_off_and_real(monkeypatch, model, _inputs(), 6 * _eval_flops())
    fresh_answers.clear()
    monkeypatch.setattr(_leaf_calls, "_ANSWERS", {})
    before = snapshot(model)
    result = count_flops(model, _inputs())
    assert_same_state(model, before)
    assert result.flops == 6 * _eval_flops()
    # the first call runs and fakes the four tensors batch norm reads in eval (weight, bias and the
    # running statistics: not num_batches_tracked); the five after it are answered (the parent: 24)
    assert len(fresh_answers) == 4
    first = model.norms[0]
    assert {id(p.real) for p in fresh_answers} == {id(first.weight), id(first.bias), id(first.running_mean), id(first.running_var)}
    fresh_answers.clear()
    count_flops(model, _inputs())  # answered from the count before (kept per process): nothing faked
    assert fresh_answers == []


def test_a_training_batch_norm_is_never_answered(monkeypatch, fresh_answers):
    # its running statistics and its counter are written in place: every call runs (5 tensors each)
    torch.manual_seed(0)
    model = Norms(6).train()
    on = _same_as_off_and_real(monkeypatch, model, _inputs(), 6 * 2 * _eval_flops())
    assert on.flops == 6 * 2 * _eval_flops()
    fresh_answers.clear()
    count_flops(model, _inputs())
    assert len(fresh_answers) == 6 * 5 and _leaf_calls._ANSWERS == {}


class Alternating(nn.Module):
    """Six BatchNorm1d(C), the odd ones differing from the even ones in ``change`` (one thing their
    forward reads, or the input they are given)."""

    def __init__(self, change: str) -> None:
        super().__init__()
        self.norms = nn.ModuleList(nn.BatchNorm1d(C, affine=not (k % 2 and change == "affine")) for k in range(6))
        self.wider = change == "batch"
        self.dtypes = [torch.float64 if k % 2 and change == "dtype" else torch.float32 for k in range(6)]
        for k, norm in enumerate(self.norms):
            if change == "eps" and k % 2:
                norm.eps = 1e-3
            elif change == "negative zero eps":
                norm.eps = -0.0 if k % 2 else 0.0
            elif change == "momentum" and k % 2:
                norm.momentum = None
            elif change == "dtype" and k % 2:
                norm.double()

    def forward(self, x):
        outs = []
        for k, norm in enumerate(self.norms):
            given = torch.cat([x, x]) if self.wider and k % 2 else x
            outs.append(norm(given.to(self.dtypes[k])))
        return outs


@pytest.mark.parametrize("change", ["eps", "negative zero eps", "affine", "momentum", "dtype", "batch"])
def test_calls_that_differ_in_what_the_forward_reads_or_is_given_are_keyed_apart(monkeypatch, fresh_answers, change):
    # each kind of call runs once (its tensors faked), the two others of its kind are answered
    torch.manual_seed(0)
    model = Alternating(change).eval()
    inputs = _inputs()
    off, on = off_and_on(monkeypatch, model, inputs)
    assert rows(on) == rows(off)
    odd_batch = 2 * B if change == "batch" else B
    flops = 3 * _eval_flops() + 3 * (_eval_flops(odd_batch) - (2 * odd_batch * C if change == "affine" else 0))
    assert on.flops == off.flops == count_flops(model, inputs, tracer="dispatch").flops == flops  # a cast: no FLOP
    fresh_answers.clear()
    monkeypatch.setattr(_leaf_calls, "_ANSWERS", {})
    count_flops(model, inputs)
    assert len(fresh_answers) == (4 + 2 if change == "affine" else 4 + 4)


def test_a_rebound_forward_runs_every_call(monkeypatch, fresh_answers):
    # nn.BatchNorm1d.forward rebound after flopcount's tracers were imported: run as written, every call
    torch.manual_seed(0)
    model = Norms(6).eval()
    ran = []
    forward = nn.BatchNorm1d.forward

    def spied(self, x):
        ran.append(self)
        return forward(self, x)

    monkeypatch.setattr(nn.BatchNorm1d, "forward", spied)
    result = count_flops(model, _inputs())
    assert result.flops == 6 * _eval_flops() and len(ran) == 6 and _leaf_calls._ANSWERS == {}


class Peeks(nn.Module):
    """A parent that reads its norms' weights before calling them: their tensors are faked already."""

    def __init__(self) -> None:
        super().__init__()
        self.norms = nn.ModuleList(nn.BatchNorm1d(C) for _ in range(6))

    def forward(self, x):
        for norm in self.norms:
            scale = norm.weight.shape[0]  # read before the call
            x = norm(x) * scale
        return x


def test_a_norm_whose_tensors_were_read_first_runs(monkeypatch, fresh_answers):
    torch.manual_seed(0)
    model = Peeks().eval()
    _same_as_off_and_real(monkeypatch, model, _inputs(), 6 * _eval_flops() + 6 * B * C)
    fresh_answers.clear()
    count_flops(model, _inputs())
    assert len(fresh_answers) == 6 * 4  # every call runs: a tensor faked already is not keyed


class Convs(nn.Module):
    """Six Conv2d(C, C, 3) keeping the shape (padding 1): the odd ones with ``odd`` options."""

    def __init__(self, **odd) -> None:
        super().__init__()
        self.convs = nn.ModuleList(nn.Conv2d(C, C, 3, padding=1, **(odd if k % 2 else {})) for k in range(6))

    def forward(self, x):
        for conv in self.convs:
            x = conv(x)
        return x


@pytest.mark.parametrize("odd", [{}, {"padding_mode": "reflect"}, {"bias": False}, {"groups": 4}],
                         ids=["equal", "reflect", "no bias", "groups"])
def test_equal_convolution_calls_are_answered_and_different_ones_run(monkeypatch, fresh_answers, odd):
    # a Conv2d(C, C, 3) on (1, C, H, W): C * C/groups * 9 MACs per output element, H * W * C of them
    torch.manual_seed(0)
    model = Convs(**odd).eval()
    h = w = 5
    inputs = (torch.randn(1, C, h, w, generator=torch.Generator().manual_seed(0)),)
    groups = odd.get("groups", 1)
    macs = 3 * h * w * C * C * 9 + 3 * h * w * C * (C // groups) * 9
    off, on = off_and_on(monkeypatch, model, inputs)
    assert on.macs == off.macs == count_flops(model, inputs, tracer="dispatch").macs == macs
    assert rows(on) == rows(off)
    fresh_answers.clear()
    monkeypatch.setattr(_leaf_calls, "_ANSWERS", {})
    count_flops(model, inputs)
    even = 2  # weight and bias, faked once: the first even call runs, the two after it are answered
    assert len(fresh_answers) == (even if not odd else even + (1 if odd.get("bias") is False else 2))


# --- resnet15: the copy of an answerable module holds its parameter and buffer dictionaries unread
# (fake/copies.UnreadTensors): an answered call makes no Pending for them; anything that reads them
# (its forward, the parent's code, a hook) takes them in first, as a copy made before did


@pytest.fixture
def pendings(monkeypatch):
    """The caller's tensors a Pending was made for (one per tensor of a dictionary taken in)."""
    made = []
    pending_of = copies._TreeCopier._pending_of

    def counted(self, tensor, key):
        made.append(tensor)
        return pending_of(self, tensor, key)

    monkeypatch.setattr(copies._TreeCopier, "_pending_of", counted)
    return made


def test_an_answered_norm_makes_no_pending(monkeypatch, fresh_answers, pendings):
    # the first of six equal norms runs (its 5 tensors: weight, bias, running mean and variance, the
    # counter); the five answered hold their dictionaries unread (the parent: 6 x 5 Pendings)
    torch.manual_seed(0)
    model = Norms(6).eval()
    before = snapshot(model)
    result = count_flops(model, _inputs())
    assert_same_state(model, before)
    assert result.flops == 6 * _eval_flops()
    first = model.norms[0]
    assert [id(t) for t in pendings] == [id(t) for t in (first.weight, first.bias, *first.buffers())]
    pendings.clear()
    assert count_flops(model, _inputs()).flops == 6 * _eval_flops()  # all six answered from the count before
    assert pendings == []


class ReadsAfter(nn.Module):
    """Six norms, the parent's code reading each one's weight after its call (``norm.weight``)."""

    def __init__(self) -> None:
        super().__init__()
        self.norms = nn.ModuleList(nn.BatchNorm1d(C) for _ in range(6))

    def forward(self, x):
        for norm in self.norms:
            x = norm(x) * norm.weight
        return x


def test_a_weight_the_parent_reads_after_an_answered_call_is_the_copy_s(monkeypatch, fresh_answers, pendings):
    # each norm's eval FLOPs and B x C multiplications by its weight; the five answered norms' parameter
    # dictionaries taken in when the weight is read (weight and bias: 2 Pendings each), their buffers never
    torch.manual_seed(0)
    model = ReadsAfter().eval()
    _same_as_off_and_real(monkeypatch, model, _inputs(), 6 * (_eval_flops() + B * C))
    fresh_answers.clear()
    pendings.clear()
    monkeypatch.setattr(_leaf_calls, "_ANSWERS", {})
    count_flops(model, _inputs())
    assert len(pendings) == 5 + 5 * 2
    assert len(fresh_answers) == 4 + 5  # the first call's four tensors, then each answered norm's weight


def test_a_hook_that_reads_the_weight_of_an_answered_norm(monkeypatch, fresh_answers, pendings):
    # a forward hook on each of the caller's norms scales the output by the module's weight: the hook
    # runs on the copy and reads the copy's weight (taken in then)
    torch.manual_seed(0)
    model = Norms(6).eval()
    handles = [norm.register_forward_hook(lambda module, args, out: out * module.weight) for norm in model.norms]
    try:
        _same_as_off_and_real(monkeypatch, model, _inputs(), 6 * (_eval_flops() + B * C))
        fresh_answers.clear()
        pendings.clear()
        monkeypatch.setattr(_leaf_calls, "_ANSWERS", {})
        count_flops(model, _inputs())
        assert len(pendings) == 5 + 5 * 2 and len(fresh_answers) == 4 + 5
    finally:
        for handle in handles:
            handle.remove()


class TiedAfterARead(nn.Module):
    """``a``, ``b``, ``c``: equal norms, ``c`` holding ``a``'s weight. ``b`` runs first; ``a`` is answered,
    then the parent reads ``a.weight`` (its fake made: the forward could change it); ``c`` must then run,
    its dictionary unread but its weight faked already through ``a``."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.BatchNorm1d(C), nn.BatchNorm1d(C), nn.BatchNorm1d(C)
        self.c.weight = self.a.weight

    def forward(self, x):
        x = self.a(self.b(x)) * self.a.weight
        return self.c(x)


def test_a_norm_whose_tied_weight_was_faked_through_another_module_runs(monkeypatch, fresh_answers):
    torch.manual_seed(0)
    model = TiedAfterARead().eval()
    _same_as_off_and_real(monkeypatch, model, _inputs(), 3 * _eval_flops() + B * C)
    fresh_answers.clear()
    monkeypatch.setattr(_leaf_calls, "_ANSWERS", {})
    count_flops(model, _inputs())
    # b runs (4 fakes), a answered then its weight read (1), c runs: its bias and statistics (3)
    assert len(fresh_answers) == 4 + 1 + 3
