"""Mixture-of-experts models count exactly: grouped mm (transformers 5's default experts
path), eager and batched_mm experts, every tracer, against the analytical count derived
here from the config (REFERENCES.md, "Transformers 5.23 facts")."""

from __future__ import annotations

import warnings

import pytest
import torch
from conftest import assert_same_state, snapshot
from torch import nn

from flopcount import count_flops
from flopcount.handlers import build_default_registry
from flopcount.types import OpCall, TensorMeta

REG = build_default_registry()


def T(*shape, dtype="float32"):
    return TensorMeta(tuple(shape), dtype)


def grouped(op, **args):
    return REG.resolve(op)(OpCall(op, args, ()))


@pytest.mark.parametrize(
    "a, b, macs",
    [
        ((24, 8), (3, 8, 16), 24 * 8 * 16),  # rows split by offs (MoE experts)
        ((3, 16, 8), (8, 24), 16 * 8 * 24),  # columns split by offs
        ((16, 24), (24, 8), 16 * 24 * 8),  # contracted dim split by offs (grad of the weights)
        ((3, 16, 8), (3, 8, 16), 3 * 16 * 8 * 16),  # batched, no offs
    ],
)
def test_grouped_mm_shapes(a, b, macs):
    for op in ("aten::_grouped_mm", "aten::_scaled_grouped_mm"):
        cost = grouped(op, self=T(*a, dtype="bfloat16"), mat2=T(*b, dtype="bfloat16"), offs=T(3, dtype="int32"))
        assert (cost.macs, cost.flops) == (macs, 2 * macs)


class GroupedExperts(nn.Module):
    """Rows sorted by expert, one (K, N) weight per expert, offs = cumulative row counts."""

    def __init__(self, groups: int, k: int, n: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(groups, k, n))

    def forward(self, x: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
        return torch._grouped_mm(x, self.weight, offs=offs)


@pytest.mark.parametrize("tracer", ["jit", "dispatch", "auto"])
def test_grouped_mm_live_equals_sum_over_groups(tracer):
    counts = [5, 0, 9, 2]  # an empty group, uneven groups
    k, n = 8, 16
    offs = torch.tensor(counts, dtype=torch.int32).cumsum(0).to(torch.int32)
    model = GroupedExperts(len(counts), k, n)
    x = torch.randn(k, sum(counts)).t()  # non-contiguous rows
    before = snapshot(model)
    result = count_flops(model, (x, offs), tracer=tracer)
    assert_same_state(model, before)
    assert result.macs == sum(rows * k * n for rows in counts)
    assert result.unsupported_ops() == {}


def test_histc_counts_one_flop_per_element():
    cost = REG.resolve("aten::histc")(OpCall("aten::histc", {"self": T(28), "bins": 4, "min": 0, "max": 3}, (T(4),)))
    assert cost.flops == 28 and cost.macs == 0


# -- transformers MoE models ------------------------------------------------------------------


def _analytical_macs(cfg, batch: int, seq: int, experts: int, k: int, expert_inter: int, shared_inter: int = 0) -> int:
    """Forward MACs of a decoder-only MoE LM, derived from its config: attention
    projections, QK^T and AV (full Lq x Lk), router, k routed experts (gate, up, down),
    shared expert and its gate when present, LM head."""
    h = cfg.hidden_size
    heads, kv = cfg.num_attention_heads, cfg.num_key_value_heads
    head_dim = getattr(cfg, "head_dim", None) or h // heads
    tokens = batch * seq
    projections = h * heads * head_dim + 2 * h * kv * head_dim + heads * head_dim * h
    router = h * experts
    routed = k * 3 * h * expert_inter
    shared = (3 * h * shared_inter + h) if shared_inter else 0
    per_layer = tokens * (projections + router + routed + shared) + batch * heads * seq * seq * 2 * head_dim
    return cfg.num_hidden_layers * per_layer + tokens * h * cfg.vocab_size


def _mixtral():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.MixtralConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_local_experts=4,
        num_experts_per_tok=2,
        max_position_embeddings=64,
    )
    return cfg, _analytical_macs(cfg, 2, 7, experts=4, k=2, expert_inter=48)


def _qwen2_moe():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.Qwen2MoeConfig(
        vocab_size=96,
        hidden_size=32,
        intermediate_size=40,
        moe_intermediate_size=24,
        shared_expert_intermediate_size=36,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_experts=6,
        num_experts_per_tok=2,
        max_position_embeddings=64,
        decoder_sparse_step=1,
        mlp_only_layers=[],
    )
    return cfg, _analytical_macs(cfg, 2, 7, experts=6, k=2, expert_inter=24, shared_inter=36)


@pytest.mark.parametrize("build", [_mixtral, _qwen2_moe], ids=["mixtral", "qwen2_moe"])
@pytest.mark.parametrize("implementation", [None, "eager", "batched_mm"])
def test_moe_models_count_exactly(build, implementation):
    transformers = pytest.importorskip("transformers")
    cfg, expected = build()
    options = {} if implementation is None else {"experts_implementation": implementation}
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForCausalLM.from_config(cfg, **options).eval()
    if implementation is None:
        assert model.config._experts_implementation == "grouped_mm"  # the path that used to be dropped
    ids = torch.randint(0, cfg.vocab_size, (2, 7))
    before = snapshot(model)
    for tracer in ("jit", "dispatch", "auto"):
        result = count_flops(model, ids, tracer=tracer)
        assert result.unsupported_ops() == {}, tracer
        assert result.macs == expected, (tracer, result.macs, expected)
    assert_same_state(model, before)
