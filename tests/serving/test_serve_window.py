"""serve's prefill bound for sliding-window and chunked-attention layers: the scores their mask
admits (branch servewindow).

Where a sliding window (Mistral's ``sliding_window``, Gemma's and Qwen2's sliding layers) or an
attention chunk (Llama-4's ``attention_chunk_size``) ends inside the prompt, transformers hands
SDPA an explicit mask and serve priced the whole Lq x Lk square, though an engine with a windowed
kernel (flash-attn's ``window_size``, vLLM) computes only the band: query p sees the min(W, p + 1)
keys p - W + 1..p, or the p mod C + 1 keys of its attention chunk. Oracles: the True entries of
the masks transformers itself builds in ``generate()`` on tiny real models (read live by wrapping
SDPA), and hand formulas for Mistral-7B's shapes (W = 4,096) at a 32k prompt; each score costs
2 matmuls x 2 FLOPs per MAC x head dim, per head and layer.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

import pytest
import torch

from flopcount.devices import named_roofs
from flopcount.serving import ServeFacts, serve_facts, serve_on
from flopcount.types import OpCall, TensorMeta
from tests.serving._sdpa_masks import AdmittedScores, generated, tiny_causal_lm

transformers = pytest.importorskip("transformers")

BF16 = 989.5e12  # the H100 SXM datasheet's dense BF16 peak
LAYERS, HEADS, HEAD_DIM, PROMPT, WINDOW = 2, 4, 16, 96, 24
TINY: Dict[str, Any] = dict(hidden_size=HEADS * HEAD_DIM, intermediate_size=128, num_hidden_layers=LAYERS,
                            num_attention_heads=HEADS, num_key_value_heads=2, head_dim=HEAD_DIM, vocab_size=50,
                            max_position_embeddings=4 * PROMPT)
# mistralai/Mistral-7B-v0.1's config.json per layer (two layers: the formula is per layer), positions for 32k
MISTRAL_7B: Dict[str, Any] = dict(num_hidden_layers=2, hidden_size=4096, num_attention_heads=32, num_key_value_heads=8,
                                  intermediate_size=14336, vocab_size=32000, sliding_window=4096,
                                  max_position_embeddings=32768)


def _triangle(n: int) -> int:
    return n * (n + 1) // 2


def _band(prompt: int, window: int) -> int:
    """One head's scores over a prompt under a causal window of W keys, by hand: the first W
    queries see 1..W keys (a triangle), each later one W."""
    return _triangle(min(prompt, window)) + max(0, prompt - window) * window


def _mask_scores(past: int, queries: int, keys: int, window: Optional[int] = None, chunk: Optional[int] = None) -> int:
    """The True entries of the mask of ``queries`` queries at absolute positions past.. over the
    latest ``keys`` positions, built element by element: causal, within the window or chunk."""
    q = torch.arange(past, past + queries)[:, None]
    k = torch.arange(past + queries - keys, past + queries)[None, :]
    allowed = k <= q
    if window is not None:
        allowed &= k > q - window
    if chunk is not None:
        allowed &= k // chunk == q // chunk
    return int(allowed.sum())


def _real(model_type: str, chunk: Optional[int] = None, **config: Any) -> Any:
    return tiny_causal_lm(model_type, TINY, chunk, **config)


def _row(facts: ServeFacts, batch: int = 1, dtype: str = "bfloat16") -> Any:
    return serve_on(facts, named_roofs("h100"), "H100 SXM", None, "", batch=batch, dtype=dtype).at(batch)


def _priced(facts: ServeFacts, batch: int = 1) -> float:
    """The prefill's attention FLOPs the bound prices: counted, less those it leaves out."""
    return facts.prefill_at(batch).attention_flops - _row(facts, batch).prefill.skipped_flops


def _live(model: Any, ids: torch.Tensor, **kwargs: Any) -> AdmittedScores:
    """The scores transformers' own generate() admits in its prefill (one new token: no decode step)."""
    return generated(model, ids, 1, **kwargs)


def test_transformers_window_is_w_keys_up_to_the_query():
    """The convention, read live: with ``sliding_window`` = W, Mistral's prefill mask lets query i
    see keys max(0, i - W + 1)..i, W keys with its own (flash-attn's window_size = (W - 1, 0))."""
    model = _real("mistral", sliding_window=WINDOW)
    seen = _live(model, torch.randint(1, 50, (1, PROMPT)))
    i = torch.arange(PROMPT)[:, None]
    j = torch.arange(PROMPT)[None, :]
    assert len(seen.masks) == LAYERS
    for mask in seen.masks:
        assert torch.equal(mask, (j <= i) & (j > i - WINDOW))
    assert int(seen.masks[0].sum(-1).max()) == WINDOW


