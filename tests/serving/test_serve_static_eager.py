"""serve's bounds over a static cache's sliding layers, eager attention's decode steps and scores
written with ``baddbmm`` or ``einsum``: the scores each call's mask admits (branch servepad).

- A static cache (``cache_implementation="static"``) keeps a sliding layer as a
  ``StaticSlidingWindowLayer`` of min(W, ``max_cache_len``) slots: a prefill that fits the window
  is handed all W slots (position i in slot i, the empty ones masked), one past it the prompt's
  own keys; a decode step all W slots, its mask admitting the min(W, p + 1) positions written.
  serve priced such a layer over every key it was handed.
- With eager attention (all Gemma-2 and GPT-OSS run in transformers 5.24) over a static cache, each
  score matmul and score op runs over every slot; serve priced the prefill's only where the keys were
  the positions, and no decode step's by score.
- GPT-2 loaded eager with ``reorder_and_upcast_attn`` forms its scores with ``baddbmm`` over the
  heads folded into the batch; serve found only ``matmul``/``bmm`` score products.

Oracles: the True entries of the masks transformers itself hands each attention call in
``generate()`` (read live: SDPA wrapped, or a forward pre-hook on each eager attention module),
on tiny real models (2 layers, 4 heads of 16, window 24, 100 slots), times the FLOPs per score by
hand (2 x head dim per matmul; one FLOP per elementwise op, five per softmax element: the
handlers' documented convention), and hand formulas (triangle, band, slots) for Mistral-7B's and
Gemma-2-9B's shapes.
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

import pytest
import torch

from flopcount.decoding.eager import score_ops
from flopcount.devices import named_roofs
from flopcount.serving import ServeFacts, serve_facts, serve_on
from flopcount.types import Cost, OpCall, OpEvent, TensorMeta
from tests.serving._sdpa_masks import generated, tiny_causal_lm

transformers = pytest.importorskip("transformers")

BF16 = 989.5e12  # the H100 SXM datasheet's dense BF16 peak
LAYERS, HEADS, KV_HEADS, HEAD_DIM, WINDOW, SLOTS = 2, 4, 2, 16, 24, 100
TINY: Dict[str, Any] = dict(hidden_size=HEADS * HEAD_DIM, intermediate_size=128, num_hidden_layers=LAYERS,
                            num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM, vocab_size=50,
                            max_position_embeddings=400)
#: one position of one layer's float32 cache, keys and values, per sequence
LAYER_POSITION_BYTES = 2 * KV_HEADS * HEAD_DIM * 4
# FLOPs per score and head besides the two matmuls' 2 x head dim each: Gemma-2's scaling, soft-capping
# (div, tanh, mul), mask add, softmax; GPT-OSS's scaling, mask add, and max, sub, softmax over the
# scores with a sink column (priced at the admitted scores and the sinks); Llama's scaling, add, softmax
ELEMENTWISE = {"gemma2": 1 + 3 + 1 + 5, "gpt_oss": 1 + 1, "llama": 1 + 1 + 5}
SINK_OPS = {"gpt_oss": 1 + 1 + 5}
EAGER: Dict[str, Dict[str, Any]] = {
    "gemma2": dict(sliding_window=WINDOW),  # sliding and full layers alternating
    "gpt_oss": dict(sliding_window=WINDOW, num_local_experts=2, num_experts_per_tok=1),
    "llama": {},
}


def _triangle(n: int) -> int:
    return n * (n + 1) // 2


def _static(model: Any, slots: int = SLOTS) -> Any:
    model.generation_config.cache_implementation = "static"
    model.generation_config.max_cache_len = slots
    return model


def _row(facts: ServeFacts, batch: int = 1) -> Any:
    return serve_on(facts, named_roofs("h100"), "H100 SXM", None, "", batch=batch, dtype="bfloat16").at(batch)


def _priced(work: Any) -> float:
    """A forward's attention FLOPs the bound prices: counted, less those left out."""
    return work.attention_flops - work.skipped_flops


def _per_forward(values: List[int], forwards: int) -> List[int]:
    per = len(values) // forwards
    assert per * forwards == len(values)
    return [sum(values[k * per:(k + 1) * per]) for k in range(forwards)]


