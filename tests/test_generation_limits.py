"""count_generation on caches that stop growing (issue #20.1-3, #19's reprice bug).

Oracles: a real ``generate()`` with ``torch.utils.flop_counter.FlopCounterMode`` around each
forward it runs (eager attention, so every contraction is a matmul FlopCounterMode counts:
its FLOPs are 2 x flopcount's MACs), the bytes of the storages the real cache returned by
``generate()`` holds (summed here by data pointer), and hand formulas per step.
"""

from __future__ import annotations

import json
from typing import Any, Dict

import pytest
import torch
from _live_oracles import generate_truth, held_bytes
from torch import nn

from flopcount.decoding.runs import Limits, cache_limits, plan_runs
from flopcount.generation.count import count_generation

transformers = pytest.importorskip("transformers")

B, H, HEADS, KV_HEADS, HD, INTER, LAYERS, VOCAB = 2, 32, 4, 2, 8, 64, 2, 50


def _config(kind: str, **extra: Any) -> Any:
    if kind == "mamba":
        return transformers.AutoConfig.for_model(
            "mamba", hidden_size=H, state_size=8, num_hidden_layers=LAYERS, vocab_size=VOCAB, expand=2, conv_kernel=4)
    base: Dict[str, Any] = dict(
        hidden_size=H, intermediate_size=INTER, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS, head_dim=HD, vocab_size=VOCAB, max_position_embeddings=256,
    )
    if kind == "falcon_h1":
        base.update(mamba_d_state=8, mamba_d_conv=4, mamba_expand=2, mamba_n_heads=8, mamba_d_head=8, mamba_d_ssm=64,
                    mamba_n_groups=1, mamba_chunk_size=16)
    if kind == "llama4_text":
        base.update(intermediate_size_mlp=INTER, num_local_experts=1, num_experts_per_tok=1, no_rope_layers=[1, 0])
    base.update(extra)
    return transformers.AutoConfig.for_model(kind, **base)


def _model(config: Any, device: str = "cpu") -> nn.Module:
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(config)
    model.generation_config.eos_token_id = None
    return model.eval()