@pytest.mark.parametrize("past, queries, keys, window, chunk", [
    (0, 96, 96, 24, None),     # one forward past the window
    (0, 20, 20, 24, None),     # within it: the causal triangle
    (64, 32, 32 + 23, 24, None),  # a later chunk over a sliding cache's W - 1 positions
    (10, 32, 42, 24, None),    # a chunk whose past is shorter than the window
    (64, 32, 96, 24, None),    # a full cache of every position
    (0, 96, 96, None, 24),     # attention chunks of 24
    (40, 32, 32 + 23, None, 24),
    (40, 32, 72, None, 24),
    (40, 32, 72, None, None),  # neither: the bottom-right causal kernel
])
@pytest.mark.parametrize("op, layout", [
    ("aten::_scaled_dot_product_flash_attention_for_cpu", "BHLE"),
    ("aten::_flash_attention_forward", "BLHE"),
])
def test_a_windowed_kernel_computes_the_masks_scores(past, queries, keys, window, chunk, op, layout):
    from flopcount.devices.roofline import windowed_causal_flops  # new in servewindow

    def meta(length: int) -> TensorMeta:
        return TensorMeta((2, 3, length, 8) if layout == "BHLE" else (2, length, 3, 8), "bfloat16")

    call = OpCall(op, {"query": meta(queries), "key": meta(keys), "value": meta(keys), "is_causal": False})
    counted = 4.0 * 2 * 3 * queries * keys * 8
    expected = counted * _mask_scores(past, queries, keys, window, chunk) / (queries * keys)
    assert windowed_causal_flops(call, counted, past, window, chunk) == pytest.approx(expected, rel=1e-15)


def test_keys_that_are_not_the_latest_positions_keep_their_flops():
    from flopcount.devices.roofline import windowed_causal_flops

    def call(keys: int) -> OpCall:
        return OpCall("aten::scaled_dot_product_attention", {"query": TensorMeta((1, 2, 32, 4)), "key": TensorMeta((1, 2, keys, 4))})

    assert windowed_causal_flops(call(32 + 10), 100.0, 64, 24) == 100.0  # 10 cached: fewer than W - 1, not all 64
    assert windowed_causal_flops(call(32 + 80), 100.0, 64, 24) == 100.0  # more keys than positions (a static cache)
    assert windowed_causal_flops(call(32 + 23), 100.0, 64) == 100.0  # no window: the keys must be every position
    matmul = OpCall("aten::bmm", {"self": TensorMeta((2, 5, 8)), "mat2": TensorMeta((2, 8, 12))})
    assert windowed_causal_flops(matmul, 100.0, 0, 24) == 100.0


