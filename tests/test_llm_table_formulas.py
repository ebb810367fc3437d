"""benchmarks/llm_table.py's formula columns (issue #20.6): current Megatron-LM's
``num_floating_point_operations`` (megatron/training/training.py), derived by hand here.
The check figure is the issue's: 42.86 G training FLOPs per token for LLaMA-2-7B at 4096."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")

BENCH = next(p / "benchmarks" for p in Path(__file__).resolve().parents if (p / "benchmarks" / "llm_table.py").exists())
sys.path.insert(0, str(BENCH))

from llm_table import megatron_lm_current  # noqa: E402


def test_llama2_7b_at_4096_is_the_published_42_86_g() -> None:
    h, layers, ffn, vocab, s = 4096, 32, 11008, 32000, 4096
    # per layer: Q, K, V projections (full MHA: K = V = h), QK^T + AV over half the causal square, out proj,
    # SwiGLU MLP (three h x ffn matrices); then the logits; x 3 GEMM passes x 2 FLOPs per MAC
    per_layer = h * (h + 2 * h) + h * s + h * h + 3 * h * ffn
    expected = 6 * (layers * per_layer + h * vocab)
    assert expected == 42_863_689_728
    assert megatron_lm_current(transformers.LlamaConfig(), s) == expected  # LlamaConfig() is LLaMA-2-7B's shape


def test_gqa_and_moe_terms() -> None:
    s = 2048
    mistral = transformers.MistralConfig()  # 7B: h 4096, 8 KV heads of 128, SwiGLU 14336
    h, k = 4096, 8 * 128
    per_layer = h * (h + 2 * k) + h * s + h * h + 3 * h * 14336
    assert megatron_lm_current(mistral, s) == 6 * (32 * per_layer + h * 32000)
    mixtral = transformers.MixtralConfig()  # 8 experts of 14336, top-2, every layer MoE
    per_layer = h * (h + 2 * k) + h * s + h * h + 3 * h * 2 * 14336
    assert megatron_lm_current(mixtral, s) == 6 * (32 * per_layer + h * 32000)
    gpt2 = transformers.GPT2Config()  # GELU MLP of 4h: two matrices
    h = 768
    per_layer = h * 3 * h + h * 1023 + h * h + 2 * h * 4 * h
    assert megatron_lm_current(gpt2, 1023) == 6 * (12 * per_layer + h * 50257)
