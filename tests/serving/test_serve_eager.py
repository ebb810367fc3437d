"""serve's prefill bound for attention run as plain matmuls (``attn_implementation="eager"``):
the two score matmuls and the elementwise ops on the scores priced at the scores the mask
admits (branch serveeager).

transformers' ``eager_attention_forward`` runs ``matmul(q, k^T)``, elementwise ops over the
Lq x Lk scores, then ``matmul(p, v)``: no attention op, so serve priced every score of the square,
though a kernel that knows the mask (flash-attn, vLLM: both run Gemma-2 and GPT-OSS with flash
attention and sliding windows) computes only the admitted ones. Oracles: the True entries of
the masks transformers itself hands each attention module in ``generate()``'s prefill (read
live by a forward pre-hook) on tiny real Gemma-2, GPT-OSS and Llama models; and hand formulas
for Gemma-2-9B's shapes at 8k and 32k. Per score and head: each matmul 2 x head dim FLOPs (a MAC
per head dimension), and the elementwise ops at the handlers' documented convention
(docs/conventions.md: one FLOP per element, five for softmax).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import pytest
import torch

from flopcount.devices import named_roofs
from flopcount.serving import ServeFacts, serve_facts, serve_on
from flopcount.types import Cost, OpCall, OpEvent, TensorMeta

transformers = pytest.importorskip("transformers")

BF16, FP32 = 989.5e12, 67e12  # the H100 SXM datasheet's dense BF16 and FP32 peaks
LAYERS, HEADS, HEAD_DIM, PROMPT, WINDOW = 2, 4, 16, 96, 24
TINY: Dict[str, Any] = dict(hidden_size=HEADS * HEAD_DIM, intermediate_size=128, num_hidden_layers=LAYERS,
                            num_attention_heads=HEADS, num_key_value_heads=2, head_dim=HEAD_DIM, vocab_size=50,
                            max_position_embeddings=4 * PROMPT)
# FLOPs per score and head of the elementwise ops eager_attention_forward runs on the scores:
# Gemma-2: the scaling mul, soft-capping div, tanh and mul, the mask's add, softmax (5);
# GPT-OSS: the scaling mul and the mask's add, then the row max (1), sub (1) and softmax (5) over
# the scores and a sink column, Lq x (Lk + 1), priced at the admitted scores and the Lq sinks
# (each row's sink is always seen: what is left out is the scores left out); Llama: mul, add, softmax
ELEMENTWISE = {"gemma2": 1 + 3 + 1 + 5, "gpt_oss": 1 + 1 + (1 + 1 + 5), "llama": 1 + 1 + 5}
CONFIGS: Dict[str, Dict[str, Any]] = {
    "gemma2": dict(sliding_window=WINDOW),  # layer_types: sliding, full, alternating
    "gpt_oss": dict(sliding_window=WINDOW, num_local_experts=2, num_experts_per_tok=1),
    "llama": {},
}
# google/gemma-2-9b's config.json per layer pair (a sliding layer, then a full one), positions for 32k
GEMMA2_9B: Dict[str, Any] = dict(num_hidden_layers=2, hidden_size=3584, num_attention_heads=16, num_key_value_heads=8,
                                 head_dim=256, intermediate_size=14336, vocab_size=256000, sliding_window=4096,
                                 query_pre_attn_scalar=256, attn_logit_softcapping=50.0,
                                 final_logit_softcapping=30.0, max_position_embeddings=32768)


def _triangle(n: int) -> int:
    return n * (n + 1) // 2


def _band(prompt: int, window: int) -> int:
    """One head's scores over a prompt under a causal window of W keys, by hand."""
    return _triangle(min(prompt, window)) + max(0, prompt - window) * window


def _real(model_type: str, chunk: Optional[int] = None, **config: Any) -> Any:
    cfg = transformers.AutoConfig.for_model(model_type, **TINY, **CONFIGS[model_type], **config,
                                            attn_implementation="eager")
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.prefill_chunk_size = chunk
    return model


