"""Training cost with the dispatch tracer (backward=True): contraction FLOPs of the
backward pass equal torch.utils.flop_counter.FlopCounterMode's, measured live on the
same model and inputs; grouped/depthwise conv follows the hand derivation (where torch
ignores ``groups``); backward ops land on the module whose forward made them; and the
model is left exactly as found."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import assert_same_state, snapshot
from torch import nn
from torch.nn import functional as F
from torch.utils.flop_counter import FlopCounterMode

from flopcount import UsageError, count_flops


def torch_backward_flops(model: nn.Module, *inputs: torch.Tensor) -> int:
    """FlopCounterMode's count of the backward of ``model(*inputs).sum()`` alone."""
    model = copy.deepcopy(model)
    counter = FlopCounterMode(display=False)
    with counter:
        out = model(*inputs)
        forward = counter.get_total_flops()
        out.sum().backward()
    return int(counter.get_total_flops() - forward)


class BmmNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(6, 10)
        self.mix = nn.Parameter(torch.randn(3, 10, 4))

    def forward(self, x):
        h = self.proj(x)                       # (3, 5, 10): addmm via view
        return torch.bmm(h, self.mix)          # (3, 5, 4)


def mlp():
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))


def dense_cnn():
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.ReLU(),
        nn.Conv2d(8, 16, 3, bias=False), nn.ReLU(),
        nn.Flatten(), nn.Linear(16 * 6 * 6, 5),
    )


