"""nn.TransformerEncoder under the built-in Megatron TP plan (its nn.MultiheadAttention swapped
for separate q/k/v/out Linears, flopcount/_tp_mha.py), against hand-derived formulas: per-rank
MACs 1/tp, the all-reduces of b·s·d activations, the tensor-parallel parameter shards; and the
swapped attention computing what nn.MultiheadAttention does."""

from __future__ import annotations

from typing import Any, Dict

import pytest
import torch
from torch import nn

import flopcount
from flopcount.errors import UsageError
from flopcount.planning.tp_mha import SplitSelfAttention

D, HEADS, FF, L, B, S = 32, 4, 64, 2, 3, 8
HEAD_DIM = D // HEADS


def encoder(heads: int = HEADS, batch_first: bool = True, **attention: Any) -> nn.Module:
    layer = nn.TransformerEncoderLayer(d_model=D, nhead=heads, dim_feedforward=FF, dropout=0.0, batch_first=batch_first)
    if attention:
        layer.self_attn = nn.MultiheadAttention(D, heads, batch_first=batch_first, **attention)
    return nn.TransformerEncoder(layer, num_layers=L, enable_nested_tensor=False)


@pytest.fixture(scope="module")
def plans() -> Dict[int, Any]:
    x = torch.randn(B, S, D, generator=torch.Generator().manual_seed(0))
    return {tp: flopcount.plan(encoder, (x,), tp=tp, on=None) for tp in (1, 2)}


