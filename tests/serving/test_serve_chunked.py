"""serve's prefill bound with a chunked prefill: later chunks at a bottom-right causal kernel
(branch servechunk).

transformers runs a causal prefill's first chunk (no past) as a causal SDPA, and each later
chunk with an explicit mask over the past and the chunk's keys: query i of a chunk of Lq after
``past`` cached positions sees keys 0..past + i. A kernel given that mask computes every block,
but an engine that knows the mask is causal (vLLM's chunked prefill, flash-attn's varlen and
causal kernels, whose triangle is aligned bottom-right) computes only past x Lq + Lq (Lq + 1) / 2
scores per head. serve priced those chunks in full, so its time-to-first-token "lower bound"
could sit above such an engine's run. Oracles: the scores of the mask itself (counted from
``torch.tril``, or by hand), the attention FLOPs derived from the config (2 matmuls x 2 FLOPs
per MAC x layers x heads x scores x head dim) and the H100 SXM datasheet's dense BF16 peak,
989.5 TFLOP/s.
"""

from __future__ import annotations

import inspect
from typing import Any, List

import pytest
import torch
from _serve_shapes import BF16, CONFIG, NEW, PROMPT
from _serve_shapes import attention_flops as _attention

from flopcount.devices import named_roofs
from flopcount.devices.roofline import kernel_flops
from flopcount.serving import ServeFacts, serve_facts, serve_on
from flopcount.types import OpCall, TensorMeta

transformers = pytest.importorskip("transformers")

def _mask_scores(queries: int, keys: int) -> int:
    """The scores a bottom-right causal mask lets through: query i sees keys 0..keys - queries + i."""
    return int(torch.ones(queries, keys, dtype=torch.bool).tril(keys - queries).sum())


def _chunks(chunk: int) -> List[int]:
    return [min(chunk, PROMPT - start) for start in range(0, PROMPT, chunk)]


def _skipped(chunk: int) -> float:
    """One sequence's scores a bottom-right causal kernel leaves out, chunk by chunk, as FLOPs."""
    skipped, past = 0.0, 0
    for length in _chunks(chunk):
        skipped += _attention(length * (past + length) - _mask_scores(length, past + length))
        past += length
    return skipped


def _facts(model_type: str = "llama", chunk: int = 128, **config: Any) -> ServeFacts:
    cfg = transformers.AutoConfig.for_model(model_type, **{**CONFIG, **config})
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.prefill_chunk_size = chunk
    return serve_facts(model, torch.zeros(1, PROMPT, dtype=torch.int64, device="meta"), NEW)


def _row(facts: ServeFacts, batch: int) -> Any:
    return serve_on(facts, named_roofs("h100"), "H100 SXM", None, "", batch=batch, dtype="bfloat16").at(batch)


def test_the_mask_oracle_is_the_hand_formula():
    # past x Lq + Lq (Lq + 1) / 2: chunk 3 of 128 (256 positions before it), and a short last chunk
    assert _mask_scores(128, 384) == 256 * 128 + 128 * 129 // 2
    assert _mask_scores(112, 512) == 400 * 112 + 112 * 113 // 2
    assert _mask_scores(7, 7) == 7 * 8 // 2


@pytest.mark.parametrize("op, layout", [
    ("aten::_scaled_dot_product_flash_attention_for_cpu", "BHLE"),
    ("aten::scaled_dot_product_attention", "BHLE"),
    ("aten::_flash_attention_forward", "BLHE"),
])
def test_a_bottom_right_causal_kernel_computes_the_masks_scores(op, layout):
    from flopcount.devices.roofline import bottom_right_causal_flops  # new in servechunk

    def meta(length: int) -> TensorMeta:
        return TensorMeta((2, 3, length, 8) if layout == "BHLE" else (2, length, 3, 8), "bfloat16")

    call = OpCall(op, {"query": meta(5), "key": meta(12), "value": meta(12), "attn_mask": None, "is_causal": False})
    counted = 4.0 * 2 * 3 * 5 * 12 * 8  # Q K^T and P V over the 5 x 12 square
    assert bottom_right_causal_flops(call, counted) == pytest.approx(counted * _mask_scores(5, 12) / 60, rel=1e-15)
    assert kernel_flops(call, counted) == counted  # not causal by its own arguments: all of it