CASES = {
    "mlp": (mlp, lambda: (torch.randn(8, 32),)),
    "mlp_input_grad": (mlp, lambda: (torch.randn(8, 32, requires_grad=True),)),
    "bmm": (BmmNet, lambda: (torch.randn(3, 5, 6),)),
    "dense_cnn": (dense_cnn, lambda: (torch.randn(2, 3, 16, 16),)),
    "conv1d": (lambda: nn.Sequential(nn.Conv1d(4, 6, 5, stride=2, dilation=2)), lambda: (torch.randn(2, 4, 40, requires_grad=True),)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_backward_contractions_equal_flop_counter_mode(name):
    torch.manual_seed(0)
    build, inputs = CASES[name]
    model, args = build(), inputs()
    r = count_flops(model, args, tracer="dispatch", backward=True)
    assert set(r.by_phase()) == {"forward", "backward"}
    assert 2 * r.by_phase("macs")["backward"] == torch_backward_flops(model, *args)
    assert r.macs == r.by_phase("macs")["forward"] + r.by_phase("macs")["backward"]


def test_mlp_training_macs_by_hand_and_by_module():
    B = 8
    r = count_flops(mlp(), torch.randn(B, 32), tracer="dispatch", backward=True)
    fwd0, fwd2 = B * 32 * 64, B * 64 * 10
    assert r.by_phase("macs") == {"forward": fwd0 + fwd2, "backward": fwd0 + 2 * fwd2}
    # Layer 0 needs no grad_input (x does not require grad); layer 2 needs both.
    assert r.by_module("macs") == {"": 2 * fwd0 + 3 * fwd2, "0": 2 * fwd0, "1": 0, "2": 3 * fwd2}


def _conv_macs(conv: nn.Conv2d, out_hw: int, batch: int) -> int:
    k = conv.kernel_size[0] * conv.kernel_size[1]
    return batch * conv.out_channels * out_hw * out_hw * (conv.in_channels // conv.groups) * k


def test_grouped_and_depthwise_conv_backward_by_hand():
    """grad_weight and grad_input of a grouped conv each cost one forward's MACs;
    torch's formula ignores groups and counts depthwise backward as if dense."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1, bias=False),            # dense, input needs no grad
        nn.Conv2d(8, 8, 3, padding=1, groups=8, bias=False),  # depthwise
        nn.Conv2d(8, 16, 1, groups=4, bias=False),            # grouped pointwise
    )
    B, hw = 2, 10
    x = torch.randn(B, 3, hw, hw)
    r = count_flops(model, x, tracer="dispatch", backward=True)
    dense, depthwise, grouped = (_conv_macs(m, hw, B) for m in model)
    assert r.by_phase("macs")["forward"] == dense + depthwise + grouped
    assert r.by_phase("macs")["backward"] == dense + 2 * depthwise + 2 * grouped
    assert r.by_module("macs") == {"": 2 * dense + 3 * depthwise + 3 * grouped, "0": 2 * dense, "1": 3 * depthwise, "2": 3 * grouped}
    # torch over-counts here: its grad_weight formula runs the conv with batch C_in and C_out x B
    # channels, ignoring groups (depthwise: 8 x, grouped: 4 x); grad_input and the dense layer are exact
    torch_grad_weight = {"depthwise": 2 * 8 * (8 * 2) * 100 * 9, "grouped": 2 * 8 * (16 * 2) * 100 * 1}
    exact = 2 * (dense + 2 * depthwise + 2 * grouped)
    assert torch_grad_weight == {"depthwise": 8 * 2 * depthwise, "grouped": 4 * 2 * grouped}
    assert torch_backward_flops(model, x) == exact - 2 * (depthwise + grouped) + sum(torch_grad_weight.values())


def test_backward_leaves_model_as_found():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3)
            self.bn = nn.BatchNorm2d(4)
            self.drop = nn.Dropout(0.3)
            self.head = nn.Linear(4, 2)

        def forward(self, x):
            return self.head(self.drop(self.bn(self.conv(x))).mean((2, 3)))

    model = Net().train()
    model.head.eval()
    model.conv.bias.requires_grad_(False)
    model.head.weight.grad = torch.full_like(model.head.weight, 3.0)
    x = torch.randn(4, 3, 8, 8, requires_grad=True)
    before = snapshot(model)
    rng = torch.get_rng_state()
    grad_mode = torch.is_grad_enabled()
    r = count_flops(model, x, tracer="dispatch", backward=True)
    # x needs a gradient: conv grad_input and grad_weight (its bias is frozen), (4, 4, 6, 6) x 3 x 9
    # MACs each; the head (4 -> 2, batch 4): grad_input and grad_weight, 32 MACs each
    assert r.by_phase("macs")["backward"] == 2 * (4 * 4 * 6 * 6 * 3 * 9) + 2 * 32
    assert_same_state(model, before)
    assert model.bn.num_batches_tracked.item() == 0
    assert model.conv.weight.grad is None and x.grad is None
    assert torch.equal(model.head.weight.grad, torch.full_like(model.head.weight, 3.0))
    assert torch.equal(torch.get_rng_state(), rng) and torch.is_grad_enabled() == grad_mode


def test_loss_fn_ops_are_counted_at_the_root():
    model, x, target = mlp(), torch.randn(8, 32), torch.randint(0, 10, (8,))
    plain = count_flops(model, x, tracer="dispatch", backward=True)
    with_loss = count_flops(model, x, tracer="dispatch", backward=True, loss_fn=lambda out: F.cross_entropy(out, target))
    assert with_loss.by_phase("macs") == plain.by_phase("macs")
    # cross_entropy of (8, 10) logits: log_softmax 5 per element, nll 1 per target, the mean's divide
    assert with_loss.by_phase()["forward"] - plain.by_phase()["forward"] == 5 * 80 + 8 + 1
    extra = with_loss.by_module()[""] - plain.by_module()[""]
    assert extra == with_loss.by_phase()["forward"] - plain.by_phase()["forward"] + with_loss.by_phase()["backward"] - plain.by_phase()["backward"]
    assert with_loss.by_module()["2"] == plain.by_module()["2"]


def test_nothing_to_differentiate_is_a_usage_error():
    model = mlp().requires_grad_(False)
    with pytest.raises(UsageError, match="requires grad"):
        count_flops(model, torch.randn(2, 32), tracer="dispatch", backward=True)
    assert all(p.requires_grad is False for p in model.parameters())


def test_jit_refuses_backward_and_auto_uses_dispatch():
    with pytest.raises(UsageError):
        count_flops(mlp(), torch.randn(2, 32), tracer="jit", backward=True)
    assert count_flops(mlp(), torch.randn(2, 32), backward=True).tracer == "dispatch"


def test_meta_backward_equals_cpu_backward():
    pytest.importorskip("transformers")
    from examples import hf

    kwargs = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=96, vocab_size=500)
    torch.manual_seed(0)
    ids = hf.token_ids(1, 12, 500)
    on_cpu = count_flops(hf.llama(**kwargs), ids, tracer="dispatch", backward=True)
    with torch.device("meta"):
        meta_model = hf.llama(**kwargs)
    on_meta = count_flops(meta_model, ids.to("meta"), tracer="dispatch", backward=True)
    assert on_meta.by_phase("macs")["forward"] == on_cpu.by_phase("macs")["forward"]
    # SDPA backward: on CPU the fused flash kernel recomputes the scores QK^T, on meta the
    # math path's bmm backward runs (no recompute): B*H*Lq*Lk*E MACs per layer apart
    recompute = 1 * 4 * 12 * 12 * (64 // 4)
    assert on_cpu.by_phase("macs")["backward"] - on_meta.by_phase("macs")["backward"] == 2 * recompute
    cpu, meta = on_cpu.by_module("macs"), on_meta.by_module("macs")
    for layer in ("model.layers.0", "model.layers.1"):
        assert cpu[f"{layer}.self_attn"] - meta[f"{layer}.self_attn"] == recompute
    assert {name for name in cpu if cpu[name] != meta[name]} == {
        "", "model", "model.layers", "model.layers.0", "model.layers.0.self_attn", "model.layers.1", "model.layers.1.self_attn"
    }


def test_activation_checkpointing_recompute_is_backward_work_of_its_module():
    from torch.utils.checkpoint import checkpoint

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

        def forward(self, x):
            return self.b(torch.relu(self.a(x)))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.block, self.head = Block(), nn.Linear(8, 2)

        def forward(self, x):
            return self.head(checkpoint(self.block, x, use_reentrant=False))

    B = 4
    r = count_flops(Net(), torch.randn(B, 8), tracer="dispatch", backward=True)
    lin, head = B * 8 * 8, B * 8 * 2
    # Recompute runs a (b's output is not needed: checkpoint stops early); a needs no
    # grad_input (x does not require grad).
    assert r.by_module("macs") == {"": 6 * lin + 3 * head, "block": 6 * lin, "block.a": 3 * lin, "block.b": 3 * lin, "head": 3 * head}
    assert r.by_phase("macs") == {"forward": 2 * lin + head, "backward": 4 * lin + 2 * head}
