"""Readings beyond the forward count on real code (branch wild8), each against a live oracle:
an optimizer built with a tensor ``lr``/``betas`` (count_flops and estimate_memory refused it:
its constructor compared the real tensor under the fake parameters' mode), ``profile`` of a
model with a reentrant checkpoint (its timed steps raised: ``autograd.grad`` is refused there),
and the bytes of oneDNN's LSTM backward, which read the kernel's workspace on real tensors
only (``profile``'s row was not ``count_flops``'s)."""

from __future__ import annotations

import contextlib
import copy
from typing import Any, Callable, List

import pytest
import torch
import torch.utils.checkpoint as ckpt
from _live_oracles import warmed_step_peak
from conftest import assert_same_state, snapshot
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

import flopcount
from flopcount.devices.roofline import Roofs

ROOFS = Roofs({"float32": 1e11}, 1e10, "test roofs", "given")

#: FLOPs per output element of the pointwise ops an optimizer step runs (docs/conventions.md,
#: "Optimizer step"); every other op of the step (item, copies) is 0
_PRICE = {"add": 1, "add_": 1, "sub": 1, "mul": 1, "mul_": 1, "div": 1, "div_": 1, "neg": 1, "sqrt": 1,
          "rsub": 1, "pow": 1, "addcmul_": 2, "addcdiv_": 2, "lerp_": 3}
_FREE = {"_local_scalar_dense", "copy_", "clone", "detach", "_to_copy", "zeros_like", "lift_fresh", "alias"}


class _StepOps(TorchDispatchMode):
    """The FLOPs of the ops a real step runs, priced by :data:`_PRICE`."""

    def __init__(self) -> None:
        super().__init__()
        self.flops = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        name = func._schema.name.split("::")[1]
        if name in _PRICE:
            self.flops += _PRICE[name] * (out if isinstance(out, torch.Tensor) else args[0]).numel()
        elif not name.startswith("_record_function"):
            assert name in _FREE, f"the oracle has no price for {name}"
        return out


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))


def _real_step_flops(model: nn.Module, x: torch.Tensor, make: Callable[[Any], torch.optim.Optimizer]) -> int:
    """The FLOPs of the second real step of ``make``'s optimizer (its state made by the first)."""
    model = copy.deepcopy(model)
    opt = make(model.parameters())
    model(x).sum().backward()
    opt.step()
    with _StepOps() as ops:
        opt.step()
    return ops.flops


TENSOR_OPTIONS = {
    "adam-lr": lambda ps: torch.optim.Adam(ps, lr=torch.tensor(1e-3)),
    "adamw-lr-betas": lambda ps: torch.optim.AdamW(ps, lr=torch.tensor(1e-3), betas=(torch.tensor(0.9), torch.tensor(0.999))),
    "sgd-lr-momentum": lambda ps: torch.optim.SGD(ps, lr=torch.tensor(0.1), momentum=0.9),
}


@pytest.mark.parametrize("name", list(TENSOR_OPTIONS))
def test_an_optimizer_with_tensor_options_is_counted_as_its_real_step(name: str) -> None:
    model, x = _mlp(), torch.randn(4, 16)
    opt = TENSOR_OPTIONS[name](model.parameters())
    lr = opt.param_groups[0]["lr"]
    before = snapshot(model)
    result = flopcount.count_flops(model, (x,), backward=True, optimizer=opt)
    assert result.by_phase()["optimizer"] == _real_step_flops(model, x, TENSOR_OPTIONS[name])
    assert_same_state(model, before)
    assert opt.param_groups[0]["lr"] is lr and float(lr) == float(TENSOR_OPTIONS[name]([nn.Parameter(torch.ones(1))]).param_groups[0]["lr"])
    assert not opt.state  # the caller's optimizer never stepped


def test_an_adam_with_a_tensor_lr_costs_two_scalar_ops_more_per_tensor_by_hand() -> None:
    # the formula beside the live oracle: Adam's 11 per element + the step counter's 1 per tensor,
    # and with a tensor lr the real step's lr / bias_correction1 and its negation, 0-d, per tensor
    model, x = _mlp(), torch.randn(4, 16)
    elements, tensors = sum(p.numel() for p in model.parameters()), len(list(model.parameters()))
    result = flopcount.count_flops(model, (x,), backward=True, optimizer=TENSOR_OPTIONS["adam-lr"](model.parameters()))
    assert result.by_phase()["optimizer"] == 11 * elements + 3 * tensors


