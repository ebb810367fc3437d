"""The tiny LLaMA both serve attention-pricing test files build (tests/serving/test_serve_causal.py,
test_serve_chunked.py): its shapes, its config overrides, the H100 SXM datasheet's dense BF16 peak,
and its attention FLOPs by hand."""

from __future__ import annotations

from typing import Any, Dict

BF16 = 989.5e12
LAYERS, HEADS, HEAD_DIM, PROMPT, NEW = 2, 4, 16, 512, 8
CONFIG: Dict[str, Any] = dict(hidden_size=HEADS * HEAD_DIM, intermediate_size=128, num_hidden_layers=LAYERS,
                              num_attention_heads=HEADS, num_key_value_heads=2, vocab_size=50,
                              max_position_embeddings=2 * PROMPT)


def attention_flops(scores: float) -> float:
    """Attention FLOPs of one sequence's forward computing ``scores`` scores per head and layer:
    Q K^T and P V, each a MAC (2 FLOPs) per score and head dimension."""
    return 2 * 2 * LAYERS * HEADS * scores * HEAD_DIM