def test_a_call_the_rule_does_not_fit_keeps_its_flops():
    from flopcount.devices.roofline import bottom_right_causal_flops

    wider = OpCall("aten::scaled_dot_product_attention", {"query": TensorMeta((1, 2, 9, 4)), "key": TensorMeta((1, 2, 4, 4))})
    matmul = OpCall("aten::bmm", {"self": TensorMeta((2, 5, 8)), "mat2": TensorMeta((2, 8, 12))})
    assert bottom_right_causal_flops(wider, 100.0) == 100.0  # more queries than keys: no offset to align
    assert bottom_right_causal_flops(matmul, 100.0) == 100.0


@pytest.fixture(scope="module")
def chunked() -> ServeFacts:
    return _facts()


@pytest.mark.parametrize("batch", [1, 3])
def test_later_chunks_are_priced_at_a_bottom_right_causal_kernel(chunked, batch):
    """Chunks of 128: chunk k (k = 1..4) counts 128 x 128k scores, a bottom-right causal kernel
    computes 128 (k - 1) x 128 + 128 x 129 / 2 of them; serve priced chunks 2-4 in full."""
    prefill = chunked.prefill_at(batch)
    assert prefill.attention_flops == batch * sum(_attention(128 * 128 * k) for k in range(1, 5))  # the count: squares
    skipped = batch * _skipped(128)
    assert skipped == batch * 4 * _attention(128 * 127 / 2)  # each chunk leaves out its own upper triangle
    row = _row(chunked, batch)
    assert row.prefill.skipped_flops == pytest.approx(skipped, rel=1e-12)
    assert row.prefill.compute_s == pytest.approx((prefill.flops - skipped) / BF16, rel=1e-12)
    # the FLOPs reported stay the counted program's
    assert row.prefill.flops == prefill.flops and row.prefill.attention_flops == prefill.attention_flops
    assert row.to_dict()["prefill"]["skipped_flops"] == row.prefill.skipped_flops


def test_chunked_or_not_a_causal_kernel_computes_the_prompts_one_triangle(chunked):
    """Chunk after chunk, a bottom-right causal kernel computes the P (P + 1) / 2 scores of the
    whole prompt's triangle: what the unchunked prefill is priced for (branch servecausal)."""
    prefill = chunked.prefill_at(2)
    assert prefill.attention_flops - _row(chunked, 2).prefill.skipped_flops == pytest.approx(
        2 * _attention(PROMPT * (PROMPT + 1) / 2), rel=1e-12)


def test_a_short_last_chunk_is_aligned_at_its_own_offset():
    """Chunks of 200: 200, 200 and 112 positions; the last sees the 400 before it."""
    facts = _facts(chunk=200)
    assert _chunks(200) == [200, 200, 112]
    row = _row(facts, 2)
    assert row.prefill.skipped_flops == pytest.approx(2 * _skipped(200), rel=1e-12)
    assert row.prefill.compute_s == pytest.approx((facts.prefill_at(2).flops - 2 * _skipped(200)) / BF16, rel=1e-12)


def test_a_chunk_past_the_window_is_priced_at_the_window():
    """Mistral with a 300-position window, chunks of 128: up to position 299 the window mask is
    the causal one, so the second chunk (positions 128..255) runs at a bottom-right causal
    kernel; the third and fourth reach past the window (position 383 no longer sees key 0):
    priced at the window's band, min(300, p + 1) keys for query p (branch servewindow: they were
    priced in full), over the keys the sliding cache hands them (its 299 latest positions at
    most, and the chunk's own). The first chunk is causal by its own kernel."""
    facts = _facts("mistral", sliding_window=300)
    counted = sum(128 * (min(start, 299) + 128) for start in range(0, PROMPT, 128))
    band = 300 * 301 // 2 + (PROMPT - 300) * 300  # the window's scores over the prompt, per head and layer
    assert facts.prefill_at(1).attention_flops == _attention(counted)
    assert _row(facts, 1).prefill.skipped_flops == pytest.approx(_attention(counted - band), rel=1e-12)


