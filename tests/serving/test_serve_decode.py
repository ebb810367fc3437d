"""serve's decode steps over chunked-attention layers and a static cache: the keys each step's
mask admits, and the cache positions it must read (branch servedecode).

A decode step at position p of a Llama-4 chunked layer (``attention_chunk_size`` C) is handed the
C - 1 positions its sliding cache keeps and its own, but its mask admits only the p mod C + 1 of
its own chunk; over a static cache (``cache_implementation="static"``) every step is handed all
``max_cache_len`` slots, the ones past p masked. An engine that knows the mask (a chunk-aware or
paged kernel) computes and reads only the admitted keys. Oracles: the True entries of the masks
transformers itself builds in ``generate()``'s decode steps on tiny real models (read live by
wrapping SDPA), and hand formulas for Llama-4-Scout's shapes (C = 8,192) at a 16k context and a
LLaMA-2-7B static cache (4,096 slots, prompt 512, 128 new tokens); each score costs 2 matmuls x
2 FLOPs per MAC x head dim, per head and layer.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import pytest
import torch

from flopcount.devices import named_roofs
from flopcount.serving import ServeFacts, serve_facts, serve_on
from flopcount.types import OpCall, TensorMeta
from tests.serving._sdpa_masks import AdmittedScores, generated, tiny_causal_lm

transformers = pytest.importorskip("transformers")

BF16 = 989.5e12  # the H100 SXM datasheet's dense BF16 peak
H100_HBM = 3.35e12  # its HBM3 bandwidth, bytes/s
LAYERS, HEADS, KV_HEADS, HEAD_DIM, CHUNK = 2, 4, 2, 16, 24
TINY: Dict[str, Any] = dict(hidden_size=HEADS * HEAD_DIM, intermediate_size=128, num_hidden_layers=LAYERS,
                            num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM, vocab_size=50,
                            max_position_embeddings=400)
#: one position of the tiny models' float32 cache, keys and values of every layer, per sequence
POSITION_BYTES = LAYERS * 2 * KV_HEADS * HEAD_DIM * 4


def _real(model_type: str, **config: Any) -> Any:
    return tiny_causal_lm(model_type, TINY, **config)


def _live(model: Any, ids: torch.Tensor, new: int, **kwargs: Any) -> AdmittedScores:
    return generated(model, ids, new, **kwargs)


def _rows(seen: AdmittedScores) -> List[int]:
    """Of each call handed an explicit mask, the most keys one query row admits."""
    return [int(mask.sum(-1).max()) for mask in seen.masks]


def _per_forward(values: List[int], forwards: int) -> List[int]:
    """Values of consecutive SDPA calls summed per forward (each forward calls every layer once)."""
    per = len(values) // forwards
    assert per * forwards == len(values)
    return [sum(values[k * per:(k + 1) * per]) for k in range(forwards)]


def _row(facts: ServeFacts, batch: int = 1) -> Any:
    return serve_on(facts, named_roofs("h100"), "H100 SXM", None, "", batch=batch, dtype="bfloat16").at(batch)


def _priced_step(facts: ServeFacts, step: int, batch: int = 1) -> float:
    """Decode step ``step``'s attention FLOPs the bound prices: counted, less those it leaves out."""
    work = facts.step_at(batch, step)
    return work.attention_flops - work.skipped_flops


def _static(model: Any, slots: int) -> Any:
    model.generation_config.cache_implementation = "static"
    model.generation_config.max_cache_len = slots
    return model


# the premises, read live --------------------------------------------------------------------------