# a static cache's sliding layers (SDPA) -----------------------------------------------------------

def test_a_static_sliding_layer_is_handed_its_slots_then_the_prompt():
    """The premise, live: a Mistral (W = 24) over a static cache of 100 slots keeps each layer as a
    StaticSlidingWindowLayer of 24 slots; a 16-position prompt is handed all 24 (admitting its
    triangle), a 40-position one its own 40 keys (the band); every decode step 24 keys, admitting
    min(24, p + 1)."""
    model = _static(tiny_causal_lm("mistral", TINY, sliding_window=WINDOW))
    for prompt, prefill_keys in ((16, WINDOW), (40, 40)):
        seen = generated(model, torch.randint(1, 50, (1, prompt)), 4)
        assert seen.keys == [prefill_keys] * LAYERS + [WINDOW] * (LAYERS * 3)
        band = _triangle(min(prompt, WINDOW)) + max(0, prompt - WINDOW) * WINDOW
        assert seen.scores[:LAYERS] == [HEADS * band] * LAYERS
        assert [int(m.sum(-1).max()) for m in seen.masks[-LAYERS * 3:]] == \
            [min(WINDOW, p + 1) for p in range(prompt, prompt + 3) for _ in range(LAYERS)]
    cache = transformers.StaticCache(config=model.config, max_cache_len=SLOTS)
    with torch.no_grad():
        model(torch.randint(1, 50, (1, 16)), past_key_values=cache, use_cache=True)
    assert [type(layer).__name__ for layer in cache.layers] == ["StaticSlidingWindowLayer"] * LAYERS
    assert [layer.keys.shape[-2] for layer in cache.layers] == [WINDOW] * LAYERS


@pytest.mark.parametrize("model_type, config", [
    ("mistral", dict(sliding_window=WINDOW)),
    ("gemma3_text", dict(sliding_window=WINDOW, layer_types=["sliding_attention", "full_attention"])),
])
@pytest.mark.parametrize("prompt", [16, 40])  # within the window (its slots), past it (the prompt's keys)
def test_static_sliding_layers_are_priced_at_the_scores_their_masks_admit(model_type, config, prompt):
    """The prefill's and every decode step's priced attention = the live masks' True entries x
    4 x head dim; each step reads the positions written before it (p of them, not the 24 slots),
    each layer min(p, its slots). Before: the sliding layers were priced over all their slots."""
    model = _static(tiny_causal_lm(model_type, TINY, **config))
    ids = torch.randint(1, 50, (1, prompt))
    new = 6
    seen = generated(model, ids, new)
    facts = serve_facts(model, ids, new)
    per_score = 4 * HEAD_DIM
    assert _priced(facts.prefill_at(1)) == sum(seen.scores[:LAYERS]) * per_score
    live = _per_forward(seen.scores[LAYERS:], new - 1)
    sliding = LAYERS if model_type == "mistral" else 1
    for step in range(new - 1):
        work = facts.step_at(1, step)
        p = prompt + step
        assert _priced(work) == live[step] * per_score
        held = sliding * min(p, WINDOW) + (LAYERS - sliding) * p  # positions written, per layer
        assert work.cache_read == pytest.approx(held * LAYER_POSITION_BYTES, abs=64)  # + the cache's counters
        assert work.flops == facts.step_at(1, step).flops  # the count is unchanged