def test_estimate_memory_of_a_step_with_a_tensor_lr_is_memtrackers() -> None:
    model, x = _mlp(), torch.randn(64, 16)
    make = TENSOR_OPTIONS["adamw-lr-betas"]
    estimate = flopcount.estimate_memory(model, (x,), backward=True, optimizer=make(model.parameters()))
    assert estimate.peak_bytes == warmed_step_peak(model, x, make)


class _Reentrant(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(16, 32)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 32)) for _ in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for block in self.blocks:
            x = ckpt.checkpoint(block, x, use_reentrant=True)
        return x


def test_profile_runs_the_backward_of_a_reentrant_checkpoint_and_leaves_grads_as_found() -> None:
    torch.manual_seed(0)
    model, x = _Reentrant(), torch.randn(8, 16)
    for p in model.parameters():
        p.grad = torch.full_like(p, 3.0)  # a gradient the caller accumulated
    called: List[int] = []
    model.inp.weight.register_post_accumulate_grad_hook(lambda p: called.append(1))
    before = snapshot(model)
    truth = copy.deepcopy(model)
    with FlopCounterMode(display=False) as counter:
        truth(x).sum().backward()  # forward, backward with each block's recompute
    result = flopcount.profile(model, (x,), backward=True, roofs=ROOFS, warmup=1, steps=2)
    assert 2 * sum(int(row.macs) for row in result.by_operator().values()) == counter.get_total_flops()
    assert_same_state(model, before)
    assert not called


def test_lstm_backward_bytes_are_the_same_on_real_and_fake_tensors() -> None:
    torch.manual_seed(0)
    lstm, x = nn.LSTM(16, 32, num_layers=2, batch_first=True), torch.randn(2, 5, 16)
    # oneDNN's layer backward reads, per layer (fp32, B = 2, T = 5, H = 32, 4 gates): its input
    # (T, B, I), W_ih (4H, I), W_hh (4H, H), two biases (4H), h0 and c0 (B, H), the forward's output
    # (T, B, H), hy and cy (B, H), and the gradients of output, hy and cy (the default loss sums
    # all three); not the workspace only the real kernel sizes
    def layer(inputs: int) -> int:
        return 4 * (5 * 2 * inputs + 4 * 32 * inputs + 4 * 32 * 32 + 2 * 4 * 32 + 2 * 2 * 32
                    + 5 * 2 * 32 + 2 * 2 * 32 + 5 * 2 * 32 + 2 * 2 * 32)

    hand = layer(16) + layer(32)
    counted = flopcount.count_flops(lstm, (x,), backward=True).operator_totals()["aten::mkldnn_rnn_layer_backward"]
    profiled = flopcount.profile(lstm, (x,), backward=True, roofs=ROOFS, warmup=0, steps=1).by_operator()
    assert counted.bytes_read == hand == 69_504
    assert profiled["aten::mkldnn_rnn_layer_backward"].bytes_read == hand
    assert profiled["aten::mkldnn_rnn_layer_backward"].bytes_written == counted.bytes_written


class _InnerStep(nn.Module):
    """A MAML-style forward: one inner gradient step on its own loss (create_graph), then the
    forward with the adapted weights; ``enable`` turns grad mode on around the inner step."""

    def __init__(self, enable: bool) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16))
        self.enable = enable

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.enable_grad() if self.enable else contextlib.nullcontext():
            params = dict(self.net.named_parameters())
            inner = torch.func.functional_call(self.net, params, (x,)).pow(2).mean()
            grads = torch.autograd.grad(inner, list(params.values()), create_graph=True)
            fast = {name: p - 0.1 * g for (name, p), g in zip(params.items(), grads)}
            return torch.func.functional_call(self.net, fast, (x,))


