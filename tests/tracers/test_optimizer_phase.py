"""The optimizer phase: ``count_flops(..., backward=True, optimizer=...)`` books one
optimizer step after the backward under phase "optimizer".

Oracle: FLOPs per parameter element hand-derived from torch's optimizer loops
(torch/optim/adam.py, sgd.py) with the pointwise convention of docs/conventions.md
(add/mul/sqrt/div 1, addcmul/addcdiv 2, lerp 3; a scalar alpha folded into its op):
  Adam  = lerp 3 + mul 1 + addcmul 2 + sqrt 1 + div 1 + add eps 1 + addcdiv 2 = 11 per
          element, plus 1 per tensor for its step counter's ``+= 1``;
  AdamW = Adam + 1 (param.mul_(1 - lr*wd));
  SGD   = 1 (param.add_(grad, alpha=-lr)); momentum +2 (buf.mul_.add_); weight decay +1;
          nesterov +1.
FlopCounterMode counts no pointwise op, so it cannot be the oracle here. The forward and
backward are unchanged by adding the step, and nothing of the user's is stepped.
"""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import assert_same_state, snapshot
from torch import nn

from flopcount import UsageError, count_flops
from flopcount.handlers import default_registry
from flopcount.types import OpCall, TensorMeta


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def sizes(model: nn.Module, trainable_only: bool = True):
    return [p.numel() for p in model.parameters() if p.requires_grad or not trainable_only]


def adam(ns):  # 11 per element + the step counter
    return sum(11 * n + 1 for n in ns)


def adamw(ns):
    return sum(12 * n + 1 for n in ns)


SPECS = {
    "adamw": ("adamw", adamw),
    "adam": ("adam", adam),
    "sgd": ("sgd", lambda ns: sum(ns)),
    "sgd-momentum": ("sgd-momentum", lambda ns: 3 * sum(ns)),
    "AdamW class": (torch.optim.AdamW, adamw),
    "AdamW foreach": (lambda ps: torch.optim.AdamW(ps, foreach=True), adamw),
    "Adam fused": (lambda ps: torch.optim.Adam(ps, fused=True), adam),
    "AdamW fused": (lambda ps: torch.optim.AdamW(ps, fused=True), adamw),
    "Adam wd": (lambda ps: torch.optim.Adam(ps, weight_decay=0.1, foreach=False), lambda ns: adam(ns) + sum(ns)),
    "Adam amsgrad foreach": (lambda ps: torch.optim.Adam(ps, amsgrad=True, foreach=True), lambda ns: adam(ns) + sum(ns)),
    "SGD nesterov wd foreach": (
        lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01, foreach=True),
        lambda ns: 5 * sum(ns),
    ),
    "SGD nesterov wd fused": (
        lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01, fused=True),
        lambda ns: 5 * sum(ns),
    ),
}


@pytest.mark.parametrize("tracer", ["auto", "dispatch"])
@pytest.mark.parametrize("name", list(SPECS))
def test_optimizer_step_matches_the_hand_formula(name, tracer):
    spec, formula = SPECS[name]
    model, x = mlp(), torch.randn(3, 8)
    result = count_flops(model, (x,), tracer=tracer, backward=True, optimizer=spec)
    phases = result.by_phase()
    assert list(phases) == ["forward", "backward", "optimizer"]
    assert phases["optimizer"] == formula(sizes(model))
    assert result.by_phase("macs")["optimizer"] == 0
    assert result.complete and not result.unsupported_ops()
    # the step adds a phase and changes nothing else
    plain = count_flops(model, (x,), tracer=tracer, backward=True)
    assert {k: phases[k] for k in ("forward", "backward")} == plain.by_phase()


def test_frozen_and_unused_parameters_are_not_stepped():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.frozen = nn.Linear(8, 8)
            self.used = nn.Linear(8, 4)
            self.unused = nn.Linear(8, 100)  # no gradient: the optimizer skips it
            self.frozen.requires_grad_(False)

        def forward(self, x):
            return self.used(self.frozen(x))

    model = Net()
    result = count_flops(model, (torch.randn(2, 8),), backward=True, optimizer="adamw")
    assert result.by_phase()["optimizer"] == adamw([4 * 8, 4])


def test_tied_weights_are_stepped_once():
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(50, 16)
            self.head = nn.Linear(16, 50, bias=False)
            self.head.weight = self.emb.weight

        def forward(self, ids):
            return self.head(self.emb(ids))

    result = count_flops(Tied(), (torch.randint(0, 50, (2, 5)),), backward=True, optimizer="sgd")
    assert result.by_phase()["optimizer"] == 50 * 16