def test_a_chunked_decode_step_is_handed_its_sliding_cache_and_admits_its_chunk():
    """Llama-4, C = 24, prompt 40, 13 decode steps (p = 40..52, across the chunk boundary at 48):
    each step is handed C keys (the C - 1 its sliding cache keeps and its own) and its mask admits
    p mod C + 1 of them; the cache layer keeps C - 1 positions."""
    model = _real("llama4_text", attention_chunk_size=CHUNK)
    prompt, new = 40, 14
    seen = _live(model, torch.randint(1, 50, (1, prompt)), new)
    decode_keys = seen.keys[LAYERS:]
    assert decode_keys == [CHUNK] * (LAYERS * (new - 1))
    assert _rows(seen)[LAYERS:] == [p % CHUNK + 1 for p in range(prompt, prompt + new - 1) for _ in range(LAYERS)]
    cache = transformers.DynamicCache(config=model.config)
    with torch.no_grad():
        out = model(torch.randint(1, 50, (1, prompt)), past_key_values=cache, use_cache=True)
    layers = out.past_key_values.layers
    assert [type(layer).__name__ for layer in layers] == ["DynamicSlidingWindowLayer"] * LAYERS
    assert [layer.keys.shape[-2] for layer in layers] == [CHUNK - 1] * LAYERS


def test_a_static_decode_step_is_handed_every_slot_and_admits_its_positions():
    """A static cache of 100 slots, prompt 40: each step is handed all 100 slots; its mask admits the
    p + 1 positions written."""
    model = _static(_real("llama"), 100)
    prompt, new = 40, 6
    seen = _live(model, torch.randint(1, 50, (1, prompt)), new)
    assert seen.keys[LAYERS:] == [100] * (LAYERS * (new - 1))
    assert _rows(seen) == [p + 1 for p in range(prompt, prompt + new - 1) for _ in range(LAYERS)]


# the kernel's rule --------------------------------------------------------------------------------

@pytest.mark.parametrize("position, keys, window, chunk, slots, admitted", [
    (40, 24, None, 24, None, 40 % 24 + 1),     # a full sliding cache of a chunked layer
    (48, 24, None, 24, None, 1),               # the first position of a chunk
    (47, 24, None, 24, None, 24),              # the last: every key
    (10, 11, None, 24, None, 11),              # before the cache fills: every position
    (40, 24, 24, None, None, 24),              # a sliding window: every key it holds
    (40, 41, None, None, None, 41),            # every position: all of it
    (40, 100, None, None, 100, 41),            # a static cache: the written slots
])
@pytest.mark.parametrize("rows", [1, 3])      # one query, or a query's heads packed by GQA (pack_gqa)
def test_one_position_computes_the_keys_its_mask_admits(position, keys, window, chunk, slots, admitted, rows):
    from flopcount.devices.roofline import one_position_flops  # new in servedecode

    q = torch.full((rows, 1), position)
    k = torch.arange(position + 1 - keys, position + 1)[None, :] if not slots else torch.arange(keys)[None, :]
    allowed = k <= q
    if window:
        allowed &= k > q - window
    if chunk:
        allowed &= k // chunk == q // chunk
    assert int(allowed.sum()) == rows * admitted  # the hand column agrees with the mask built element by element
    call = OpCall("aten::scaled_dot_product_attention",
                  {"query": TensorMeta((1, 2, rows, 8)), "key": TensorMeta((1, 2, keys, 8)), "is_causal": False})
    counted = 4.0 * 2 * rows * keys * 8
    assert one_position_flops(call, counted, position, window, chunk, slots) == pytest.approx(
        counted * int(allowed.sum()) / (rows * keys), rel=1e-15)


def test_keys_no_cache_holds_keep_their_flops():
    from flopcount.devices.roofline import one_position_flops

    def call(keys: int) -> OpCall:
        return OpCall("aten::scaled_dot_product_attention", {"query": TensorMeta((1, 2, 1, 4)), "key": TensorMeta((1, 2, keys, 4))})

    assert one_position_flops(call(30), 100.0, 40, chunk=24) == 100.0  # more than a sliding cache keeps
    assert one_position_flops(call(100), 100.0, 40) == 100.0  # more keys than positions, no static cache known
    assert one_position_flops(call(90), 100.0, 40, slots=100) == 100.0  # not the static cache's slots
    assert one_position_flops(call(40), 100.0, 40, slots=40) == 100.0  # a static cache too short for p


# chunked attention ---------------------------------------------------------------------------------