def test_mistral_7b_static_sliding_layers_by_hand():
    """Mistral-7B's shapes (2 of its 32 layers, W = 4,096) over a static cache of 8,192 slots, prompt
    2,048: the prefill is handed the W slots and priced at its triangle, P x W - P(P + 1)/2 scores left
    out per head; decode step s at 2,048 + s + 1 keys of the W, 4,096 - 2,049 - s left out."""
    config = transformers.AutoConfig.for_model(
        "mistral", num_hidden_layers=2, hidden_size=4096, num_attention_heads=32, num_key_value_heads=8,
        intermediate_size=14336, vocab_size=32000, sliding_window=4096, max_position_embeddings=32768,
        attn_implementation="sdpa")
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.generation_config.eos_token_id = None
    _static(model, 8192)
    prompt, window, per_score = 2048, 4096, 2 * 32 * 4 * 128  # layers x heads x 4 x head dim
    facts = serve_facts(model, torch.zeros(1, prompt, dtype=torch.int64, device="meta"), 8)
    row = _row(facts)
    assert row.prefill.skipped_flops == per_score * (prompt * window - _triangle(prompt))
    for step in range(7):
        assert facts.step_at(1, step).skipped_flops == per_score * (window - (prompt + step + 1))
    assert row.prefill.compute_s == pytest.approx((row.prefill.flops - row.prefill.skipped_flops) / BF16, rel=1e-12)


# eager attention over a static cache: prefill and decode ------------------------------------------

def _eager(model_type: str) -> Any:
    cfg = transformers.AutoConfig.for_model(model_type, **TINY, **EAGER[model_type], attn_implementation="eager")
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    model.generation_config.eos_token_id = None
    return model


def _eager_live(model: Any, ids: torch.Tensor, new: int, suffix: str = "self_attn") -> List[Tuple[int, int]]:
    """Per forward of generate() (the prefill, then each decode step), summed over its layers:
    (the True entries of the additive float mask transformers hands each eager attention module,
    the entries of its Lq x Lk square), per head."""
    seen: List[torch.Tensor] = []

    def hook(module: Any, args: Any, kwargs: Dict[str, Any]) -> None:
        seen.append(kwargs["attention_mask"])

    attention = [m for name, m in model.named_modules() if name.endswith(suffix)]
    assert len(attention) == LAYERS
    hooks = [m.register_forward_pre_hook(hook, with_kwargs=True) for m in attention]
    try:
        with torch.no_grad():
            model.generate(ids, max_new_tokens=new, do_sample=False)
    finally:
        for handle in hooks:
            handle.remove()
    assert len(seen) == LAYERS * new and all(m.dtype.is_floating_point and m.shape[:2] == (1, 1) for m in seen)
    admitted = _per_forward([int((m == 0).sum()) for m in seen], new)
    square = _per_forward([m[0, 0].numel() for m in seen], new)
    rows = _per_forward([m.shape[-2] for m in seen], new)
    return [(a, s, r) for a, s, r in zip(admitted, square, rows)]


@pytest.mark.parametrize("model_type", ["gemma2", "gpt_oss", "llama"])
@pytest.mark.parametrize("prompt", [16, 40])
def test_eager_attention_over_a_static_cache_is_priced_at_the_live_masks(model_type, prompt):
    """Real weights, a static cache of 100 slots: the prefill's and every decode step's FLOPs left
    out = (the square's entries - the mask's True entries) x heads x FLOPs per score (plus, for
    GPT-OSS, its three ops over the scores and a sink column: the same scores left out of
    Lq x (Lk + 1)); taken off the matmuls' column, not attention's (no attention op). Before: the
    prefill in full (its keys are the slots, not the positions) and every step in full."""
    model = _static(_eager(model_type))
    ids = torch.randint(1, 50, (1, prompt))
    new = 6
    live = _eager_live(model, ids, new)
    facts = serve_facts(model, ids, new)
    per_score = 2 * 2 * HEAD_DIM + ELEMENTWISE[model_type] + SINK_OPS.get(model_type, 0)
    works = [facts.prefill_at(1), *(facts.step_at(1, s) for s in range(new - 1))]
    for (admitted, square, _), work in zip(live, works):
        assert work.skipped_flops == HEADS * (square - admitted) * per_score
        assert work.skipped_attention_flops == 0
    # by hand, per head: a step's one query at p sees p + 1 of a full layer's 100 slots, min(24, p + 1)
    # of a sliding layer's 24 (Gemma-2 and GPT-OSS: one layer of each; Llama: two full layers)
    sliding = 0 if model_type == "llama" else 1
    hand = [(LAYERS - sliding) * (SLOTS - (p + 1)) + sliding * (WINDOW - min(WINDOW, p + 1))
            for p in range(prompt, prompt + new - 1)]
    assert [square - admitted for admitted, square, _ in live[1:]] == hand


