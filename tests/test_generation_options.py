"""count_generation honours the generation options that change generate()'s work (issue #29
item 3): the static cache (attended over in full at every step, prefill included; its length
from ``max_cache_len``), chunked prefill, the sliding/hybrid spellings, offloading; read from
``model.generation_config`` or passed as arguments; refused clearly where not modelled.

Oracle: a real greedy ``generate()`` under ``FlopCounterMode`` with the same options
(tests/_live_oracles.py ``generate_truth``: FLOPs of each forward it runs, and its cache),
on tiny Llama, Mistral and Gemma-3 configs, batch 2; a chunked prefill is the sum of generate's
chunk forwards."""

from __future__ import annotations

from typing import Any, Dict

import pytest
import torch
from _live_oracles import generate_truth, held_bytes
from conftest import assert_same_state, snapshot
from torch import nn

from flopcount.errors import UsageError
from flopcount.generation.count import count_generation

transformers = pytest.importorskip("transformers")

B, H, HEADS, KV_HEADS, HD, INTER, LAYERS, VOCAB = 2, 32, 4, 2, 8, 64, 2, 50
P, N = 12, 6
MODELS = {
    "llama": ("llama", {}),
    "mistral-window-8": ("mistral", {"sliding_window": 8}),
    "gemma3-hybrid": ("gemma3_text", {"sliding_window": 8, "layer_types": ["sliding_attention", "full_attention"]}),
}
OPTIONS: Dict[str, Dict[str, Any]] = {
    "static": {"cache_implementation": "static"},
    "static-64": {"cache_implementation": "static", "max_cache_len": 64},
    "chunked-5": {"prefill_chunk_size": 5},
    "chunked-static": {"prefill_chunk_size": 5, "cache_implementation": "static"},
    "sliding_window": {"cache_implementation": "sliding_window"},
    "hybrid": {"cache_implementation": "hybrid"},
    "dynamic": {"cache_implementation": "dynamic"},
}


def _model(kind: str, device: str = "cpu", **extra: Any) -> nn.Module:
    config = transformers.AutoConfig.for_model(
        kind, hidden_size=H, intermediate_size=INTER, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS, head_dim=HD, vocab_size=VOCAB, max_position_embeddings=256, **extra,
    )
    config._attn_implementation = "eager"  # matmuls FlopCounterMode sees
    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(config)
    model.generation_config.eos_token_id = None
    return model.eval()


def _per_forward(result: Any) -> list:
    return [2 * result.prefill.macs] + [2 * step.macs for step in result.steps]


def _truth(model: nn.Module, ids: torch.Tensor, options: Dict[str, Any]) -> tuple:
    """generate()'s forwards with ``options`` set on a copy of the generation config; a
    chunked prefill's chunk forwards summed into one prefill figure."""
    saved = model.generation_config
    model.generation_config = transformers.GenerationConfig(**{**saved.to_dict(), **options})
    try:
        flops, cache = generate_truth(model, ids, N)
    finally:
        model.generation_config = saved
    chunks = len(flops) - (N - 1)
    return [sum(flops[:chunks])] + flops[chunks:], cache, chunks


@pytest.mark.parametrize("options", list(OPTIONS))
@pytest.mark.parametrize("kind", list(MODELS))
def test_options_from_the_generation_config_match_a_real_generate(kind: str, options: str) -> None:
    name, extra = MODELS[kind]
    model = _model(name, **extra)
    ids = torch.randint(0, VOCAB, (B, P))
    expected, cache, chunks = _truth(model, ids, OPTIONS[options])
    assert chunks == (3 if "prefill_chunk_size" in OPTIONS[options] else 1)  # 12 positions in chunks of 5: 5 + 5 + 2
    before = snapshot(model)
    model.generation_config = transformers.GenerationConfig(**{**model.generation_config.to_dict(), **OPTIONS[options]})
    result = count_generation(model, ids, new_tokens=N)
    assert _per_forward(result) == expected
    assert result.kv_cache_bytes == held_bytes(cache)
    assert result.complete, result.incomplete_reasons()
    assert_same_state(model, before)
    # passed as arguments instead, to a model whose generation_config says nothing: the same
    plain = _model(name, **extra)
    assert _per_forward(count_generation(plain, ids, new_tokens=N, **OPTIONS[options])) == expected
    # on meta (no weights, no data): the same figures
    meta = count_generation(_model(name, "meta", **extra), ids.to("meta"), new_tokens=N, **OPTIONS[options])
    assert _per_forward(meta) == expected


def test_static_cache_hand_formula() -> None:
    """Llama, static cache of S = 64 positions: every forward attends over all S keys
    (QK^T and AV: 2 x heads x S x head_dim MACs per query position per layer)."""
    S = 64
    dense = LAYERS * (H * HEADS * HD + 2 * H * KV_HEADS * HD + HEADS * HD * H + 3 * H * INTER)
    result = count_generation(_model("llama"), torch.randint(0, VOCAB, (B, P)), new_tokens=N,
                              cache_implementation="static", max_cache_len=S)
    attention = LAYERS * B * HEADS * 2 * S * HD  # per query position
    assert result.prefill.macs == B * P * dense + B * H * VOCAB + P * attention
    assert [s.macs for s in result.steps] == [B * (dense + H * VOCAB) + attention] * (N - 1)
    assert any("StaticCache of 64 positions" in w for w in result.warnings)


