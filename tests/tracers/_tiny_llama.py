"""The tiny LLaMA the memory and reuse tests count at several depths (built on meta: no weights)."""

import torch
from torch import nn


def tiny_llama(layers: int, *, device: str = "meta", use_cache: bool = True) -> nn.Module:
    """A ``LlamaForCausalLM`` of width 32 (4 heads, 2 KV heads), vocabulary 64, ``layers`` deep,
    in training mode as built (callers call ``.eval()`` where they count inference)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, use_cache=use_cache,
    )
    with torch.device(device):
        return LlamaForCausalLM(config)