def test_gemma2_static_steps_are_priced_off_the_matmuls_column():
    """The step's bound: compute term (counted - skipped) / the BF16 peak, its attention FLOPs
    (none: eager) untouched."""
    model = _static(_eager("gemma2"))
    facts = serve_facts(model, torch.randint(1, 50, (1, 16)), 4)
    step = _row(facts).first_step
    assert step.skipped_flops > 0 and facts.step_at(1, 0).attention_flops == 0
    assert step.compute_s == pytest.approx((step.flops - step.skipped_flops) / BF16, rel=1e-12)


# scores formed by baddbmm (GPT-2's reorder_and_upcast_attn) ---------------------------------------

GPT2 = dict(n_embd=HEADS * HEAD_DIM, n_layer=LAYERS, n_head=HEADS, vocab_size=50, n_positions=400, bos_token_id=1,
            eos_token_id=None, reorder_and_upcast_attn=True, attn_implementation="eager")


def test_gpt2_baddbmm_scores_are_priced_at_the_live_mask():
    """GPT-2 eager with reorder_and_upcast_attn: baddbmm(empty, q, k^T, beta=0) into (B H, Lq, Lk),
    viewed as (B, H, Lq, Lk) for the mask's add and softmax, then matmul by V. Prefill (prompt 40):
    left out = (square - live True entries) x heads x (2 x 16 + 1 + 5 + 2 x 16); the live mask is the
    triangle. Decode steps over a dynamic cache: every key admitted, nothing left out."""
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(transformers.GPT2Config(**GPT2)).eval()
    model.generation_config.eos_token_id = None
    prompt, new = 40, 6
    ids = torch.randint(1, 50, (1, prompt))
    live = _eager_live(model, ids, new, suffix=".attn")
    assert live[0][0] == LAYERS * _triangle(prompt)
    facts = serve_facts(model, ids, new)
    per_score = 2 * HEAD_DIM + 1 + 5 + 2 * HEAD_DIM
    assert facts.prefill.skipped_flops == HEADS * (live[0][1] - live[0][0]) * per_score
    assert [facts.step_at(1, s).skipped_flops for s in range(new - 1)] == [0.0] * (new - 1)
    assert all(square == admitted for admitted, square, _ in live[1:])


# the matcher on events made by hand --------------------------------------------------------------

def _t(*shape: int) -> TensorMeta:
    return TensorMeta(tuple(shape), "float32")


def _event(op: str, args: Dict[str, Any], out: TensorMeta, flops: int, module: str = "attn") -> Tuple[OpEvent, Cost]:
    return OpEvent(OpCall(op, args, (out,)), (module,)), Cost(flops=flops)


def _einsum(equation: str, a: TensorMeta, b: TensorMeta, out: TensorMeta) -> Tuple[OpEvent, Cost]:
    return _event("aten::einsum", {"equation": equation, "tensors": [a, b]}, out, 1)


def _elementwise(op: str, shape: Tuple[int, ...]) -> Tuple[OpEvent, Cost]:
    numel = 1
    for n in shape:
        numel *= n
    return _event(op, {"self": _t(*shape)}, _t(*shape), numel * (5 if op == "aten::_softmax" else 1))


def _found(events: List[Tuple[OpEvent, Cost]], queries: int = 8) -> List[Tuple[int, int, Tuple[int, ...]]]:
    return [(f.lq, f.lk, f.events) for f in score_ops(events, frozenset({"attn"}), queries)]


