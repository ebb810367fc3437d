"""count_generation: prefill + decode steps of greedy generate, against the hand formula
per step (tiny LLaMA, CPU and meta), a real generate() run (its MACs and its KV cache), and
an encoder-decoder (T5: the encoder runs once)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from conftest import assert_same_state, snapshot, torch_contraction_flops
from torch import nn

import flopcount
from flopcount.generation.count import cache_bytes, count_generation

transformers = pytest.importorskip("transformers")

B, P, N = 2, 10, 7
H, HEADS, KV_HEADS, INTER, LAYERS, VOCAB = 64, 4, 2, 128, 2, 100
HD = H // HEADS


def _llama(device: str) -> nn.Module:
    cfg = transformers.AutoConfig.for_model(
        "llama", hidden_size=H, intermediate_size=INTER, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS, vocab_size=VOCAB, max_position_embeddings=256,
    )
    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    model.generation_config.eos_token_id = None  # no early stop: exactly N new tokens
    return model.eval()


DENSE = LAYERS * (H * HEADS * HD + 2 * H * KV_HEADS * HD + HEADS * HD * H + 3 * H * INTER)  # per token


def prefill_macs() -> int:
    # every prompt position through the layers; the LM head on the last position only
    return B * P * DENSE + B * H * VOCAB + LAYERS * B * HEADS * P * P * 2 * HD


def step_macs(s: int) -> int:
    # one token; attention over P + s + 1 positions (QK^T and AV)
    return B * (DENSE + H * VOCAB) + LAYERS * B * HEADS * (P + s + 1) * 2 * HD


def kv_bytes(positions: int) -> int:
    return 2 * LAYERS * B * KV_HEADS * positions * HD * 4  # keys and values, float32


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_each_step_matches_the_hand_formula(device: str) -> None:
    model = _llama(device)
    ids = torch.randint(0, VOCAB, (B, P)).to(device)
    ids_before = ids.clone() if device == "cpu" else None
    before = snapshot(model) if device == "cpu" else None
    result = count_generation(model, ids, new_tokens=N)
    if before is not None:
        assert_same_state(model, before)
        assert torch.equal(ids, ids_before)
    assert result.prefill.macs == prefill_macs()
    assert [s.macs for s in result.steps] == [step_macs(s) for s in range(N - 1)]
    assert result.macs == prefill_macs() + sum(step_macs(s) for s in range(N - 1))
    assert result.flops == result.prefill.flops + sum(s.flops for s in result.steps)
    assert result.kv_cache_bytes == kv_bytes(P + N - 1)
    assert result.prefill_flops_per_token == result.prefill.flops / (B * P)
    assert result.decode_flops_per_token == sum(s.flops for s in result.steps) / (B * (N - 1))
    assert result.complete, result.incomplete_reasons()
    data = result.to_dict()
    assert data["macs"] == result.macs and len(data["steps"]) == N - 1 and data["kv_cache_bytes"] == result.kv_cache_bytes
    assert "prefill" in result.table() and "decode" in result.table()


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_continuation_equals_tracing_every_step(device: str) -> None:
    model = _llama(device)
    ids = torch.randint(0, VOCAB, (B, P)).to(device)
    fast = count_generation(model, ids, new_tokens=N)
    slow = count_generation(model, ids, new_tokens=N, trace_every_step=True)
    assert any("affine continuation" in w for w in fast.warnings)
    assert not any("affine continuation" in w for w in slow.warnings)
    for a, b in zip(fast.steps, slow.steps):
        assert (a.macs, a.flops) == (b.macs, b.flops)
        assert a.by_module() == b.by_module() and a.by_operator() == b.by_operator()
        assert a.by_module_and_operator() == b.by_module_and_operator()
    assert fast.kv_cache_bytes == slow.kv_cache_bytes


class _Generate(nn.Module):
    """generate() as a forward, so flopcount's tracer sees everything it runs."""

    def __init__(self, model: nn.Module, new_tokens: int):
        super().__init__()
        self.model = model
        self.new_tokens = new_tokens

    def forward(self, ids: torch.Tensor) -> Any:
        return self.model.generate(ids, max_new_tokens=self.new_tokens, do_sample=False, min_new_tokens=self.new_tokens)