# (model, window settings, P, N): windows full before the first step, filling within the
# first traced steps, inside what would be a predicted stretch, after the last step; Gemma's
# alternating local/global layers; Llama4's chunked attention; a state-space model and a hybrid.
CASES = {
    "mistral-fills-in-run": ("mistral", {"sliding_window": 16}, 12, 24),
    "mistral-full-before": ("mistral", {"sliding_window": 16}, 20, 12),
    "mistral-fills-at-step-1": ("mistral", {"sliding_window": 14}, 12, 12),
    "mistral-fills-mid-stretch": ("mistral", {"sliding_window": 16}, 4, 24),
    "mistral-fills-after": ("mistral", {"sliding_window": 64}, 12, 24),
    "gemma2": ("gemma2", {"sliding_window": 16}, 12, 24),
    "gemma3": ("gemma3_text", {"sliding_window": 16, "layer_types": ["sliding_attention", "full_attention"]}, 12, 24),
    "llama4-chunked": ("llama4_text", {"attention_chunk_size": 8}, 12, 24),
    "mamba": ("mamba", {}, 12, 10),
    "falcon_h1": ("falcon_h1", {}, 12, 10),
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_step_and_the_cache_match_a_real_generate(case: str) -> None:
    kind, extra, prompt, new_tokens = CASES[case]
    config = _config(kind, **extra)
    model = _model(config)
    ids = torch.randint(0, VOCAB, (B, prompt))
    result = count_generation(model, ids, new_tokens=new_tokens)
    flops, cache = generate_truth(model, ids, new_tokens)
    assert 2 * result.prefill.macs == flops[0]
    assert [2 * step.macs for step in result.steps] == flops[1:]
    assert result.kv_cache_bytes == held_bytes(cache)
    assert result.complete, result.incomplete_reasons()
    # on meta (no weights, no data): the same figures
    meta = count_generation(_model(config, "meta"), ids.to("meta"), new_tokens=new_tokens)
    assert [s.macs for s in meta.steps] == [s.macs for s in result.steps] and meta.prefill.macs == result.prefill.macs
    assert meta.kv_cache_bytes == result.kv_cache_bytes
    assert meta.kv_cache_position_bytes == result.kv_cache_position_bytes


DENSE = LAYERS * (H * HEADS * HD + 2 * H * KV_HEADS * HD + HEADS * HD * H + 3 * H * INTER)


@pytest.mark.parametrize("prompt, window", [(12, 16), (4, 16), (20, 16)])
def test_sliding_window_hand_formula(prompt: int, window: int) -> None:
    """Decode step s attends min(P + s + 1, W) keys; each sliding layer then holds keys and
    values of min(P + N - 1, W) positions in its storage (views of W - 1) and an int64 window."""
    new_tokens = 24
    model = _model(_config("mistral", sliding_window=window), "meta")
    result = count_generation(model, torch.zeros(B, prompt, dtype=torch.int64, device="meta"), new_tokens=new_tokens)

    def step_macs(s: int) -> int:
        return B * (DENSE + H * VOCAB) + LAYERS * B * HEADS * min(prompt + s + 1, window) * 2 * HD

    assert [s.macs for s in result.steps] == [step_macs(s) for s in range(new_tokens - 1)]
    per_position = 2 * B * KV_HEADS * HD * 4  # keys and values, float32
    context = prompt + new_tokens - 1
    assert result.kv_cache_bytes == LAYERS * (per_position * min(context, window) + 8)
    assert result.kv_cache_position_bytes == LAYERS * (per_position * min(context, window - 1) + 8)
    shortcut = [w for w in result.warnings if "affine continuation" in w]
    assert shortcut, result.warnings  # the runs on either side of the window still take the shortcut


def test_runs_are_cut_at_each_limit() -> None:
    # P = 12, window 16: step 3 has context 16; steps 2..4 traced one by one, then one run
    assert plan_runs(23, 12, Limits(frozenset({16})), False) == [(0, 4, False), (5, 22, True)]
    # no limit in range: one run; a short run is traced whole; every_step: one traced run
    assert plan_runs(23, 12, Limits(frozenset({64})), False) == [(0, 22, True)]
    assert plan_runs(4, 12, Limits(), False) == [(0, 3, False)]
    assert plan_runs(23, 12, Limits(), True) == [(0, 22, False)]
    # chunks of 8 from context 13 to 35: limits 16, 24, 32 -> steps 3, 11, 19
    assert plan_runs(23, 12, Limits(frozenset({8}), frozenset({8})), False) == [
        (0, 4, False), (5, 9, True), (10, 12, False), (13, 17, True), (18, 22, False),
    ]


def test_limits_are_read_from_the_cache_and_the_config() -> None:
    config = _config("gemma3_text", sliding_window=16, layer_types=["sliding_attention", "full_attention"])
    model = _model(config, "meta")
    out = model(input_ids=torch.zeros(1, 4, dtype=torch.int64, device="meta"), use_cache=True)
    limits = cache_limits(out.cache, config)
    assert 16 in limits.windows and 256 in limits.windows and not limits.periods
    chunked = _config("llama4_text", attention_chunk_size=8)
    assert cache_limits(None, chunked).periods == frozenset({8})


class _HiddenWindow(nn.Module):
    """One attention layer whose cache keeps the last ``memory`` positions: a limit that no
    config or cache attribute names, so only the check on a run's last step can find it."""

    def __init__(self, memory: int):
        super().__init__()
        self.memory = memory
        self.embed = nn.Embedding(VOCAB, H)
        self.qkv = nn.Linear(H, 3 * H, bias=False)
        self.head = nn.Linear(H, VOCAB, bias=False)

    def forward(self, input_ids: torch.Tensor, past_key_values: Any = None, use_cache: bool = True) -> Dict[str, Any]:
        q, k, v = self.qkv(self.embed(input_ids)).chunk(3, dim=-1)
        if past_key_values is not None:
            k, v = torch.cat([past_key_values[0], k], dim=1), torch.cat([past_key_values[1], v], dim=1)
        attended = (q @ k.transpose(1, 2)).softmax(-1) @ v
        return {"logits": self.head(attended), "past_key_values": (k[:, -self.memory:], v[:, -self.memory:])}


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_the_last_step_check_catches_an_unknown_window(device: str) -> None:
    prompt, memory, new_tokens = 4, 12, 20
    torch.manual_seed(0)
    with torch.device(device):
        model = _HiddenWindow(memory).eval()
    result = count_generation(model, torch.zeros(B, prompt, dtype=torch.int64, device=device), new_tokens=new_tokens)

    def step_macs(s: int) -> int:  # keys before the step: min(P + s, memory), plus the new one
        return B * (3 * H * H + H * VOCAB) + 2 * B * H * (min(prompt + s, memory) + 1)

    assert [s.macs for s in result.steps] == [step_macs(s) for s in range(new_tokens - 1)]
    assert any("did not match" in w for w in result.warnings)
    # keys and values: views of the memory positions kept, of a storage of memory + 1 (the cat)
    assert result.kv_cache_bytes == 2 * B * (memory + 1) * H * 4
    assert result.kv_cache_position_bytes == 2 * B * memory * H * 4


class _WindowOverHandedCache(_HiddenWindow):
    """_HiddenWindow's layer appending to the cache object generate() hands it (``cache``, a
    DynamicCache, updated in place) and attending to its last ``memory`` positions only: a window
    no config names, so the last-step check fails and the count starts again."""

    def forward(self, input_ids: torch.Tensor, cache: Any = None, use_cache: bool = True) -> Dict[str, Any]:  # type: ignore[override]
        q, k, v = (t.unsqueeze(1) for t in self.qkv(self.embed(input_ids)).chunk(3, dim=-1))
        k, v = cache.update(k, v, 0)
        k, v = k[:, :, -self.memory:], v[:, :, -self.memory:]
        return {"logits": self.head(((q @ k.transpose(-1, -2)).softmax(-1) @ v).squeeze(1)), "cache": cache}


def test_a_retry_after_a_mismatch_starts_from_an_empty_cache() -> None:
    """The count traced again after the last step's check failed reused the cache object the
    failed attempt had filled in place (real weights): its prefill attended to 24 stale positions."""
    prompt, memory, new_tokens = 4, 12, 20
    torch.manual_seed(0)
    model = _WindowOverHandedCache(memory).eval()
    result = count_generation(model, torch.zeros(B, prompt, dtype=torch.int64), new_tokens=new_tokens)

    def macs(tokens: int, keys: int) -> int:  # qkv and head per token; QK^T and AV over the keys attended
        return B * tokens * (3 * H * H + H * VOCAB) + 2 * B * tokens * H * keys

    assert any("did not match" in w and "every decode step was traced" in w for w in result.warnings)
    assert result.prefill.macs == macs(prompt, prompt)  # before: macs(prompt, memory), the stale cache's
    assert [s.macs for s in result.steps] == [macs(1, min(prompt + s + 1, memory)) for s in range(new_tokens - 1)]


class _MHADecoder(nn.Module):
    """nn.MultiheadAttention over a cache of the layer inputs (its K/V projections rerun over
    the whole context each step)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, H)
        self.attn = nn.ModuleList(nn.MultiheadAttention(H, HEADS, batch_first=True) for _ in range(LAYERS))
        self.head = nn.Linear(H, VOCAB, bias=False)

    def forward(self, input_ids: torch.Tensor, past_key_values: Any = None, use_cache: bool = True) -> Dict[str, Any]:
        x = self.embed(input_ids)
        cache = []
        for i, attn in enumerate(self.attn):
            keys = x if past_key_values is None else torch.cat([past_key_values[i], x], dim=1)
            x = x + attn(x, keys, keys, need_weights=False)[0]
            cache.append(keys)
        return {"logits": self.head(x), "past_key_values": tuple(cache)}


class _CellOverHistory(nn.Module):
    """An nn.LSTMCell stepped on every cached position at once (rows = batch x context), so
    its split cost (two linears and the gate ops) changes with the context."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, H)
        self.cell = nn.LSTMCell(H, H)
        self.head = nn.Linear(H, VOCAB, bias=False)

    def forward(self, input_ids: torch.Tensor, past_key_values: Any = None, use_cache: bool = True) -> Dict[str, Any]:
        x = self.embed(input_ids)
        history = x if past_key_values is None else torch.cat([past_key_values, x], dim=1)
        h, _ = self.cell(history.reshape(-1, H))
        summary = h.reshape(history.shape).mean(dim=1, keepdim=True)
        return {"logits": self.head(summary), "past_key_values": history}


def _mha_step(context: int) -> int:
    # q and out projections on one token, k and v over the context, QK^T and AV
    return B * (LAYERS * (2 * H * H + 2 * context * H * H + 2 * context * H) + H * VOCAB)


def _cell_step(context: int) -> int:
    return B * (context * 4 * H * (H + H) + H * VOCAB)  # 4 gates x (input + hidden) per position


@pytest.mark.parametrize("make, step_macs", [(_MHADecoder, _mha_step), (_CellOverHistory, _cell_step)])
def test_split_costs_are_repriced_per_part(make: Any, step_macs: Any) -> None:
    """#19: ops whose cost is split into parts (MHA, RNN cells) raised KeyError in the decode shortcut."""
    prompt, new_tokens = 5, 9
    torch.manual_seed(0)
    model = make().eval()
    ids = torch.randint(0, VOCAB, (B, prompt))
    fast = count_generation(model, ids, new_tokens=new_tokens)
    slow = count_generation(model, ids, new_tokens=new_tokens, trace_every_step=True)
    assert [s.macs for s in fast.steps] == [step_macs(prompt + s + 1) for s in range(new_tokens - 1)]
    assert any("affine continuation" in w for w in fast.warnings)
    for a, b in zip(fast.steps, slow.steps):
        assert (a.macs, a.flops) == (b.macs, b.flops)
        assert a.by_operator() == b.by_operator() and a.by_module_and_operator() == b.by_module_and_operator()


def test_every_diagnostic_reaches_the_generation_result() -> None:
    """#20.3: the MoE-on-meta note was only on gen.prefill.warnings."""
    config = transformers.AutoConfig.for_model(
        "mixtral", hidden_size=H, intermediate_size=48, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS, num_local_experts=4, num_experts_per_tok=2, vocab_size=VOCAB,
        max_position_embeddings=256,
    )
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config).eval()
    gen = count_generation(model, torch.zeros(B, 6, dtype=torch.int64, device="meta"), new_tokens=8)
    parts = [*gen.prefill.warnings, *(w for step in gen.steps for w in step.warnings)]
    assert any("_grouped_mm" in w for w in parts)
    table, data = gen.table(), json.loads(gen.to_json())
    for warning in parts:
        assert warning in gen.warnings and warning in data["warnings"] and f"note: {warning}" in table


