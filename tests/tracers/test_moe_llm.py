"""Mixture-of-experts models count exactly: tiny transformers Mixtral and Qwen2-MoE
against their analytical active MACs, on CPU (routing as the router chose) and on meta
(routing unknown; each token goes to exactly k experts), plus active vs total parameters."""

from __future__ import annotations

from typing import Any, Dict

import pytest
import torch
from conftest import assert_same_state, snapshot
from torch import nn

import flopcount
from flopcount.tracers.fake.meta_kernels import ROUTING_NOTE

transformers = pytest.importorskip("transformers")

B, T = 2, 16
H, HEADS, KV_HEADS, VOCAB = 64, 4, 2, 128
HEAD_DIM = H // HEADS
E, K = 4, 2

MIXTRAL = dict(
    hidden_size=H, intermediate_size=96, num_hidden_layers=2, num_attention_heads=HEADS,
    num_key_value_heads=KV_HEADS, num_local_experts=E, num_experts_per_tok=K, vocab_size=VOCAB,
    max_position_embeddings=256,
)
QWEN2_MOE = dict(
    hidden_size=H, intermediate_size=80, moe_intermediate_size=48, shared_expert_intermediate_size=72,
    num_hidden_layers=3, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, num_experts=E,
    num_experts_per_tok=K, vocab_size=VOCAB, max_position_embeddings=256, decoder_sparse_step=1,
    mlp_only_layers=[1],
)


def _attention_per_token(layers: int) -> int:
    """q, k, v, o projections (GQA: k and v have KV_HEADS heads)."""
    return layers * (H * HEADS * HEAD_DIM * 2 + 2 * H * KV_HEADS * HEAD_DIM)


def _sdpa(layers: int) -> int:
    """QK^T and AV over the full T x T square (no causal halving), per sequence and head."""
    return layers * B * HEADS * T * T * 2 * HEAD_DIM


def mixtral_macs() -> int:
    c = MIXTRAL
    per_token = _attention_per_token(c["num_hidden_layers"])
    per_token += c["num_hidden_layers"] * (H * E + K * 3 * H * c["intermediate_size"])  # router + k experts
    per_token += H * VOCAB  # LM head
    return B * T * per_token + _sdpa(c["num_hidden_layers"])


def qwen2_moe_macs() -> int:
    c = QWEN2_MOE
    layers = c["num_hidden_layers"]
    sparse = layers - len(c["mlp_only_layers"])
    per_token = _attention_per_token(layers)
    per_token += sparse * (H * E + K * 3 * H * c["moe_intermediate_size"])  # router + k routed experts
    per_token += sparse * (3 * H * c["shared_expert_intermediate_size"] + H)  # shared expert + its gate
    per_token += (layers - sparse) * 3 * H * c["intermediate_size"]  # dense MLP layers
    per_token += H * VOCAB
    return B * T * per_token + _sdpa(layers)


def _build(model_type: str, config: Dict[str, Any], device: str, impl: str = "grouped_mm") -> torch.nn.Module:
    cfg = transformers.AutoConfig.for_model(model_type, **config)
    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(cfg, experts_implementation=impl)
    return model.eval()


CASES = [("mixtral", MIXTRAL, mixtral_macs), ("qwen2_moe", QWEN2_MOE, qwen2_moe_macs)]


