"""The transformers part of the coverage zoo: small configs of 25 architectures, built
with ``from_config`` (random weights, no download), batch 2, and an analytical MAC count
derived from the config where the architecture is regular enough to write one down.

Analytical count (docs/coverage.md, /work/shared/REFERENCES.md): every Linear / Conv1D
weight's in × out per token that passes through it (embeddings excluded, LM head
included), plus attention B·H·Lq·Lk·2·head_dim per layer (QKᵀ and AV, no causal halving);
MoE layers: router hidden × experts + top_k × 3 × hidden × expert_ff per token.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional

import torch
from zoo_nn import Case, Inputs

B, T, TD = 2, 16, 8  # batch, (encoder) tokens, decoder tokens
D, H, HD, L, FF, V = 64, 4, 16, 2, 128, 128  # hidden, heads, head dim, layers, ffn, vocab
KV = 2  # key/value heads for the grouped-query decoders
E, K, EFF = 4, 2, 32  # experts, experts per token, expert ffn


def _ids(length: int = T) -> torch.Tensor:
    return torch.randint(3, V, (B, length), generator=torch.Generator().manual_seed(0))


def _attn(lq: int, lk: int, heads: int = H, head_dim: int = HD) -> int:
    return B * heads * lq * lk * 2 * head_dim


def _encoder(layers: int = L, tokens: int = T, ff: int = FF) -> int:
    """Post-/pre-norm encoder layers: q, k, v, o (d×d each), two FFN linears, attention."""
    return layers * (B * tokens * (4 * D * D + 2 * D * ff) + _attn(tokens, tokens))


def _decoder_gqa(ff: int = FF, gated: bool = True, kv: int = KV, mlp: Optional[int] = None) -> int:
    """LLaMA-style decoder layers + LM head: q/o d×H·hd, k/v d×KV·hd, (gated) MLP."""
    proj = 2 * D * H * HD + 2 * D * kv * HD
    mlp_macs = mlp if mlp is not None else (3 if gated else 2) * D * ff
    return L * (B * T * (proj + mlp_macs) + _attn(T, T)) + B * T * D * V


def _seq2seq(enc_ff: int = FF, dec_ff: int = FF) -> int:
    """Encoder on T tokens, decoder on TD tokens with self- and cross-attention (no LM head)."""
    enc = _encoder(tokens=T, ff=enc_ff)
    dec_self = B * TD * 4 * D * D + _attn(TD, TD)
    dec_cross = B * TD * 2 * D * D + B * T * 2 * D * D + _attn(TD, T)
    dec_ffn = B * TD * 2 * D * dec_ff
    return enc + L * (dec_self + dec_cross + dec_ffn)


def _analytic() -> Dict[str, int]:
    pooler = B * D * D
    moe_tok = D * E + K * 3 * D * EFF
    whisper_frames = 2 * T
    whisper_conv = B * D * whisper_frames * 16 * 3 + B * D * T * D * 3  # conv1 (16 mels, k=3), conv2 (stride 2)
    patches = (32 // 8) ** 2
    return {
        "bert": _encoder() + pooler,
        "roberta": _encoder() + pooler,
        "electra": _encoder(),
        "distilbert": _encoder(),
        "albert": B * T * 32 * D + _encoder() + pooler,  # embedding projection 32 -> D
        "gpt2": L * (B * T * 12 * D * D + _attn(T, T)) + B * T * D * V,
        "llama": _decoder_gqa(),
        "mistral": _decoder_gqa(),
        "qwen2": _decoder_gqa(),
        "qwen3": _decoder_gqa(),
        "gemma": _decoder_gqa(),
        "phi": _decoder_gqa(gated=False, kv=H),
        "gpt_neox": _decoder_gqa(gated=False, kv=H),
        "opt": _decoder_gqa(gated=False, kv=H),
        "mixtral": _decoder_gqa(mlp=moe_tok),
        "qwen2_moe": _decoder_gqa(mlp=moe_tok + 3 * D * EFF + D),  # + shared expert and its gate
        "qwen3_moe": _decoder_gqa(mlp=moe_tok),
        "t5": _seq2seq(),
        "bart": _seq2seq(),
        "whisper": whisper_conv + _seq2seq(),
        "vit": B * patches * D * 3 * 64 + _encoder(tokens=patches + 1) + pooler,
    }


def _configs() -> Dict[str, Dict[str, Any]]:
    bert_like = dict(hidden_size=D, num_hidden_layers=L, num_attention_heads=H, intermediate_size=FF, vocab_size=V)
    llama_like = dict(hidden_size=D, num_hidden_layers=L, num_attention_heads=H, num_key_value_heads=KV,
                      intermediate_size=FF, vocab_size=V, head_dim=HD, max_position_embeddings=64)
    moe = dict(llama_like, num_experts_per_tok=K)
    seq2seq = dict(d_model=D, encoder_layers=L, decoder_layers=L, encoder_attention_heads=H,
                   decoder_attention_heads=H, encoder_ffn_dim=FF, decoder_ffn_dim=FF, vocab_size=V)
    return {
        "bert": bert_like,
        "roberta": dict(bert_like, pad_token_id=1),
        "deberta-v2": bert_like,
        "albert": dict(bert_like, embedding_size=32),
        "distilbert": dict(dim=D, n_layers=L, n_heads=H, hidden_dim=FF, vocab_size=V),
        "electra": dict(bert_like, embedding_size=D),
        "gpt2": dict(n_embd=D, n_layer=L, n_head=H, vocab_size=V, n_positions=64, bos_token_id=0, eos_token_id=0),
        "llama": llama_like,
        "mistral": llama_like,
        "qwen2": llama_like,
        "qwen3": llama_like,
        "gemma": llama_like,
        "phi": dict(hidden_size=D, num_hidden_layers=L, num_attention_heads=H, intermediate_size=FF, vocab_size=V,
                    max_position_embeddings=64),
        "gpt_neox": dict(hidden_size=D, num_hidden_layers=L, num_attention_heads=H, intermediate_size=FF,
                         vocab_size=V, max_position_embeddings=64),
        "opt": dict(hidden_size=D, num_hidden_layers=L, num_attention_heads=H, ffn_dim=FF, vocab_size=V,
                    word_embed_proj_dim=D, max_position_embeddings=64),
        "mixtral": dict(moe, num_local_experts=E, intermediate_size=EFF),
        "qwen2_moe": dict(moe, num_experts=E, moe_intermediate_size=EFF, shared_expert_intermediate_size=EFF),
        "qwen3_moe": dict(moe, num_experts=E, moe_intermediate_size=EFF),
        "t5": dict(d_model=D, d_kv=HD, num_heads=H, d_ff=FF, num_layers=L, num_decoder_layers=L, vocab_size=V),
        "bart": dict(seq2seq, max_position_embeddings=64),
        "whisper": dict(seq2seq, num_mel_bins=16, max_source_positions=T, max_target_positions=64, pad_token_id=1,
                        bos_token_id=0, eos_token_id=2, decoder_start_token_id=0),
        "vit": dict(bert_like, image_size=32, patch_size=8),
        "swin": dict(image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 2], window_size=4),
        "convnext": dict(image_size=32, hidden_sizes=[16, 32], depths=[1, 1], num_stages=2),
        "wav2vec2": dict(bert_like, conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3),
                         num_conv_pos_embeddings=8, num_conv_pos_embedding_groups=4),
    }


CAUSAL = {"gpt2", "llama", "mistral", "qwen2", "qwen3", "gemma", "phi", "gpt_neox", "opt", "mixtral", "qwen2_moe",
          "qwen3_moe"}
KIND = {
    "bert": "encoder", "roberta": "encoder", "deberta-v2": "encoder", "albert": "encoder", "distilbert": "encoder",
    "electra": "encoder", "t5": "enc-dec", "bart": "enc-dec", "whisper": "speech enc-dec", "vit": "vision",
    "swin": "vision", "convnext": "vision", "wav2vec2": "speech", "mixtral": "MoE", "qwen2_moe": "MoE",
    "qwen3_moe": "MoE",
}


def _inputs(model_type: str) -> Callable[[], Inputs]:
    if model_type in ("vit", "swin", "convnext"):
        return lambda: ((), {"pixel_values": torch.randn(B, 3, 32, 32)})
    if model_type == "wav2vec2":
        return lambda: ((), {"input_values": torch.randn(B, 400)})
    if model_type == "whisper":
        return lambda: ((), {"input_features": torch.randn(B, 16, 2 * T), "decoder_input_ids": _ids(TD)})
    if model_type in ("t5", "bart"):
        return lambda: ((), {"input_ids": _ids(), "decoder_input_ids": _ids(TD)})
    return lambda: ((), {"input_ids": _ids()})


def _builder(model_type: str) -> Callable[[], Any]:
    def build() -> Any:
        from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

        config = AutoConfig.for_model(model_type, **_configs()[model_type])
        auto = AutoModelForCausalLM if model_type in CAUSAL else AutoModel
        return auto.from_config(config)

    return build


def cases() -> List[Case]:
    analytic = _analytic()
    out = []
    for model_type in _configs():
        ref = analytic.get(model_type)
        kind = KIND.get(model_type, "decoder")
        out.append(Case("transformers", model_type, _builder(model_type), _inputs(model_type), train=False,
                        ref_macs=ref, ref_source="analytical" if ref is not None else "", note=kind))
    return out