@pytest.mark.parametrize("prompt, new", [(40, 14), (50, 14)])  # across a chunk boundary; within one chunk
@pytest.mark.parametrize("derived", [True, False])
def test_chunked_decode_steps_are_priced_at_the_keys_transformers_mask_admits(prompt, new, derived):
    """Real weights: every decode step's attention FLOPs priced are 4 x head dim x the scores the
    mask transformers builds admits, read live (p mod C + 1 per head and layer), at batch 1 and 3;
    the cache read is the p mod C positions of the step's own chunk. serve priced all C keys and
    the C - 1 positions held before."""
    model = _real("llama4_text", attention_chunk_size=CHUNK)
    ids = torch.randint(1, 50, (1, prompt))
    live = _per_forward(_live(model, ids, new).scores, new)[1:]
    assert live == [LAYERS * HEADS * (p % CHUNK + 1) for p in range(prompt, prompt + new - 1)]
    facts = serve_facts(model, ids, new, derived=derived)
    for step, scores in enumerate(live):
        assert _priced_step(facts, step) == pytest.approx(4 * HEAD_DIM * scores, rel=1e-12)
        assert _priced_step(facts, step, batch=3) == pytest.approx(3 * 4 * HEAD_DIM * scores, rel=1e-12)
        p = prompt + step
        assert facts.steps[step].cache_read == (p % CHUNK) * POSITION_BYTES
        assert facts.steps[step].flops == facts.steps[0].flops  # the count: all C keys, unchanged
    row = _row(facts)
    assert row.first_step.skipped_flops == pytest.approx(4 * HEAD_DIM * LAYERS * HEADS * (CHUNK - prompt % CHUNK - 1))


SCOUT: Dict[str, Any] = dict(hidden_size=5120, num_attention_heads=40, num_key_value_heads=8, head_dim=128,
                             intermediate_size=8192, intermediate_size_mlp=16384, num_local_experts=16,
                             num_experts_per_tok=1, vocab_size=202048, attention_chunk_size=8192,
                             max_position_embeddings=32768, attn_implementation="sdpa")


def test_llama4_scout_at_16k_is_priced_at_its_chunks():
    """Llama-4-Scout's shapes (40 heads of 128, 8 KV heads, C = 8,192; 4 layers: three chunked, the
    fourth full, as its ``no_rope_layers`` make them), bf16, prompt 16,384, 8 new tokens: step s at
    p = 16,384 + s prices per sequence 4 x 40 x 128 x ((p mod C + 1) x 3 + (p + 1)) attention FLOPs
    (counted: C x 3 + p + 1 keys) and reads (p mod C) x 3 + p positions of 2 x 8 x 128 x 2 bytes."""
    cfg = transformers.Llama4TextConfig(num_hidden_layers=4, **SCOUT)
    assert cfg.layer_types == ["chunked_attention"] * 3 + ["full_attention"]
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval()
    model.generation_config.eos_token_id = None
    prompt, chunk, per_key, position = 16384, 8192, 4 * 40 * 128, 2 * 8 * 128 * 2
    facts = serve_facts(model, torch.zeros(1, prompt, dtype=torch.int64, device="meta"), 8)
    for step in range(7):
        p = prompt + step
        work = facts.step_at(1, step)
        assert work.attention_flops == per_key * (3 * chunk + p + 1)
        assert work.skipped_flops == per_key * 3 * (chunk - (p % chunk + 1))
        assert facts.steps[step].cache_read == position * (3 * (p % chunk) + p)  # per sequence (less the counters)
    row = _row(facts)
    first = facts.step_at(1, 0)
    assert row.first_step.compute_s == pytest.approx((first.flops - per_key * 3 * (chunk - 1)) / BF16, rel=1e-12)


# sliding windows: already exact, pinned ------------------------------------------------------------