@pytest.mark.parametrize("tracer", ["auto", "dispatch"])
def test_a_forward_that_differentiates_is_refused_naming_grad_mode_and_counted_with_it_on(tracer: str) -> None:
    torch.manual_seed(0)
    x = torch.randn(8, 16)
    with pytest.raises(flopcount.TraceError, match=r"differentiates inside itself.*torch\.enable_grad\(\)"):
        flopcount.count_flops(_InnerStep(enable=False), (x,), tracer=tracer)
    model = _InnerStep(enable=True)
    with FlopCounterMode(display=False) as counter:
        copy.deepcopy(model)(x)
    assert 2 * flopcount.count_flops(model, (x,), tracer=tracer).macs == counter.get_total_flops() == 57_344


class _SparseLookup(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.table, self.head = nn.Embedding(100, 16, sparse=True), nn.Linear(16, 4)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.table(ids))


@pytest.mark.parametrize("make", [lambda ps: torch.optim.SGD(ps, lr=0.1), lambda ps: torch.optim.SparseAdam(ps)], ids=["sgd", "sparse-adam"])
def test_an_optimizer_step_over_a_sparse_gradient_is_refused_naming_it(make: Callable[[Any], torch.optim.Optimizer]) -> None:
    torch.manual_seed(0)
    model, ids = _SparseLookup(), torch.randint(0, 100, (4, 6))
    real = copy.deepcopy(model)
    real(ids).sum().backward()
    grad = real.table.weight.grad
    # the real step adds the looked-up rows only: SGD's add_ of a sparse gradient with 24 rows of 16,
    # 384 FLOPs where a dense step over the table's 1,600 elements would be counted
    assert grad is not None and grad.is_sparse and grad._nnz() * 16 == 384
    with pytest.raises(flopcount.UsageError, match=r"'table' makes a sparse gradient"):
        flopcount.count_flops(model, (ids,), backward=True, optimizer=make([model.table.weight]))


@pytest.mark.parametrize("optimizer", [None, "sgd"])
def test_a_sparse_gradients_memory_and_plan_are_refused_naming_it(optimizer: Any) -> None:
    """walk27: count_flops refuses the step (above); estimate_memory and plan failed on it with
    ``NeedsValues: aten::_sparse_coo_tensor_with_dims_and_tensors on a meta/fake tensor`` at the
    root module (MemTracker reads every tensor's storage, which a sparse gradient has not, fake
    or real). They refuse it naming the module and what to do, and leave the model as found."""
    model, ids = _SparseLookup(), torch.randint(0, 100, (4, 6))
    before = snapshot(model)
    with pytest.raises(flopcount.TraceError, match=r"^estimate_memory: 'table' makes a sparse gradient") as refused:
        flopcount.estimate_memory(model, (ids,), backward=True, optimizer=optimizer)
    assert refused.value.module_path == "table"  # docs/memory.md: refused with a TraceError, naming it
    assert_same_state(model, before)
    with pytest.raises(flopcount.TraceError, match=r"^plan: 'table' makes a sparse gradient") as refused:
        flopcount.plan(_SparseLookup, (ids,), optimizer=optimizer or "sgd")
    assert refused.value.module_path == "table"


def test_a_frozen_or_forward_only_sparse_table_is_estimated_as_a_dense_one() -> None:
    """The refusal is of a sparse gradient only: forward-only, or with the table frozen, no gradient
    is made, and the estimate equals the same model's with ``sparse=False`` (the flag changes
    nothing else)."""
    ids = torch.randint(0, 100, (4, 6))
    models = [_SparseLookup(), _SparseLookup()]
    models[1].table.sparse = False
    assert len({flopcount.estimate_memory(m, (ids,)).peak_bytes for m in models}) == 1
    for m in models:
        m.table.weight.requires_grad_(False)
    peaks = {flopcount.estimate_memory(m, (ids,), backward=True, optimizer="sgd").peak_bytes for m in models}
    assert len(peaks) == 1


@pytest.mark.parametrize("tracer", ["auto", "dispatch"])
def test_a_forward_that_differentiates_its_parameters_is_counted_with_its_backward(tracer: str) -> None:
    torch.manual_seed(0)
    model, x = _InnerStep(enable=True), torch.randn(8, 16)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    before = snapshot(model)
    with FlopCounterMode(display=False) as counter:
        copy.deepcopy(model)(x).sum().backward()  # the inner step's gradient, the forward, the backward of both
    result = flopcount.count_flops(model, (x,), tracer=tracer, backward=True)
    assert 2 * result.macs == counter.get_total_flops() == 147_456
    assert_same_state(model, before)