@pytest.mark.parametrize("model_type,config,expected", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("tracer", ["dispatch", "auto", "jit"])
def test_moe_counts_exactly_on_cpu(model_type: str, config: Dict[str, Any], expected: Any, tracer: str) -> None:
    model = _build(model_type, config, "cpu")
    assert model.config._experts_implementation == "grouped_mm"  # the default path
    ids = torch.randint(0, VOCAB, (B, T))
    before = snapshot(model)
    result = flopcount.count_flops(model, (ids,), tracer=tracer)
    assert_same_state(model, before)
    assert result.macs == expected()
    # the routed experts alone: B T tokens x K experts x (gate, up, down) in every sparse layer
    experts = {"mixtral": 2 * K * 3 * H * MIXTRAL["intermediate_size"], "qwen2_moe": 2 * K * 3 * H * QWEN2_MOE["moe_intermediate_size"]}
    assert result.by_operator("macs").get("aten::_grouped_mm", 0) == B * T * experts[model_type]
    assert result.unsupported_ops() == {}
    # a real run routes for real; auto counts on fake copies and states the k-experts assumption
    assert (ROUTING_NOTE in result.warnings) == (tracer == "auto")


@pytest.mark.parametrize("model_type,config,expected", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("impl", ["grouped_mm", "batched_mm"])
def test_moe_counts_exactly_on_meta(model_type: str, config: Dict[str, Any], expected: Any, impl: str) -> None:
    model = _build(model_type, config, "meta", impl)
    ids = torch.empty(B, T, dtype=torch.int64, device="meta")
    result = flopcount.count_flops(model, (ids,), tracer="dispatch")
    assert result.macs == expected()
    assert result.complete, result.incomplete_reasons()
    if impl == "grouped_mm":
        assert ROUTING_NOTE in result.warnings  # said, but not a gap: the total is exact


@pytest.mark.parametrize("model_type,config,expected", CASES, ids=[c[0] for c in CASES])
def test_eager_experts_count_exactly_on_cpu(model_type: str, config: Dict[str, Any], expected: Any) -> None:
    model = _build(model_type, config, "cpu", "eager")
    result = flopcount.count_flops(model, (torch.randint(0, VOCAB, (B, T)),), tracer="dispatch")
    assert result.macs == expected()


def test_eager_experts_on_meta_fail_with_a_hint() -> None:
    model = _build("mixtral", MIXTRAL, "meta", "eager")
    with pytest.raises(flopcount.TraceError, match="experts_implementation='grouped_mm'.*mlp.experts|mlp.experts.*grouped_mm"):
        flopcount.count_flops(model, (torch.empty(B, T, dtype=torch.int64, device="meta"),), tracer="dispatch")


def test_moe_backward_on_meta_counts_grouped_mm_gradients() -> None:
    # forward + backward of the experts: each grouped matmul's two gradients cost as much as it does
    model = _build("mixtral", MIXTRAL, "meta")
    ids = torch.empty(B, T, dtype=torch.int64, device="meta")
    result = flopcount.count_flops(model, (ids,), tracer="dispatch", backward=True)
    forward = flopcount.count_flops(model, (ids,), tracer="dispatch")
    grouped_forward = forward.by_operator("macs")["aten::_grouped_mm"]
    assert grouped_forward == B * T * MIXTRAL["num_hidden_layers"] * K * 3 * H * MIXTRAL["intermediate_size"]
    assert result.by_operator("macs")["aten::_grouped_mm"] == 3 * grouped_forward


def _active_expected(model_type: str) -> int:
    if model_type == "mixtral":
        per_layer_inactive = (E - K) * 3 * H * MIXTRAL["intermediate_size"]
        return -MIXTRAL["num_hidden_layers"] * per_layer_inactive
    sparse = QWEN2_MOE["num_hidden_layers"] - len(QWEN2_MOE["mlp_only_layers"])
    return -sparse * (E - K) * 3 * H * QWEN2_MOE["moe_intermediate_size"]


@pytest.mark.parametrize("device", ["cpu", "meta"])
@pytest.mark.parametrize("model_type,config", [(c[0], c[1]) for c in CASES], ids=[c[0] for c in CASES])
def test_active_params(model_type: str, config: Dict[str, Any], device: str) -> None:
    model = _build(model_type, config, device)
    total = sum(p.numel() for p in model.parameters())
    ids = torch.zeros(B, T, dtype=torch.int64, device=device)
    result = flopcount.count_flops(model, (ids,), tracer="dispatch")
    assert result.params == total
    assert result.active_params == total + _active_expected(model_type)
    assert result.to_dict()["active_params"] == result.active_params
    assert "active per token" in result.table()


def test_dense_model_active_params_equal_params() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    result = flopcount.count_flops(model, (torch.randn(3, 4),))
    assert result.parameters.active is None
    assert result.active_params == result.params == 4 * 8 + 8 + 8 * 2 + 2
    assert "active per token" not in result.table()


def test_module_list_experts_use_k_from_the_argument() -> None:
    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.router = torch.nn.Linear(8, 4)
            self.experts = torch.nn.ModuleList(torch.nn.Linear(8, 8, bias=False) for _ in range(4))

    from flopcount.core.params import summarize_parameters

    block = Block()
    assert summarize_parameters(block).active is None  # k unknown: no claim
    assert summarize_parameters(block, experts_per_token=1).active == 8 * 4 + 4 + 64


def test_moe_in_train_mode_counts_the_same_and_stays_in_train_mode() -> None:
    model = _build("mixtral", MIXTRAL, "cpu").train()
    before = snapshot(model)
    result = flopcount.count_flops(model, (torch.randint(0, VOCAB, (B, T)),), tracer="dispatch")
    assert_same_state(model, before)
    assert result.macs == mixtral_macs()


def test_nonzero_on_meta_outside_experts_gets_a_generic_hint() -> None:
    # a detection head's score filter, not an MoE router: no word about experts_implementation
    class Filter(nn.Module):
        def forward(self, scores: torch.Tensor) -> torch.Tensor:
            return scores[torch.nonzero(scores > 0.5, as_tuple=True)]

    model = nn.Sequential()
    model.add_module("head", Filter())
    with pytest.raises(flopcount.TraceError, match="real weights and inputs") as info:
        flopcount.count_flops(model, (torch.empty(2, 7, device="meta"),), tracer="dispatch")
    assert "experts" not in str(info.value) and "'head'" in str(info.value)
