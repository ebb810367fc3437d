"""transformers models built from configs (random weights, no download).

Requires the optional ``transformers`` package. Small variants keep tests fast;
``gpt2_small``/``bert_base`` are the published shapes.
"""

from __future__ import annotations

from typing import Any, Tuple

import torch


def gpt2(n_layer: int = 12, n_embd: int = 768, n_head: int = 12, vocab_size: int = 50257, n_positions: int = 1024) -> Any:
    from transformers import GPT2Config, GPT2LMHeadModel

    special = min(50256, vocab_size - 1)
    config = GPT2Config(
        n_layer=n_layer, n_embd=n_embd, n_head=n_head, vocab_size=vocab_size, n_positions=n_positions,
        bos_token_id=special, eos_token_id=special,
    )
    return GPT2LMHeadModel(config).eval()


def bert(num_hidden_layers: int = 12, hidden_size: int = 768, num_attention_heads: int = 12, intermediate_size: int = 3072, vocab_size: int = 30522) -> Any:
    from transformers import BertConfig, BertModel

    config = BertConfig(
        num_hidden_layers=num_hidden_layers,
        hidden_size=hidden_size,
        num_attention_heads=num_attention_heads,
        intermediate_size=intermediate_size,
        vocab_size=vocab_size,
    )
    return BertModel(config).eval()


def llama(
    num_hidden_layers: int = 2,
    hidden_size: int = 256,
    num_attention_heads: int = 8,
    num_key_value_heads: int = 2,
    intermediate_size: int = 688,
    vocab_size: int = 1000,
) -> Any:
    """A LLaMA-style decoder: RMSNorm, RoPE, grouped-query attention, SwiGLU MLP."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        num_hidden_layers=num_hidden_layers,
        hidden_size=hidden_size,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        intermediate_size=intermediate_size,
        vocab_size=vocab_size,
        max_position_embeddings=4096,
    )
    return LlamaForCausalLM(config).eval()


def _llama2_config(layers: int, hidden: int, heads: int, kv_heads: int, intermediate: int) -> Any:
    """A published LLaMA-2 size (Touvron et al., 2023): 32000-token vocabulary, 4096 positions."""
    from transformers import LlamaConfig

    return LlamaConfig(
        num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads, num_key_value_heads=kv_heads,
        intermediate_size=intermediate, vocab_size=32000, max_position_embeddings=4096,
    )


def llama2_7b_config() -> Any:
    return _llama2_config(32, 4096, 32, 32, 11008)


def llama2_70b_config() -> Any:
    return _llama2_config(80, 8192, 64, 8, 28672)


def token_ids(batch: int, seq: int, vocab: int, device: str = "cpu") -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    return torch.randint(0, vocab, (batch, seq), generator=generator).to(device)


def gpt2_small_example(seq: int = 256) -> Tuple[Any, Tuple[torch.Tensor]]:
    """``(model, example_inputs)`` for the CLI: GPT-2 small on one sequence."""
    return gpt2(), (token_ids(1, seq, 50257),)


__all__ = ["gpt2", "bert", "llama", "llama2_7b_config", "llama2_70b_config", "token_ids", "gpt2_small_example"]