def test_einsum_score_products_are_found():
    """q (2, 4, 8, 16), k (2, 4, 12, 16): einsum QK^T "bhqd,bhkd->bhqk", a scaling mul and softmax on
    the (2, 4, 8, 12) scores, einsum PV "bhqk,bhkd->bhqd": the four priced by score."""
    scores = (2, 4, 8, 12)
    events = [
        _einsum("bhqd,bhkd->bhqk", _t(2, 4, 8, 16), _t(2, 4, 12, 16), _t(*scores)),
        _elementwise("aten::mul", scores),
        _elementwise("aten::_softmax", scores),
        _einsum("bhqk,bhkd->bhqd", _t(*scores), _t(2, 4, 12, 16), _t(2, 4, 8, 16)),
    ]
    assert _found(events) == [(8, 12, (0, 1, 2, 3))]
    # the same written with the head before the batch, and spaces
    events[0] = _einsum("hbqd, hbkd -> hbqk", _t(4, 2, 8, 16), _t(4, 2, 12, 16), _t(4, 2, 8, 12))
    events[3] = _einsum("hbqk,hbkd->hbqd", _t(4, 2, 8, 12), _t(4, 2, 12, 16), _t(4, 2, 8, 16))
    assert _found(events) == [(8, 12, (0, 1, 2, 3))]


def test_baddbmm_scores_with_the_heads_folded_are_found():
    """baddbmm of (8, 8, 16) by (8, 16, 12) into (8, 8, 12) (batch 2 x 4 heads folded), the ops on the
    (2, 4, 8, 12) view, a matmul of that view by V: found, the baddbmm's added tensor broadcast."""
    scores = (2, 4, 8, 12)
    events = [
        _event("aten::baddbmm", {"self": _t(8, 8, 12), "batch1": _t(8, 8, 16), "batch2": _t(8, 16, 12)},
               _t(8, 8, 12), 2 * 8 * 8 * 12 * 16),
        _elementwise("aten::add", scores),
        _elementwise("aten::_softmax", scores),
        _event("aten::matmul", {"self": _t(*scores), "other": _t(2, 4, 12, 16)}, _t(2, 4, 8, 16), 1),
    ]
    assert _found(events) == [(8, 12, (0, 1, 2, 3))]


@pytest.mark.parametrize("equation, shapes, out", [
    ("bhqd,bhkd->bhkq", ((2, 4, 8, 16), (2, 4, 12, 16)), (2, 4, 12, 8)),  # the output's free subscripts swapped
    ("bhqd,bhkd->bqhk", ((2, 4, 8, 16), (2, 4, 12, 16)), (2, 8, 4, 12)),  # the heads moved
    ("...qd,...kd->...qk", ((2, 4, 8, 16), (2, 4, 12, 16)), (2, 4, 8, 12)),  # an ellipsis
    ("bhqd,bhkd->bhq", ((2, 4, 8, 16), (2, 4, 12, 16)), (2, 4, 8)),  # k contracted too
])
def test_einsum_forms_that_are_not_a_plain_product_are_left_in_full(equation, shapes, out):
    events = [
        _einsum(equation, _t(*shapes[0]), _t(*shapes[1]), _t(*out)),
        _elementwise("aten::_softmax", out),
        _einsum("bhqk,bhkd->bhqd", _t(2, 4, 8, 12), _t(2, 4, 12, 16), _t(2, 4, 8, 16)),
    ]
    assert _found(events) == []


def test_a_baddbmm_whose_added_tensor_grows_the_product_is_left_in_full():
    events = [
        _event("aten::baddbmm", {"self": _t(2, 8, 8, 12), "batch1": _t(8, 8, 16), "batch2": _t(8, 16, 12)},
               _t(8, 8, 12), 1),
        _event("aten::matmul", {"self": _t(8, 8, 12), "other": _t(8, 12, 16)}, _t(8, 8, 16), 1),
    ]
    assert _found(events) == []


# left priced as before ---------------------------------------------------------------------------

def test_a_padded_prompt_over_a_static_sliding_cache_leaves_its_steps_in_full():
    """A padded prompt's slots are not proved: its decode steps leave nothing out, as before (its
    prefill is priced as its sequences alone: test_serve_padded)."""
    model = _static(tiny_causal_lm("mistral", TINY, sliding_window=WINDOW))
    ids = torch.randint(1, 50, (2, 16))
    mask = torch.ones(2, 16, dtype=torch.int64)
    mask[1, :5] = 0
    facts = serve_facts(model, ids, 4, kwargs={"attention_mask": mask})
    assert [facts.step_at(2, s).skipped_flops for s in range(3)] == [0.0] * 3
