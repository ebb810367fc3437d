"""The built-in LLaMA-family tensor-parallel plan refuses, before tracing anything, a block
whose attention or MLP holds a parameter the split cannot take (branch tpfit).

The plan makes q/k/v, gate and up column-parallel: each rank holds 1/tp of the q, k and v
columns, of the heads and key/value heads, and of the intermediate size. A parameter of
``self_attn`` or ``mlp`` outside the split Linears with one of those sizes as a dimension is a
whole tensor where the rank has a slice: BitNet's ``attn_sub_norm`` (a norm over all q columns),
Doge's ``A`` and ``dt_proj`` (over the key/value heads), OLMo-2's ``q_norm`` (all the heads'
columns), an MoE block's ``mlp`` without the split Linears. Before, the step was traced and
failed deep inside with torch's shape error in a TraceError (OLMo-2's was already a UsageError
of its own). Per-head norms (Qwen3's q_norm/k_norm, ``numel == head_dim``) are planned as before,
with the figures of the same split passed by hand as ``tp_plan`` and Megatron's all-reduces.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import pytest
import torch

import flopcount
from flopcount.errors import UsageError
from flopcount.planning.world import LLAMA_SPLIT, tp_styles

transformers = pytest.importorskip("transformers")

L, H, HEADS, KV, I, V = 2, 64, 4, 2, 128, 128
B, S = 2, 8
SIZES = dict(num_hidden_layers=L, hidden_size=H, num_attention_heads=HEADS, num_key_value_heads=KV,
             intermediate_size=I, vocab_size=V, max_position_embeddings=64, use_cache=False)
ADVICE = r"pass tp_plan=\{module path: ParallelStyle\}, or plan with tp=1"


def _ids() -> torch.Tensor:
    return torch.randint(0, V, (B, S), generator=torch.Generator().manual_seed(0))


def _plan(build: Callable[[], torch.nn.Module], **options: Any) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return flopcount.plan(build, (_ids(),), fsdp=1, tp=2, on=None, **options)


def test_a_norm_over_the_whole_q_width_is_refused() -> None:
    def build() -> torch.nn.Module:  # BitNet: self_attn.attn_sub_norm over heads x head_dim = 64 columns
        return transformers.BitNetForCausalLM(transformers.BitNetConfig(**SIZES))

    said = (r"gives each of tp=2 ranks 1/2 of the output columns of q_proj \(64\) in model\.layers\.0\.self_attn, "
            r"but its parameter attn_sub_norm\.weight \(shape \[64\]\) spans all 64, which a rank's share cannot take: ")
    with pytest.raises(UsageError, match=said + ADVICE):
        _plan(build)


def test_a_projection_over_the_key_value_heads_is_refused() -> None:
    def build() -> torch.nn.Module:  # Doge: self_attn.dt_proj [kv_heads, kv_heads x head_dim] and A [kv_heads]
        return transformers.DogeForCausalLM(transformers.DogeConfig(**SIZES))

    said = (r"1/2 of the output columns of k_proj and v_proj \(32\) in model\.layers\.0\.self_attn, "
            r"but its parameter dt_proj\.weight \(shape \[2, 32\]\) spans all 32")
    with pytest.raises(UsageError, match=said):
        _plan(build)


def test_a_norm_over_all_the_heads_is_refused_by_the_one_rule() -> None:
    def build() -> torch.nn.Module:  # OLMo-2: self_attn.q_norm over heads x head_dim = 64 columns
        return transformers.Olmo2ForCausalLM(transformers.Olmo2Config(**SIZES))

    said = r"in model\.layers\.0\.self_attn, but its parameter q_norm\.weight \(shape \[64\]\) spans all 64"
    with pytest.raises(UsageError, match=said):
        _plan(build)


def test_a_block_without_the_split_linears_is_refused() -> None:
    def build() -> torch.nn.Module:  # Qwen3-MoE: block 0's MLP dense, block 1's a sparse MoE block
        config = transformers.Qwen3MoeConfig(head_dim=16, moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2,
                                             mlp_only_layers=[0], **SIZES)
        return transformers.Qwen3MoeForCausalLM(config)

    said = r"but block model\.layers\.1 has no nn\.Linear mlp\.gate_proj, mlp\.up_proj, mlp\.down_proj"
    with pytest.raises(UsageError, match=said):
        _plan(build)


@pytest.mark.parametrize("name", ["llama", "qwen3", "mistral"])
def test_a_block_the_split_takes_is_planned_as_the_split_passed_by_hand(name: str) -> None:
    def build() -> torch.nn.Module:
        if name == "llama":
            return transformers.LlamaForCausalLM(transformers.LlamaConfig(**SIZES))
        if name == "qwen3":  # per-head q_norm/k_norm of head_dim weights
            return transformers.Qwen3ForCausalLM(transformers.Qwen3Config(head_dim=16, **SIZES))
        return transformers.MistralForCausalLM(transformers.MistralConfig(sliding_window=None, **SIZES))

    built_in = _plan(build)
    by_hand = _plan(build, tp_plan=tp_styles("model.layers.*", LLAMA_SPLIT))
    assert built_in.to_dict() == by_hand.to_dict()
    # Megatron: one all-reduce of [B, S, H] float32 after o_proj and one after down_proj per layer
    # in forward, and one of each input's gradient in backward
    all_reduce = built_in.comm_totals("all_reduce", "tp")
    assert all_reduce.tensor_bytes == 4 * L * B * S * H * 4