@pytest.mark.parametrize("chunk", [None, 32, 20])
@pytest.mark.parametrize("model_type, config, hand", [
    ("mistral", dict(sliding_window=WINDOW), LAYERS * _band(PROMPT, WINDOW)),
    # Gemma-style: sliding and full layers alternate
    ("gemma3_text", dict(sliding_window=WINDOW, layer_types=["sliding_attention", "full_attention"]),
     _band(PROMPT, WINDOW) + _triangle(PROMPT)),
    # Qwen2: full below max_window_layers, sliding from it
    ("qwen2", dict(use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1),
     _triangle(PROMPT) + _band(PROMPT, WINDOW)),
    # Llama-4: attention chunks of 24, four blocks of the prompt, each a triangle
    ("llama4_text", dict(attention_chunk_size=WINDOW), LAYERS * PROMPT // WINDOW * _triangle(WINDOW)),
])
def test_the_prefill_is_priced_at_the_scores_transformers_mask_admits(model_type, config, chunk, hand):
    """Real weights, one forward and chunked: the attention FLOPs priced are the scores of the masks
    transformers builds in generate(), read live, and the hand formula's. serve priced every
    explicitly masked call in full before: above both."""
    model = _real(model_type, chunk, **config)
    ids = torch.randint(1, 50, (1, PROMPT))
    live = sum(_live(model, ids).scores)
    assert live == HEADS * hand
    facts = serve_facts(model, ids, 4)
    assert _priced(facts) == pytest.approx(4 * HEAD_DIM * live, rel=1e-12)


@pytest.fixture(scope="module")
def mistral_7b_32k() -> Dict[Optional[int], ServeFacts]:
    cfg = transformers.AutoConfig.for_model("mistral", **MISTRAL_7B)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval()
    model.generation_config.eos_token_id = None
    facts = {}
    for chunk in (None, 2048):
        model.generation_config.prefill_chunk_size = chunk
        facts[chunk] = serve_facts(model, torch.zeros(1, 32768, dtype=torch.int64, device="meta"), 8)
    return facts


@pytest.mark.parametrize("chunk", [None, 2048])
def test_mistral_7b_at_32k_is_priced_at_its_window(mistral_7b_32k, chunk):
    """Mistral-7B's shapes, W = 4,096, a 32,768-position prompt: per head and layer the band holds
    W(W + 1)/2 + (32,768 - W) W = 125,831,168 scores, whether in one forward or in chunks of 2,048
    (whose keys are the W - 1 positions the sliding cache keeps, or all before it, and its own)."""
    prompt, window, per_score = 32768, 4096, 2 * 2 * 32 * 128 * MISTRAL_7B["num_hidden_layers"]
    band = _triangle(window) + (prompt - window) * window
    assert band == 125_831_168 == _band(prompt, window)
    if chunk is None:
        counted = prompt * prompt
    else:
        counted = sum(chunk * (min(start, window - 1) + chunk) for start in range(0, prompt, chunk))
    facts = mistral_7b_32k[chunk]
    prefill = facts.prefill_at(1)
    assert prefill.attention_flops == per_score * counted
    row = _row(facts)
    assert row.prefill.skipped_flops == pytest.approx(per_score * (counted - band), rel=1e-12)
    assert row.prefill.compute_s == pytest.approx((prefill.flops - per_score * (counted - band)) / BF16, rel=1e-12)
    assert row.prefill.flops == prefill.flops  # the count is unchanged


def test_a_window_wider_than_the_prompt_is_the_causal_triangle():
    """One forward within the window: transformers runs a causal kernel, priced at its triangle as before."""
    model = _real("mistral", sliding_window=4 * PROMPT)
    ids = torch.randint(1, 50, (1, PROMPT))
    assert sum(_live(model, ids).scores) == LAYERS * HEADS * _triangle(PROMPT)
    assert _priced(serve_facts(model, ids, 4)) == pytest.approx(4 * HEAD_DIM * LAYERS * HEADS * _triangle(PROMPT), rel=1e-12)


@pytest.mark.parametrize("chunk", [None, 32])
def test_a_padded_prompt_is_priced_as_its_sequence_or_in_full(chunk):
    """A mask with padding, every attention handed it explicitly: the mask proves the sequence (its
    91 real tokens), priced as that prompt alone (its band), in one forward (branch servepad) and in
    chunks (branch servepad2: before, priced in full, nothing skipped)."""
    model = _real("mistral", chunk, sliding_window=WINDOW)
    mask = torch.ones(1, PROMPT, dtype=torch.int64)
    mask[:, :5] = 0
    ids = torch.randint(1, 50, (1, PROMPT))
    facts = serve_facts(model, ids, 4, kwargs={"attention_mask": mask})
    alone = serve_facts(model, ids[:, 5:], 4)
    prefill = facts.prefill_at(1)
    assert prefill.attention_flops - prefill.skipped_attention_flops == \
        pytest.approx(4 * HEAD_DIM * LAYERS * HEADS * _band(PROMPT - 5, WINDOW), rel=1e-12)
    priced, by_itself = facts.prefill_at(1), alone.prefill_at(1)
    assert priced.flops - priced.skipped_flops == by_itself.flops - by_itself.skipped_flops


def test_a_mask_of_all_ones_given_is_no_padding():
    """generate() drops a mask of all ones: the prompt is priced at its band as without one."""
    model = _real("mistral", sliding_window=WINDOW)
    ids = torch.randint(1, 50, (1, PROMPT))
    facts = serve_facts(model, ids, 4, kwargs={"attention_mask": torch.ones(1, PROMPT, dtype=torch.int64)})
    assert _priced(facts) == pytest.approx(4 * HEAD_DIM * LAYERS * HEADS * _band(PROMPT, WINDOW), rel=1e-12)


def test_a_cache_that_disagrees_with_the_config_names_no_window():
    """The config says sliding, the cache holds every position (a DynamicCache made without the
    config): serve does not know which mask the layers ran, so it knows none."""
    from flopcount.decoding.runs import LayerMask, layer_masks

    model = _real("gemma3_text", sliding_window=WINDOW, layer_types=["sliding_attention", "full_attention"])
    def attention(cache: Any) -> Dict[str, Any]:  # the decoder layers carry their layer_idx too
        return {name: mask for name, mask in layer_masks(model, cache).items() if name.endswith("self_attn")}

    agreed = transformers.DynamicCache(config=model.config)
    assert attention(agreed) == {"model.layers.0.self_attn": LayerMask(window=WINDOW),
                                          "model.layers.1.self_attn": LayerMask()}
    plain = transformers.DynamicCache()
    plain.update(torch.zeros(1, 2, 3, HEAD_DIM), torch.zeros(1, 2, 3, HEAD_DIM), 0)
    plain.update(torch.zeros(1, 2, 3, HEAD_DIM), torch.zeros(1, 2, 3, HEAD_DIM), 1)
    assert attention(plain) == {"model.layers.1.self_attn": LayerMask()}