def _real_generate(model: nn.Module, ids: torch.Tensor) -> Any:
    return model.generate(ids, max_new_tokens=N, do_sample=False, min_new_tokens=N, return_dict_in_generate=True)


def test_matches_a_real_generate_run() -> None:
    model = _llama("cpu")
    ids = torch.randint(0, VOCAB, (B, P))
    result = count_generation(model, ids, new_tokens=N)
    traced = flopcount.count_flops(_Generate(model, N), (ids,), tracer="dispatch")
    assert traced.macs == result.macs  # every contraction generate ran, and nothing more
    out = _real_generate(model, ids)
    assert out.sequences.shape == (B, P + N)
    assert cache_bytes(out.past_key_values) == result.kv_cache_bytes


def _t5(device: str) -> nn.Module:
    cfg = transformers.AutoConfig.for_model(
        "t5", d_model=32, d_ff=64, d_kv=8, num_heads=4, num_layers=2, num_decoder_layers=2, vocab_size=60, decoder_start_token_id=0, pad_token_id=0,
    )
    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.AutoModelForSeq2SeqLM.from_config(cfg)
    model.generation_config.eos_token_id = None
    return model.eval()


def test_encoder_decoder_runs_the_encoder_once() -> None:
    model = _t5("cpu")
    ids = torch.randint(0, 60, (B, P))
    result = count_generation(model, ids, new_tokens=N)
    assert result.encoder_decoder
    assert 2 * result.prefill.by_module("macs")["encoder"] == torch_contraction_flops(model.get_encoder(), (ids,))
    assert all(step.by_module("macs")["encoder"] == 0 for step in result.steps)
    traced = flopcount.count_flops(_Generate(model, N), (ids,), tracer="dispatch")
    assert traced.macs == result.macs
    out = _real_generate(model, ids)
    assert cache_bytes(out.past_key_values) == result.kv_cache_bytes


def test_a_mixture_of_experts_encoder_decoder_s_steps_are_handed_its_encoder_output_class() -> None:
    # NLLB-MoE's forward reads ``encoder_outputs.router_logits``; the decode steps were handed a
    # plain BaseModelOutput (no such field) and every step failed. Oracle: FlopCounterMode over
    # the real generate() (its encoder run once outside the forwards), 2 FLOPs per MAC.
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    cfg = transformers.AutoConfig.for_model(
        "nllb-moe", vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, num_experts=4, encoder_sparse_step=2,
        decoder_sparse_step=2, max_position_embeddings=64, decoder_start_token_id=2, pad_token_id=1,
    )
    torch.manual_seed(0)
    model = transformers.AutoModelForSeq2SeqLM.from_config(cfg).eval()
    model.generation_config.eos_token_id = None
    ids = torch.randint(3, VOCAB, (B, P), generator=torch.Generator().manual_seed(0))
    before, prompt = snapshot(model), ids.clone()
    result = count_generation(model, ids, new_tokens=N)
    assert_same_state(model, before)
    assert torch.equal(ids, prompt)
    assert result.encoder_decoder and len(result.steps) == N - 1
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter, torch.no_grad():
        out = model.generate(ids, max_new_tokens=N, min_new_tokens=N, do_sample=False)
    assert out.shape == (B, 1 + N)
    assert 2 * result.macs == counter.get_total_flops()


def _moonshine(device: str) -> nn.Module:
    cfg = transformers.AutoConfig.for_model(
        "moonshine", vocab_size=VOCAB, hidden_size=32, intermediate_size=64, encoder_num_hidden_layers=2,
        decoder_num_hidden_layers=2, encoder_num_attention_heads=4, decoder_num_attention_heads=4,
        encoder_num_key_value_heads=4, decoder_num_key_value_heads=4, max_position_embeddings=64,
        decoder_start_token_id=1, bos_token_id=1, pad_token_id=0,
    )
    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.AutoModelForSpeechSeq2Seq.from_config(cfg)
    model.generation_config.eos_token_id = None
    return model.eval()