def test_an_argument_overrides_the_generation_config() -> None:
    model = _model("llama")
    ids = torch.randint(0, VOCAB, (B, P))
    dynamic = _per_forward(count_generation(model, ids, new_tokens=N))
    model.generation_config.cache_implementation = "static"
    assert _per_forward(count_generation(model, ids, new_tokens=N, cache_implementation="dynamic")) == dynamic
    assert _per_forward(count_generation(model, ids, new_tokens=N)) != dynamic


def test_offloaded_counts_the_dynamic_caches_work() -> None:
    """Offloading moves cache layers between devices (a CUDA-only path in transformers 5's
    generate(): it fails on a CPU-only torch); the forwards are the dynamic cache's."""
    model = _model("llama")
    ids = torch.randint(0, VOCAB, (B, P))
    expected, _, _ = _truth(model, ids, {"cache_implementation": "dynamic"})
    result = count_generation(model, ids, new_tokens=N, cache_implementation="offloaded")
    assert _per_forward(result) == expected
    assert any("offloaded" in w and "no FLOPs" in w for w in result.warnings)


def test_a_state_space_model_with_a_static_cache_matches_generate() -> None:
    config = transformers.AutoConfig.for_model("mamba", hidden_size=H, state_size=8, num_hidden_layers=LAYERS,
                                               vocab_size=VOCAB, expand=2, conv_kernel=4)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    model.generation_config.eos_token_id = None
    ids = torch.randint(0, VOCAB, (B, P))
    expected, cache, _ = _truth(model, ids, {"cache_implementation": "static"})
    result = count_generation(model, ids, new_tokens=N, cache_implementation="static")
    assert _per_forward(result) == expected
    assert result.kv_cache_bytes == held_bytes(cache)


@pytest.mark.parametrize(
    "options, fragment",
    [
        ({"cache_implementation": "quantized"}, "'quantized' .*is not honoured"),
        ({"cache_implementation": "paged"}, "continuous batching"),
        ({"cache_implementation": "nonsense"}, "unknown cache_implementation 'nonsense'"),
        ({"prefill_chunk_size": 0}, "prefill_chunk_size .*must be an int >= 1"),
        ({"max_cache_len": -1}, "max_cache_len .*must be an int >= 1"),
    ],
)
def test_options_not_modelled_are_refused(options: Dict[str, Any], fragment: str) -> None:
    with pytest.raises(UsageError, match=fragment):
        count_generation(_model("llama"), torch.randint(0, VOCAB, (B, P)), new_tokens=N, **options)


def test_beams_from_the_generation_config_are_named() -> None:
    model = _model("llama")
    ids = torch.randint(0, VOCAB, (B, P))
    model.generation_config.num_beams = 3
    result = count_generation(model, ids, new_tokens=N)
    assert any("3 beams" in w and "greedy" in w for w in result.warnings)


def test_encoder_decoder_static_cache_is_refused() -> None:
    config = transformers.T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_heads=4,
                                   decoder_start_token_id=0)
    model = transformers.T5ForConditionalGeneration(config).eval()
    with pytest.raises(UsageError, match="encoder-decoder is not honoured"):
        count_generation(model, torch.randint(0, VOCAB, (B, P)), new_tokens=N, cache_implementation="static")


def _recurrent_gemma(device: str = "cpu") -> nn.Module:
    config = transformers.RecurrentGemmaConfig(
        num_hidden_layers=3, vocab_size=VOCAB, hidden_size=H, intermediate_size=INTER, num_attention_heads=HEADS,
        num_key_value_heads=1, head_dim=HD, lru_width=H, attention_window_size=8, conv1d_width=4,
        block_types=["recurrent", "recurrent", "attention"],
    )
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(config)
    model.generation_config.eos_token_id = None
    return model.eval()


def test_recurrent_gemma_counts_what_generate_runs() -> None:
    """Issue #29 item 6: RecurrentGemma returns no cache (it updates the one generate() hands
    it, and keeps its recurrent state in its modules); each forward equals generate()'s."""
    options: Dict[str, Any] = {}
    model = _recurrent_gemma()
    ids = torch.randint(0, VOCAB, (B, P))
    expected, cache, _ = _truth(model, ids, options)
    model = _recurrent_gemma()  # generate() leaves its recurrent state on the modules: a fresh one
    before = snapshot(model)
    result = count_generation(model, ids, new_tokens=N, **options)
    assert _per_forward(result) == expected
    assert result.kv_cache_bytes == held_bytes(cache)
    assert any("returned no cache" in w for w in result.warnings)
    assert_same_state(model, before)
    assert all(getattr(m, "conv1d_state", None) is None for m in model.modules())  # no state left behind
    meta = count_generation(_recurrent_gemma("meta"), ids.to("meta"), new_tokens=N, **options)
    assert _per_forward(meta) == expected