def _live(model: Any, ids: torch.Tensor, **kwargs: Any) -> Tuple[int, int]:
    """(admitted, counted): over every attention call of generate()'s prefill (one new token:
    no decode step), the True entries of the mask transformers hands the attention module (0
    in its additive float mask) and the entries of the whole Lq x Lk square, per head."""
    seen: List[torch.Tensor] = []

    def hook(module: Any, args: Any, kwargs: Dict[str, Any]) -> None:
        seen.append(kwargs["attention_mask"])

    attention = [m for name, m in model.named_modules() if name.endswith("self_attn")]
    assert len(attention) == LAYERS
    hooks = [m.register_forward_pre_hook(hook, with_kwargs=True) for m in attention]
    try:
        with torch.no_grad():
            model.generate(ids, max_new_tokens=1, do_sample=False, **kwargs)
    finally:
        for handle in hooks:
            handle.remove()
    assert all(mask is not None and mask.dtype.is_floating_point and mask.shape[:2] == (1, 1) for mask in seen)
    return sum(int((mask == 0).sum()) for mask in seen), sum(mask[0, 0].numel() for mask in seen)


def _row(facts: ServeFacts, dtype: str = "bfloat16") -> Any:
    return serve_on(facts, named_roofs("h100"), "H100 SXM", None, "", batch=1, dtype=dtype).at(1)


def _per_score(model_type: str, head_dim: int = HEAD_DIM) -> int:
    """FLOPs per score and head: QK^T and PV, 2 x head dim each, and the elementwise ops."""
    return 2 * 2 * head_dim + ELEMENTWISE[model_type]


@pytest.mark.parametrize("chunk", [None, 32, 20])
@pytest.mark.parametrize("model_type, hand", [
    ("gemma2", _band(PROMPT, WINDOW) + _triangle(PROMPT)),
    ("gpt_oss", _band(PROMPT, WINDOW) + _triangle(PROMPT)),
    ("llama", LAYERS * _triangle(PROMPT)),
])
def test_eager_scores_are_priced_at_the_mask_transformers_builds(model_type, hand, chunk):
    """Real weights (the dispatch tracer), one forward and chunked: the FLOPs left out are the
    scores outside the masks transformers hands each eager attention, read live, times the FLOPs
    per score; the scores kept are the hand formula's (window 24 on Gemma-2's and GPT-OSS's
    sliding layers, the triangle on their full layers and on Llama). serve priced the whole
    square before: nothing left out."""
    model = _real(model_type, chunk)
    ids = torch.randint(1, 50, (1, PROMPT))
    admitted, counted = _live(model, ids)
    assert admitted == hand
    facts = serve_facts(model, ids, 4)
    row = _row(facts)
    assert row.prefill.skipped_flops == pytest.approx(HEADS * (counted - admitted) * _per_score(model_type), rel=1e-12)
    assert row.prefill.flops == facts.prefill_at(1).flops  # the count is unchanged
    assert row.prefill.compute_s == pytest.approx((row.prefill.flops - row.prefill.skipped_flops) / BF16, rel=1e-12)


@pytest.mark.parametrize("new_tokens", [4, 8])  # 8: serve's derived count (batch 2 from its prefill and two steps)
def test_a_llama_loaded_eager_is_priced_at_its_triangle_on_meta(new_tokens):
    """LLaMA's shapes on meta (fake copies), prompt 512: per head and layer the P(P + 1)/2 scores
    of the causal triangle are priced, the rest of the square left out, whichever way serve
    counts; the same triangle an SDPA Llama is priced at (its kernel runs ``is_causal``)."""
    prompt = 512
    cfg = transformers.AutoConfig.for_model("llama", **{**TINY, "max_position_embeddings": 2 * prompt},
                                            attn_implementation="eager")
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    model.generation_config.eos_token_id = None
    facts = serve_facts(model, torch.zeros(1, prompt, dtype=torch.int64, device="meta"), new_tokens)
    left_out = LAYERS * HEADS * (prompt * prompt - _triangle(prompt))
    row = _row(facts)
    assert row.prefill.skipped_flops == left_out * _per_score("llama")
    assert row.prefill.compute_s == pytest.approx((facts.prefill_at(1).flops - left_out * _per_score("llama")) / BF16,
                                                  rel=1e-12)
    # float32 on an H100: attention ops have a column of their own (3xTF32); an eager attention
    # has none, and what it leaves out comes off the matmuls' FP32 column, not attention's
    row32 = _row(facts, "float32")
    assert facts.prefill_at(1).attention_flops == 0
    assert row32.prefill.compute_s == pytest.approx((facts.prefill_at(1).flops - left_out * _per_score("llama")) / FP32,
                                                    rel=1e-12)