@pytest.mark.parametrize("model_type, config, sliding", [
    ("mistral", dict(sliding_window=CHUNK), [True, True]),
    ("gemma3_text", dict(sliding_window=CHUNK, layer_types=["sliding_attention", "full_attention"]), [True, False]),
    ("qwen2", dict(use_sliding_window=True, sliding_window=CHUNK, max_window_layers=1), [False, True]),
])
def test_sliding_window_decode_steps_are_their_window(model_type, config, sliding):
    """A sliding layer's decode step is handed the W - 1 positions its cache keeps and its own: every
    key the mask admits (min(W, p + 1)), read live; the cache read is what the layers hold. Nothing
    to leave out (unchanged by this branch)."""
    model = _real(model_type, **config)
    prompt, new = 40, 8
    ids = torch.randint(1, 50, (1, prompt))
    live = _per_forward(_live(model, ids, new).scores, new)[1:]
    facts = serve_facts(model, ids, new)
    per_layer = POSITION_BYTES // LAYERS
    for step, scores in enumerate(live):
        p = prompt + step
        assert scores == HEADS * sum(min(CHUNK, p + 1) if s else p + 1 for s in sliding)
        assert _priced_step(facts, step) == pytest.approx(4 * HEAD_DIM * scores, rel=1e-12)
        assert facts.steps[step].skipped_flops == 0
        assert facts.steps[step].cache_read == per_layer * sum(min(p, CHUNK - 1) if s else p for s in sliding)


# static cache ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("chunk", [None, 16])
def test_static_cache_steps_are_priced_at_the_live_positions(chunk):
    """Real weights, a static cache of 100 slots, prompt 40, 8 new tokens: each step's attention FLOPs
    priced are the live mask's scores (p + 1 keys per head and layer, of the 100 counted); it reads
    the p positions written and writes one, the memory holds the 47 live positions and a token adds
    one position, and its bound is the dynamic cache's, step by step. The prefill (one forward, or
    chunks of 16 over the slots) is priced at the prompt's causal triangle, as the dynamic cache's."""
    prompt, new, slots = 40, 8, 100
    ids = torch.randint(1, 50, (1, prompt))
    model = _real("llama")
    model.generation_config.prefill_chunk_size = chunk
    dynamic = serve_facts(model, ids, new)
    _static(model, slots)
    seen = _live(model, ids, new)
    assert sum(seen.scores[:-LAYERS * (new - 1)]) == LAYERS * HEADS * prompt * (prompt + 1) // 2  # the prefill
    live = _per_forward(seen.scores[-LAYERS * (new - 1):], new - 1)
    facts = serve_facts(model, ids, new)
    assert facts.prefill.attention_flops - facts.prefill.skipped_flops == pytest.approx(
        4 * HEAD_DIM * LAYERS * HEADS * prompt * (prompt + 1) // 2, rel=1e-12)
    assert facts.prefill.cache_written == prompt * POSITION_BYTES
    for step, scores in enumerate(live):
        p = prompt + step
        assert scores == LAYERS * HEADS * (p + 1)
        assert facts.steps[step].attention_flops == 4 * HEAD_DIM * LAYERS * HEADS * slots  # the count, unchanged
        assert _priced_step(facts, step) == pytest.approx(4 * HEAD_DIM * scores, rel=1e-12)
        assert facts.steps[step].cache_read == p * POSITION_BYTES
        assert facts.steps[step].cache_written == POSITION_BYTES
    assert facts.cache_held == (prompt + new - 1) * POSITION_BYTES
    assert facts.kv_bytes_per_token == POSITION_BYTES
    assert any("a static cache of 100 slots" in note and "47 at the end" in note for note in facts.warnings)
    ours, theirs = _row(facts, 4), _row(dynamic, 4)
    for mine, other in ((ours.first_step, theirs.first_step), (ours.last_step, theirs.last_step), (ours.prefill, theirs.prefill)):
        assert mine.memory_s == pytest.approx(other.memory_s, rel=1e-12)
        assert mine.flops - mine.skipped_flops == pytest.approx(other.flops - other.skipped_flops, rel=1e-12)
    assert facts.cache_held == dynamic.cache_held  # per sequence: the memory's cache term


def test_a_padded_prompt_over_a_static_cache_is_priced_at_its_sequences_slots():
    """A padded mask (5 pads): step s at slot 40 + s is handed the 100 slots and needs its sequence's
    36 + s (branch servepad2: before, every slot stayed priced); it reads the 35 + s real positions
    written before it (by hand)."""
    model = _static(_real("llama"), 100)
    mask = torch.ones(1, 40, dtype=torch.int64)
    mask[:, :5] = 0
    facts = serve_facts(model, torch.randint(1, 50, (1, 40)), 6, kwargs={"attention_mask": mask})
    for s, step in enumerate(facts.steps):
        assert step.skipped_flops == (100 - (36 + s)) * LAYERS * HEADS * 4 * HEAD_DIM
        assert step.cache_read == pytest.approx((35 + s) * POSITION_BYTES, abs=64)


LLAMA2_7B: Dict[str, Any] = dict(num_hidden_layers=2, hidden_size=4096, num_attention_heads=32, num_key_value_heads=32,
                                 intermediate_size=11008, vocab_size=32000, max_position_embeddings=4096)


@pytest.fixture(scope="module")
def llama2_7b_static() -> Dict[Optional[str], ServeFacts]:
    cfg = transformers.AutoConfig.for_model("llama", **LLAMA2_7B)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float16).eval()
    model.generation_config.eos_token_id = None
    ids = torch.zeros(1, 512, dtype=torch.int64, device="meta")
    out: Dict[Optional[str], ServeFacts] = {None: serve_facts(model, ids, 128)}
    _static(model, 4096)
    out["static"] = serve_facts(model, ids, 128)
    return out