@pytest.mark.parametrize("tracer", ["auto", "dispatch"])
def test_the_users_model_and_optimizer_are_untouched(tracer):
    model, x = mlp(), torch.randn(3, 8)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1, weight_decay=0.5)
    model(x).sum().backward()
    opt.step()  # a real optimizer with real state and gradients present
    state_before = copy.deepcopy(opt.state_dict())
    grads_before = [p.grad.clone() for p in model.parameters()]
    before = snapshot(model)
    result = count_flops(model, (x,), tracer=tracer, backward=True, optimizer=opt)
    assert result.by_phase()["optimizer"] == adamw(sizes(model))
    assert_same_state(model, before)
    assert all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), grads_before))
    after = opt.state_dict()
    assert after["param_groups"] == state_before["param_groups"]
    for key, state in state_before["state"].items():
        for name, value in state.items():
            assert torch.equal(after["state"][key][name], value), (key, name)


def test_an_optimizer_instance_keeps_its_groups_and_settings():
    model = mlp()
    # group 0 (first Linear) with momentum and weight decay; group 1 plain SGD
    opt = torch.optim.SGD(
        [{"params": model[0].parameters(), "momentum": 0.9, "weight_decay": 0.1}, {"params": model[2].parameters()}], lr=0.1
    )
    result = count_flops(model, (torch.randn(3, 8),), backward=True, optimizer=opt)
    assert result.by_phase()["optimizer"] == 4 * sum(sizes(model[0])) + sum(sizes(model[2]))


def test_a_meta_model_counts_its_optimizer_step():
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    result = count_flops(model, (torch.randn(3, 8, device="meta"),), backward=True, optimizer="adam")
    assert result.by_phase()["optimizer"] == adam(sizes(model))


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"tracer": "jit", "backward": True, "optimizer": "adam"}, "optimizer= needs tracer='dispatch'"),
        ({"optimizer": "adam"}, "optimizer= needs backward=True"),
        ({"backward": True, "optimizer": "lion"}, "unknown optimizer 'lion'"),
        ({"backward": True, "optimizer": 3}, "optimizer must be a name"),
        ({"backward": True, "optimizer": lambda ps: None}, "returned NoneType"),
    ],
)
def test_optimizer_usage_errors(kwargs, fragment):
    with pytest.raises(UsageError, match=fragment.replace("(", r"\(").replace("'", ".")):
        count_flops(mlp(), (torch.randn(2, 8),), **kwargs)


def test_a_model_without_trainable_parameters_is_a_usage_error():
    model = mlp().requires_grad_(False)
    with pytest.raises(UsageError, match="no trainable parameter"):
        count_flops(model, (torch.randn(2, 8, requires_grad=True),), backward=True, optimizer="adam")


def _call(op, **args):
    return OpCall(op, args)


def test_foreach_ops_cost_the_sum_over_their_list():
    reg = default_registry()
    a, b = TensorMeta((3, 4), "float32"), TensorMeta((5,), "float32")
    steps = (TensorMeta((), "float32"), TensorMeta((), "float32"))
    cases = [
        ("aten::_foreach_add_", {"self": steps, "scalar": 1}, 2),  # 1 per element
        ("aten::_foreach_lerp_", {"self": (a, b), "tensors1": (a, b), "weight": 0.1}, 3 * 17),
        ("aten::_foreach_addcdiv_", {"self": (a, b), "tensor1": (a, b), "tensor2": (a, b)}, 2 * 17),
        ("aten::_foreach_addcmul_", {"self": (a, b), "tensor1": (a, b), "tensor2": (a, b)}, 2 * 17),
        ("aten::_foreach_sqrt", {"self": (a, b)}, 17),
        ("aten::_foreach_norm", {"self": (a, b), "ord": 2}, (2 * 12 + 1) + (2 * 5 + 1)),
        ("aten::_foreach_mul_", {"self": (TensorMeta((4,), "int64"),), "scalar": 2}, 0),  # integer: not floating point
        ("aten::_fused_adamw_", {"self": (a, b), "weight_decay": 0.01, "amsgrad": False}, 12 * 17),
        ("aten::_fused_sgd_", {"self": (a, b), "weight_decay": 0.0, "momentum": 0.9, "is_first_step": False}, 3 * 17),
    ]
    for op, args, flops in cases:
        handler = reg.resolve(op)
        assert callable(handler), op
        assert handler(_call(op, **args)).flops == flops, op
    assert reg.resolve("aten::_foreach_zero_") == "known-zero"