@pytest.fixture(scope="module")
def gemma2_9b() -> Dict[int, ServeFacts]:
    cfg = transformers.AutoConfig.for_model("gemma2", **GEMMA2_9B, attn_implementation="eager")
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval()
    model.generation_config.eos_token_id = None
    return {prompt: serve_facts(model, torch.zeros(1, prompt, dtype=torch.int64, device="meta"), 8)
            for prompt in (8192, 32768)}


@pytest.mark.parametrize("prompt", [8192, 32768])
def test_gemma2_9b_is_priced_at_its_band_and_triangle(gemma2_9b, prompt):
    """Gemma-2-9B's shapes (16 heads of 256, soft-capping 50), W = 4,096 on the sliding layer,
    the triangle on the full one, bf16: per head, the sliding layer keeps W(W + 1)/2 + (P - W) W
    scores (8k: 25,167,872; 32k: 125,831,168), the full one P(P + 1)/2; each score left out
    saves 4 x 256 FLOPs of matmul and 10 of soft-capping, mask and softmax."""
    window, heads = 4096, 16
    band = {8192: 25_167_872, 32768: 125_831_168}[prompt]
    assert band == _band(prompt, window)
    left_out = heads * ((prompt * prompt - band) + (prompt * prompt - _triangle(prompt)))
    per_score = 4 * 256 + 10
    facts = gemma2_9b[prompt]
    row = _row(facts)
    assert row.prefill.skipped_flops == left_out * per_score
    assert row.prefill.compute_s == pytest.approx((facts.prefill_at(1).flops - left_out * per_score) / BF16, rel=1e-12)


@pytest.mark.parametrize("chunk", [None, 32])
def test_a_padded_prompt_is_priced_as_its_sequence_or_in_full(chunk):
    """A mask with padding: the mask proves the sequence, priced as its 91 real tokens alone, in one
    forward (branch servepad) and in chunks (branch servepad2: before, every score priced, nothing
    left out)."""
    model = _real("gemma2", chunk)
    mask = torch.ones(1, PROMPT, dtype=torch.int64)
    mask[:, :5] = 0
    ids = torch.randint(1, 50, (1, PROMPT))
    facts = serve_facts(model, ids, 4, kwargs={"attention_mask": mask})
    alone = serve_facts(model, ids[:, 5:], 4)
    priced, by_itself = facts.prefill_at(1), alone.prefill_at(1)
    assert priced.flops - priced.skipped_flops == by_itself.flops - by_itself.skipped_flops


def test_a_bidirectional_gemma2_is_priced_in_full():
    """``use_bidirectional_attention``: its layers' attention is not causal (transformers'
    ``is_causal`` False, every key admitted live); nothing is left out."""
    model = _real("gemma2", use_bidirectional_attention=True)
    ids = torch.randint(1, 50, (1, PROMPT))
    assert not any(getattr(m, "is_causal", True) for name, m in model.named_modules() if name.endswith("self_attn"))
    facts = serve_facts(model, ids, 4)
    assert _row(facts).prefill.skipped_flops == 0


# the matcher on events made by hand: (B, H) = (1, 2), Lq = Lk = 8, d = 4
def _t(*shape: int) -> TensorMeta:
    return TensorMeta(shape, "float32")


def _event(op: str, inputs: Tuple[TensorMeta, ...], out: TensorMeta, flops: int, module: str = "attn") -> Tuple[OpEvent, Cost]:
    names = ("self", "other", "third")
    return OpEvent(OpCall(op, dict(zip(names, inputs)), (out,)), ("layer", module)), Cost(flops=flops)