def test_llama2_7b_static_cache_by_hand(llama2_7b_static):
    """LLaMA-2-7B's layer shapes (2 of its 32 layers), fp16, a static cache of 4,096 slots, prompt 512,
    128 new tokens: step s at p = 512 + s counts 4 x 32 x 128 x 4,096 attention FLOPs per layer and
    prices 4 x 32 x 128 x (p + 1); it moves (p + 1) x 2 x 4,096 x 2 bytes per layer of cache (p read,
    one written), not the 4,096 slots; the memory holds 639 positions, not 4,096."""
    facts, dynamic = llama2_7b_static["static"], llama2_7b_static[None]
    layers, per_key, position = 2, 4 * 32 * 128, 2 * 4096 * 2
    for step in (0, 1, 63, 126):
        p = 512 + step
        work = facts.steps[step]  # per sequence
        assert work.attention_flops == layers * per_key * 4096
        assert work.skipped_flops == layers * per_key * (4096 - p - 1)
        assert work.cache_read == layers * position * p
        assert work.cache_written == layers * position
    assert facts.cache_held == layers * position * (512 + 127)
    row, other = _row(facts), _row(dynamic)
    assert row.first_step.compute_s == pytest.approx(
        (facts.step_at(1, 0).flops - layers * per_key * (4096 - 513)) / BF16, rel=1e-12)
    # the dynamic cache's bounds, but for the 16 bytes of counters the static cache also reads (1 in 6 x 10^7)
    position_s = 2 * 16 / H100_HBM
    assert row.last_step.memory_s == pytest.approx(other.last_step.memory_s, abs=position_s)
    assert row.decode_s == pytest.approx(other.decode_s, abs=127 * position_s)
    assert row.tokens_per_s == pytest.approx(other.tokens_per_s, rel=1e-7)


def test_a_static_steps_left_out_keys_come_off_attentions_own_column_in_float32():
    """float32 on an H100: attention ops have a column of their own (3xTF32, the serving roof's),
    the matmuls the FP32 one. The keys a static cache's step leaves out are an attention op's, so
    its compute term is the dynamic cache's, step by step (merging servedecode with serveeager,
    which split the skipped FLOPs by column, first took them off the matmuls' column)."""
    prompt, new, slots = 40, 8, 100
    ids = torch.randint(1, 50, (1, prompt))
    model = _real("llama")
    dynamic = serve_facts(model, ids, new)
    facts = serve_facts(_static(model, slots), ids, new)

    def fp32(f: ServeFacts) -> Any:
        return serve_on(f, named_roofs("h100"), "H100 SXM", None, "", batch=4, dtype="float32").at(4)

    ours, theirs = fp32(facts), fp32(dynamic)
    assert facts.steps[0].skipped_attention_flops == facts.steps[0].skipped_flops > 0
    for mine, other in ((ours.first_step, theirs.first_step), (ours.last_step, theirs.last_step)):
        assert mine.compute_s == pytest.approx(other.compute_s, rel=1e-9)