def test_per_rank_macs_are_one_over_tp(plans: Dict[int, Any]) -> None:
    tokens = B * S
    projections = tokens * (D * 3 * D + D * D)  # q, k, v (packed in_proj at tp=1) and out_proj
    mlp = tokens * (D * FF + FF * D)
    scores_values = B * HEADS * S * S * HEAD_DIM  # one of q·kᵀ or p·v: b·heads·s²·d
    forward = L * (projections + mlp + 2 * scores_values)
    # backward: each Linear's weight and input gradients (layer 0's q/k/v input gradient is not
    # needed: the input does not require grad); attention: flash backward recomputes q·kᵀ and
    # takes 4 gradient matmuls (dV, dP, dQ, dK) = 5 of b·heads·s²·d
    backward = L * (2 * (projections + mlp) + 5 * scores_values) - tokens * D * 3 * D
    assert (plans[1].macs["forward"], plans[1].macs["backward"]) == (forward, backward)
    assert (plans[2].macs["forward"], plans[2].macs["backward"]) == (forward // 2, backward // 2)


def test_sequence_first_layers_split_the_same(plans: Dict[int, Any]) -> None:
    """batch_first=False: [s, b, d] inputs, the same MACs (oracle: the hand formula above, via tp=1)."""
    x = torch.randn(S, B, D)
    planned = flopcount.plan(lambda: encoder(batch_first=False), (x,), tp=2, on=None)
    assert dict(planned.macs) == {phase: n // 2 for phase, n in plans[1].macs.items()}
    assert planned.comm_totals("all_reduce", "tp").calls == 4 * L - 1


def test_all_reduces_of_bsd_per_layer(plans: Dict[int, Any]) -> None:
    rows = [r for r in plans[2].comm if r.kind == "all_reduce"]
    assert len(rows) == 1 and rows[0].dim == "tp"
    # forward: after out_proj and linear2; backward: the gradients of the attention input (once,
    # replicated by PrepareModuleInput) and of the MLP input, except layer 0's attention input
    # whose gradient is not computed (the model's input does not require grad)
    assert dict(rows[0].calls_by_phase) == {"forward": 2 * L, "backward": 2 * L - 1}
    assert rows[0].tensor_bytes == (4 * L - 1) * B * S * D * 4
    assert not plans[1].comm


def test_all_reduces_with_an_input_gradient() -> None:
    """A layer before the encoder makes layer 0's input need a gradient: 4 all-reduces per layer."""

    def build() -> nn.Module:
        return nn.Sequential(nn.Linear(D, D), encoder())

    planned = flopcount.plan(build, (torch.randn(B, S, D),), tp=2, on=None)
    row = planned.comm_totals("all_reduce", "tp")
    assert row.calls == 4 * L and row.tensor_bytes == 4 * L * B * S * D * 4


def test_parameter_bytes_per_rank_are_the_tp_shards(plans: Dict[int, Any]) -> None:
    # a layer: in_proj (3D x D + 3D) = q, k, v; out_proj (D x D + D); linear1 (FF x D + FF); linear2 (D x FF + D);
    # split in two: q/k/v, linear1 (weights and biases), out_proj and linear2 weights;
    # whole: the row-parallel biases (D each) and the two LayerNorms (2D each)
    split = (3 * D * D + 3 * D) + D * D + (FF * D + FF) + D * FF
    replicated = D + D + 2 * D + 2 * D
    assert plans[1].state_bytes["parameters"] == 4 * L * (split + replicated)
    assert plans[2].state_bytes["parameters"] == 4 * L * (split // 2 + replicated)
    assert plans[2].state_bytes["gradients"] == plans[2].state_bytes["parameters"]


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("train", [True, False])
def test_the_swapped_attention_computes_what_multihead_attention_does(batch_first: bool, train: bool) -> None:
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(D, HEADS, batch_first=batch_first)
    nn.init.normal_(mha.in_proj_bias)
    nn.init.normal_(mha.out_proj.bias)
    split = SplitSelfAttention(mha, HEADS)
    mha.train(train)
    split.train(train)
    x = torch.randn(B, S, D) if batch_first else torch.randn(S, B, D)
    padding = torch.zeros(B, S, dtype=torch.bool)
    padding[0, -3:] = True
    causal = torch.ones(S, S, dtype=torch.bool).triu(1)  # True: masked out
    masks = ({}, {"key_padding_mask": padding}, {"attn_mask": causal}, {"attn_mask": causal, "key_padding_mask": padding},
             {"attn_mask": nn.Transformer.generate_square_subsequent_mask(S)})  # a float mask, added
    for kw in masks:
        expected = mha(x, x, x, need_weights=False, **kw)[0]
        got, weights = split(x, x, x, need_weights=False, **kw)
        torch.testing.assert_close(got, expected)
        assert weights is None
    # the whole layer with the swapped attention, eval mode included (its fast path is skipped)
    layer = nn.TransformerEncoderLayer(D, HEADS, FF, dropout=0.0, batch_first=batch_first).train(train)
    expected = layer(x, src_key_padding_mask=padding)
    layer.self_attn = SplitSelfAttention(layer.self_attn, HEADS)
    torch.testing.assert_close(layer(x, src_key_padding_mask=padding), expected)


def test_unsupported_attention_is_a_usage_error() -> None:
    x = torch.randn(B, S, D)
    with pytest.raises(UsageError, match=r"num_heads divisible by tp=2 \(layers\.\* item 0: num_heads=1\)"):
        flopcount.plan(lambda: encoder(heads=1), (x,), tp=2, on=None)
    for attention in ({"add_bias_kv": True}, {"add_zero_attn": True}, {"kdim": 16, "vdim": 16}):
        with pytest.raises(UsageError, match=r"add_bias_kv or add_zero_attn \(layers\.\* item 0\)"):
            flopcount.plan(lambda: encoder(**attention), (x,), tp=2, on=None)


@pytest.mark.serial  # real gloo ranks (pyproject: markers)
def test_a_real_two_process_run_agrees(tmp_path: Any) -> None:
    """The encoder tp=2 run for real by 2 gloo processes (tests/plan/_plan_gloo.py): the same
    output as one process with the original nn.MultiheadAttention; CommDebugMode's collectives,
    the real collective tensors, the real shards and a real dispatch count equal to the plan's
    (the peak is left out: the real-run peak checks are order-dependent in a full tests/plan/ run)."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("needs torch.distributed with gloo")
    import _plan_gloo as gloo

    kind = {"c10d_functional.all_reduce": "all_reduce", "_c10d_functional.all_reduce": "all_reduce"}
    real = gloo.run_real("encoder", 1, 2, str(tmp_path), timeout=100)
    planned = flopcount.plan(gloo.tiny_encoder, (gloo.example_input("encoder"),), tp=2, on=None)
    torch.manual_seed(0)
    whole = gloo.tiny_encoder().train()
    with torch.no_grad():
        expected = float(whole(gloo.example_input("encoder")).double().square().sum())
    assert real["first_output"] == pytest.approx(expected, rel=1e-5)
    assert dict(planned.state_bytes) == real["state_bytes"]
    assert {r.kind: r.calls for r in planned.comm} == {kind[op]: n for op, n in real["comm_counts"].items()}
    assert [r.tensor_bytes for r in planned.comm] == [sum(size for _, size in real["collective_bytes"])]
    assert real["unsupported"] == {}
    assert (dict(planned.flops), dict(planned.macs)) == (real["flops"], real["macs"])
