"""The built-in LLaMA-family tensor-parallel plan and a norm over all the heads (branch stepsweep).

OLMo-2's attention normalizes the whole q and k projections (``q_norm``: RMSNorm of
heads x head_dim columns) before splitting them into heads. The built-in plan makes q_proj and
k_proj column-parallel, so each rank holds a slice of those columns, which a norm of the whole
width cannot take: the planned step failed deep in the norm ("Attempting to broadcast a
dimension of length 32") with a TraceError. The plan now refuses it up front with a UsageError
naming the norm, as it refuses heads that tp does not divide. Qwen3's q_norm/k_norm normalize
one head (head_dim columns) and are planned as before. Since branch tpfit the refusal is the one
rule of tests/plan/test_plan_tp_refusals.py (any parameter spanning a size the split shards).
"""

from __future__ import annotations

import warnings

import pytest
import torch

import flopcount
from flopcount.errors import UsageError

transformers = pytest.importorskip("transformers")

SIZES = dict(num_hidden_layers=1, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
             vocab_size=128, max_position_embeddings=64, use_cache=False)


def _ids() -> torch.Tensor:
    return torch.randint(0, 128, (2, 8), generator=torch.Generator().manual_seed(0))


def test_a_norm_over_all_the_heads_is_refused_by_the_built_in_tp_plan() -> None:
    def build() -> torch.nn.Module:
        return transformers.Olmo2ForCausalLM(transformers.Olmo2Config(**SIZES))

    with pytest.raises(UsageError, match=r"in model\.layers\.0\.self_attn, but its parameter q_norm\.weight \(shape \[64\]\) spans all 64"):
        flopcount.plan(build, (_ids(),), fsdp=1, tp=2, on=None)


def test_a_norm_over_one_head_is_planned_with_tp() -> None:
    def build() -> torch.nn.Module:
        return transformers.Qwen3ForCausalLM(transformers.Qwen3Config(head_dim=16, **SIZES))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = flopcount.plan(build, (_ids(),), fsdp=1, tp=2, on=None)
    assert result.tp == 2 and result.blocks == "model.layers"