@pytest.mark.parametrize("path", ["real", "fake, reuse on", "fake, reuse off", "meta, dispatch fallback"])
def test_an_encoder_decoder_s_steps_are_handed_its_encoder_s_own_output(path: str, monkeypatch: Any) -> None:
    # generate() runs the encoder once and hands every step the encoder's own output object.
    # Moonshine's decoder reads ``encoder_outputs.attention_mask``, a field of its encoder's
    # output class that the model's Seq2SeqLMOutput drops: the steps were handed an output rebuilt
    # from the prefill's and every step failed. Oracle: FlopCounterMode over the real generate()
    # of the same weights, 2 FLOPs per MAC, on every tracer path of the decoding loop.
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    import flopcount.decoding.counted as counted

    audio = torch.randn(B, 1600, generator=torch.Generator().manual_seed(0))
    real = _moonshine("cpu")
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter, torch.no_grad():
        out = real.generate(audio, max_new_tokens=N, min_new_tokens=N, do_sample=False)
    assert out.shape == (B, 1 + N)
    monkeypatch.setenv("FLOPCOUNT_REUSE", "0" if path == "fake, reuse off" else "1")
    if path == "meta, dispatch fallback":
        monkeypatch.setattr(counted, "trace_on_fakes", lambda *args, **kwargs: None)  # every fake run refused
    model = real if path == "real" else _moonshine("meta")
    prompt = audio if path == "real" else audio.to("meta")
    if path == "real":
        before, kept = snapshot(model), prompt.clone()
    state = [(name, t.shape, t.dtype, t.device) for name, t in model.state_dict().items()]
    result = count_generation(model, prompt, new_tokens=N)
    assert [(name, t.shape, t.dtype, t.device) for name, t in model.state_dict().items()] == state
    assert prompt.shape == audio.shape and not model.training
    if path == "real":
        assert_same_state(model, before)
        assert torch.equal(prompt, kept)
    assert result.encoder_decoder and len(result.steps) == N - 1
    assert 2 * result.macs == counter.get_total_flops()


def test_moe_generation_on_meta_matches_cpu() -> None:
    cfg = transformers.AutoConfig.for_model(
        "mixtral", hidden_size=H, intermediate_size=96, num_hidden_layers=2, num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS, num_local_experts=4, num_experts_per_tok=2, vocab_size=VOCAB,
        max_position_embeddings=256,
    )
    results = []
    for device in ("cpu", "meta"):
        with torch.device(device):
            model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
        results.append(count_generation(model, torch.zeros(B, P, dtype=torch.int64, device=device), new_tokens=5))
    cpu, meta = results
    assert [s.macs for s in meta.steps] == [s.macs for s in cpu.steps] and meta.prefill.macs == cpu.prefill.macs
    assert meta.prefill.active_params < meta.prefill.params


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_bad_new_tokens(bad: Any) -> None:
    with pytest.raises(flopcount.UsageError, match="new_tokens"):
        count_generation(_llama("meta"), torch.zeros(1, 4, dtype=torch.int64, device="meta"), new_tokens=bad)


def test_one_new_token_is_the_prefill_only() -> None:
    result = count_generation(_llama("meta"), torch.zeros(B, P, dtype=torch.int64, device="meta"), new_tokens=1)
    assert result.steps == () and result.macs == prefill_macs() and result.kv_cache_bytes == kv_bytes(P)


def test_non_contiguous_prompt() -> None:
    model = _llama("cpu")
    wide = torch.randint(0, VOCAB, (B, 2 * P))
    prompt = wide[:, ::2]
    assert not prompt.is_contiguous()
    result = count_generation(model, prompt, new_tokens=3)
    assert result.prefill.macs == prefill_macs() and [s.macs for s in result.steps] == [step_macs(0), step_macs(1)]
    assert torch.equal(prompt, wide[:, ::2])