def test_a_window_wider_than_the_prompt_is_the_causal_mask():
    facts = _facts("mistral", sliding_window=2 * PROMPT)
    assert _row(facts, 1).prefill.skipped_flops == pytest.approx(_skipped(128), rel=1e-12)


class _MaskOfAttention(torch.overrides.TorchFunctionMode):
    """Keeps the ``attn_mask`` and ``is_causal`` of each SDPA call."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: List[Any] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.nn.functional.scaled_dot_product_attention:
            mask = kwargs.get("attn_mask", args[3] if len(args) > 3 else None)
            self.calls.append((mask, kwargs.get("is_causal", False), args[0].shape[-2], args[1].shape[-2]))
        return func(*args, **kwargs)


def test_transformers_hands_a_later_chunk_the_bottom_right_causal_mask():
    """The premise, on real weights: a LLaMA's second chunk (16 positions after 16 cached) runs
    SDPA with an explicit mask, and that mask lets through exactly query i -> keys 0..16 + i."""
    cfg = transformers.AutoConfig.for_model("llama", **{**CONFIG, "num_hidden_layers": 1, "max_position_embeddings": 64},
                                            attn_implementation="sdpa")
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    ids = torch.randint(0, 50, (1, 32))
    # the forward's name for the cache: ``cache`` from transformers 5.24, ``past_key_values`` before
    key = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    cache = transformers.DynamicCache(config=cfg)
    with torch.no_grad():
        model(ids[:, :16], use_cache=True, **{key: cache})
        with _MaskOfAttention() as seen:
            model(ids[:, 16:], use_cache=True, attention_mask=torch.ones(1, 32, dtype=torch.int64),
                  position_ids=torch.arange(16, 32)[None], **{key: cache})
    ((mask, is_causal, queries, keys),) = seen.calls
    assert (queries, keys, is_causal) == (16, 32, False)
    allowed = mask if mask.dtype == torch.bool else mask == 0
    assert torch.equal(allowed.reshape(-1, 16, 32)[0], torch.ones(16, 32, dtype=torch.bool).tril(16))


def _real_llama(prompt: int) -> Any:
    cfg = transformers.AutoConfig.for_model("llama", **{**CONFIG, "max_position_embeddings": 2 * prompt},
                                            attn_implementation="sdpa")
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.prefill_chunk_size = 32
    return model


def test_real_weights_price_the_same_triangle():
    """The dispatch path (real weights and ids, 96 positions in chunks of 32) as the fake one."""
    model = _real_llama(96)
    facts = serve_facts(model, torch.randint(0, 50, (1, 96)), NEW)
    prefill = facts.prefill_at(1)
    assert prefill.attention_flops == sum(_attention(32 * 32 * k) for k in (1, 2, 3))
    assert prefill.attention_flops - _row(facts, 1).prefill.skipped_flops == pytest.approx(
        _attention(96 * 97 / 2), rel=1e-12)


def test_a_padded_prompt_in_chunks_is_priced_as_its_sequence():
    """A real mask with padding: every chunk, the first too, runs with an explicit mask that is not
    the causal one (the padded keys are masked too), so no chunk of it is priced at a triangle; the
    mask proves the sequence (91 real tokens), priced as that prompt alone, chunked as generate()
    chunks it (branch servepad2: before, the padded chunks were priced in full, nothing skipped)."""
    model = _real_llama(96)
    mask = torch.ones(1, 96, dtype=torch.int64)
    mask[:, :5] = 0
    ids = torch.randint(0, 50, (1, 96))
    facts = serve_facts(model, ids, NEW, kwargs={"attention_mask": mask})
    priced, alone = facts.prefill_at(1), serve_facts(model, ids[:, 5:], NEW).prefill_at(1)
    assert priced.flops - priced.skipped_flops == alone.flops - alone.skipped_flops