def test_a_failing_prepare_inputs_falls_back_to_the_plain_step_inputs() -> None:
    model = _model(_config("mistral", sliding_window=64), "meta")

    def broken(input_ids: Any, next_sequence_length: Any = None, cache: Any = None, **kwargs: Any) -> Any:
        raise TypeError("a helper that fails")

    model.prepare_inputs_for_generation = broken  # this test's own model
    prompt, new_tokens = 12, 6
    result = count_generation(model, torch.zeros(B, prompt, dtype=torch.int64, device="meta"), new_tokens=new_tokens)
    attention = [LAYERS * B * HEADS * (prompt + s + 1) * 2 * HD for s in range(new_tokens - 1)]
    assert [s.macs for s in result.steps] == [B * (DENSE + H * VOCAB) + a for a in attention]
    assert any("prepare_inputs_for_generation" in w and "TypeError" in w for w in result.warnings)


def test_a_continued_step_is_described_by_its_own_inputs() -> None:
    """A step costed as the affine continuation reads as the traced step would (found by
    benchmarks/zoo_reuse_hf_types.py): its ``to_dict()`` (totals, rows and the inputs it was
    fed: here the attention mask of P + s + 1 positions) equals ``trace_every_step=True``'s;
    it said the first step's inputs (a mask of P + 1). The prompt is left-padded: generate()
    drops an all-ones mask (and so does count_generation since genall), and keeps this one."""
    model = _model(_config("llama"))
    prompt, new = 12, 8
    ids = torch.randint(0, VOCAB, (B, prompt), generator=torch.Generator().manual_seed(1))
    padded = {"attention_mask": torch.ones(B, prompt, dtype=torch.int64)}
    padded["attention_mask"][0, :2] = 0
    continued = count_generation(model, ids, new_tokens=new, kwargs=padded)
    traced = count_generation(model, ids, new_tokens=new, kwargs=padded, trace_every_step=True)
    assert any("affine continuation" in w for w in continued.warnings)
    assert [step.to_dict() for step in continued.steps] == [step.to_dict() for step in traced.steps]
    masks = [f"attention_mask=Tensor[{B}, {prompt + s + 1}] int64" for s in range(new - 1)]
    assert all(mask in step.to_dict()["inputs"] for mask, step in zip(masks, continued.steps))