QK = _event("aten::matmul", (_t(1, 2, 8, 4), _t(1, 2, 4, 8)), _t(1, 2, 8, 8), 2 * 2 * 8 * 8 * 4)
SCALE = _event("aten::mul", (_t(1, 2, 8, 8),), _t(1, 2, 8, 8), 128)
MASK = _event("aten::add", (_t(1, 2, 8, 8), _t(1, 1, 8, 8)), _t(1, 2, 8, 8), 128)
SOFTMAX = _event("aten::softmax", (_t(1, 2, 8, 8),), _t(1, 2, 8, 8), 5 * 128)
SINKS = (OpEvent(OpCall("aten::cat", {"tensors": (_t(1, 2, 8, 8), _t(1, 2, 8, 1)), "dim": -1}, (_t(1, 2, 8, 9),)),
                 ("layer", "attn")), Cost())
ROW_MAX = _event("aten::max", (_t(1, 2, 8, 9),), _t(1, 2, 8, 1), 144)
SHIFTED = _event("aten::sub", (_t(1, 2, 8, 9), _t(1, 2, 8, 1)), _t(1, 2, 8, 9), 144)
SINK_SOFTMAX = _event("aten::softmax", (_t(1, 2, 8, 9),), _t(1, 2, 8, 9), 5 * 144)
PV = _event("aten::matmul", (_t(1, 2, 8, 8), _t(1, 2, 8, 4)), _t(1, 2, 8, 4), 2 * 2 * 8 * 8 * 4)
PROJECTION = _event("aten::linear", (_t(1, 8, 8), _t(8, 8)), _t(1, 8, 8), 2 * 8 * 8 * 8)


def _found(events: List[Tuple[OpEvent, Cost]], queries: int = 8) -> List[Tuple[int, int, Tuple[int, ...], Tuple[int, ...]]]:
    from flopcount.decoding.eager import score_ops  # new in serveeager

    return [(found.lq, found.lk, found.events, found.sinks) for found in score_ops(events, {"attn"}, queries)]


def test_the_score_ops_are_found_by_module_and_shape():
    """QK^T, the ops on the scores, PV: the three elementwise ops priced with the two matmuls;
    another module's op, a projection and an op over another shape are not."""
    other = _event("aten::mul", (_t(1, 2, 8, 8),), _t(1, 2, 8, 8), 128, module="mlp")
    elsewhere = _event("aten::mul", (_t(1, 2, 8, 4),), _t(1, 2, 8, 4), 64)
    events = [PROJECTION, QK, SCALE, other, MASK, elsewhere, SOFTMAX, PV]
    assert _found(events) == [(8, 8, (1, 2, 4, 6, 7), ())]


def test_gpt_oss_sink_column_ops_are_found_after_its_cat():
    """GPT-OSS: the scores, a cat of one sink logit per query, the row max, sub and softmax over
    Lq x (Lk + 1): those three priced with the sinks; before the cat, an op of that shape is not."""
    early = _event("aten::mul", (_t(1, 2, 8, 9),), _t(1, 2, 8, 9), 144)
    events = [QK, SCALE, MASK, early, SINKS, ROW_MAX, SHIFTED, SINK_SOFTMAX, PV]
    assert _found(events) == [(8, 8, (0, 1, 2, 8), (5, 6, 7))]


def test_sink_flops_price_the_admitted_scores_and_every_sink():
    """An op over Lq x (Lk + 1) entries keeps the causal triangle's scores and one sink per query."""
    from flopcount.devices.roofline import sink_flops

    assert sink_flops(8.0 * 9 * 7, 8, 8, 0) == 7 * (_triangle(8) + 8)
    assert sink_flops(8.0 * 9 * 7, 8, 8, 0, window=3) == 7 * (_band(8, 3) + 8)
    assert sink_flops(100.0, 8, 12, 0) == 100.0  # keys that are not the positions: all of it


@pytest.mark.parametrize("events, queries", [
    ([QK, SCALE, PROJECTION, SOFTMAX, PV], 8),  # a product between the two: not the pattern
    ([QK, SCALE, QK, SOFTMAX, PV, PV], 8),  # a second Q K^T before the first is used
    ([QK, SCALE, SOFTMAX], 8),  # no P V
    ([QK, SCALE, SOFTMAX, PV], 16),  # the score rows are not the forward's positions
])
def test_a_pattern_not_found_exactly_is_priced_in_full(events, queries):
    assert _found(events, queries) == []
