"""serve's bounds for a padded batch over sliding-window layers, a static cache and a chunked
prefill (branch servepad2; servepad priced a padded batch's one-forward prefill and its steps over
full-attention dynamic layers only).

Sliding-window layers: only the decode steps of a left-padded batch.

transformers keeps a sliding layer (window W) as a ``DynamicSlidingWindowLayer`` holding the W - 1
latest positions of every row, pads included, and its mask's window counts slots: a step at slot
p admits slots p - W + 1..p that are not pads. For a left-padded row (pad slots 0..pad - 1) those
are its own latest min(W, p - pad + 1) tokens: exactly what an engine running the sequence alone
(vLLM's sliding-window varlen/paged kernels) admits at its position p - pad (read live below; a
right-padded row's are fewer than its sequence's, and stay priced in full). Before, a padded
batch's steps over any cache with a sliding layer were priced over every key handed, the pads'
cache bytes read and held.

A static cache (S slots, position i in slot i): a step at slot p is handed all S slots of every
row, its mask admitting the row's real slots up to p, p - pad + 1 of them (read live, left and right
padding): an engine that packs the sequences (paged) attends over those only, and holds them only;
before, every step was priced over the S slots and the cache at the rows' P + s slots, pads included.

A chunked prefill (``prefill_chunk_size``): each chunk is handed the mask up to its end and the cache
ends holding every row's P positions, pads included, as one forward leaves it (read live); before,
the chunked prefill of a padded batch was priced in full, pads and all, and its steps over every key.

Oracles: the True entries of the masks transformers builds in ``generate()`` on the real rows
(SDPA wrapped; a forward pre-hook on eager attention) x the FLOPs per score by hand; the positions
each row's sliding layer holds, by hand."""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

import pytest
import torch

from flopcount.serving import serve_facts
from tests.serving._sdpa_masks import generated, tiny_causal_lm

transformers = pytest.importorskip("transformers")

LAYERS, HEADS, KV_HEADS, HEAD_DIM, WINDOW = 2, 4, 2, 16, 24
TINY: Dict[str, Any] = dict(hidden_size=HEADS * HEAD_DIM, intermediate_size=128, num_hidden_layers=LAYERS,
                            num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM, vocab_size=50,
                            max_position_embeddings=400)
PER_SCORE = 4 * HEAD_DIM  # QK^T and PV, 2 x head dim each
LAYER_POSITION_BYTES = 2 * KV_HEADS * HEAD_DIM * 4  # one float32 position of one layer, keys and values


def _left(prompt: int, lengths: Tuple[int, ...]) -> torch.Tensor:
    mask = torch.zeros(len(lengths), prompt, dtype=torch.int64)
    for row, length in enumerate(lengths):
        mask[row, prompt - length:] = 1
    return mask


def _ids(rows: int, prompt: int) -> torch.Tensor:
    torch.manual_seed(1)
    return torch.randint(1, 50, (rows, prompt))


def _held(written: int, pad: int, window: int) -> int:
    """The real positions a row's sliding layer keeps once ``written`` slots were fed: of the latest
    min(written, W - 1), those past its ``pad`` pads."""
    kept = min(written, window - 1)
    return kept - max(0, pad - (written - kept))


@pytest.mark.parametrize("prompt, lengths, new", [
    (40, (40, 10), 4),   # the window full from the prefill on (derived count)
    (40, (40, 10), 9),
    (16, (16, 6), 12),   # the window fills during the decode (counted step by step)
])
def test_left_padded_sliding_steps_are_priced_at_each_sequences_window(prompt, lengths, new):
    """Mistral (window 24): each step's priced attention = the live masks' True entries x 4 x head
    dim; its cache read each row's own real positions held before it, the cache held at the end
    likewise (by hand)."""
    model = tiny_causal_lm("mistral", TINY, sliding_window=WINDOW)
    ids, mask = _ids(len(lengths), prompt), _left(prompt, lengths)
    seen = generated(model, ids, new, attention_mask=mask)
    live = [sum(seen.scores[LAYERS * (1 + s):LAYERS * (2 + s)]) for s in range(new - 1)]
    pads = [prompt - length for length in lengths]
    # by hand: a row at slot p admits min(W, p - pad + 1) keys, per head and layer
    assert live == [LAYERS * HEADS * sum(min(WINDOW, prompt + s - pad + 1) for pad in pads) for s in range(new - 1)]
    facts = serve_facts(model, ids, new, kwargs={"attention_mask": mask})
    rows = len(lengths)
    for step in range(new - 1):
        work = facts.step_at(rows, step)
        assert work.attention_flops - work.skipped_flops == live[step] * PER_SCORE
        read = sum(_held(prompt + step, pad, WINDOW) for pad in pads) * LAYERS * LAYER_POSITION_BYTES
        assert work.cache_read == pytest.approx(read, abs=64)
    # the storage a step's view keeps alive: its W-slot concatenation (min(written, W) after a step)
    written = prompt + new - 1
    stored = sum(min(written, WINDOW) - max(0, pad - (written - min(written, WINDOW))) for pad in pads)
    assert facts.at("cache_held", rows) == pytest.approx(stored * LAYERS * LAYER_POSITION_BYTES, abs=64)


def test_gemma2_eager_padded_steps_are_priced_at_the_live_masks():
    """Gemma-2 loaded eager, one sliding (24) and one full layer, rows of 40 and 10 left-padded:
    each step's FLOPs left out = (the masks' entries - their True entries on the real rows) x heads x
    (4 x head dim + its 10 elementwise FLOPs per score: scaling, soft-capping div/tanh/mul, the
    mask's add, softmax's 5), off the matmuls' column."""
    cfg = transformers.AutoConfig.for_model("gemma2", **TINY, sliding_window=WINDOW, attn_implementation="eager")
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    model.generation_config.eos_token_id = None
    ids, mask, new = _ids(2, 40), _left(40, (40, 10)), 6
    seen: List[torch.Tensor] = []
    hooks = [m.register_forward_pre_hook(lambda module, args, kwargs: seen.append(kwargs["attention_mask"]), with_kwargs=True)
             for name, m in model.named_modules() if name.endswith("self_attn")]
    try:
        with torch.no_grad():
            model.generate(ids, attention_mask=mask, max_new_tokens=new, do_sample=False)
    finally:
        for handle in hooks:
            handle.remove()
    steps = seen[LAYERS:]
    assert [tuple(m.shape) for m in steps[:2]] == [(2, 1, 1, WINDOW), (2, 1, 1, 41)]  # sliding, then full
    left_out = [sum(m[:, 0].numel() - int((m == 0).sum()) for m in steps[LAYERS * s:LAYERS * (s + 1)]) for s in range(new - 1)]
    facts = serve_facts(model, ids, new, kwargs={"attention_mask": mask})
    for step in range(new - 1):
        work = facts.step_at(2, step)
        assert work.skipped_flops == HEADS * left_out[step] * (PER_SCORE + 10)
        assert work.skipped_attention_flops == 0
    # by hand at step 0 (slot 40): the sliding layer hands 24 keys, the short row admits 11; the full
    # layer 41, the short row 11
    assert left_out[0] == (WINDOW - 11) + (41 - 11)


def test_mistral_7b_padded_steps_by_hand():
    """Mistral-7B's shapes (2 of its layers, window 4,096) on meta, 8 prompts of 512..2,048 tokens
    left-padded to 2,048 (``prompt_lengths``): the window never ends inside, so step 0 leaves out
    every pad key, 6,144 x 2 layers x 32 heads x 4 x 128 FLOPs, and reads the rows' 10,240 real
    positions x 2 layers x 2 x 8 KV heads x 128 x 2 bytes."""
    config = transformers.AutoConfig.for_model("mistral", num_hidden_layers=2, hidden_size=4096, num_attention_heads=32,
                                               num_key_value_heads=8, intermediate_size=14336, vocab_size=32000,
                                               sliding_window=4096)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.generation_config.eos_token_id = None
    lengths = [round(512 + (2048 - 512) * k / 7) for k in range(8)]
    assert sum(lengths) == 10240
    facts = serve_facts(model, torch.zeros(8, 2048, dtype=torch.int64, device="meta"), 3, prompt_lengths=lengths)
    step = facts.step_at(8, 0)
    assert step.skipped_flops == (8 * 2048 - 10240) * 2 * 32 * 4 * 128
    # (and each sliding layer's 8-byte window tensor, which the cache object holds)
    assert step.cache_read == pytest.approx(10240 * 2 * 2 * 8 * 128 * 2, abs=64)


def test_right_padded_sliding_steps_stay_in_full():
    """A right-padded row's window counts slots past its pads: live, it admits fewer keys than its
    sequence alone would (35 x 4 x 2 at step 0 where the sequences alone admit 35 + 10); not the
    sequence's work, so its steps stay priced over every key handed, as before."""
    model = tiny_causal_lm("mistral", TINY, sliding_window=WINDOW)
    ids = _ids(2, 40)
    mask = torch.zeros(2, 40, dtype=torch.int64)
    mask[0], mask[1, :10] = 1, 1
    seen = generated(model, ids, 3, attention_mask=mask)
    assert sum(seen.scores[LAYERS:2 * LAYERS]) == LAYERS * HEADS * (24 + 1)
    facts = serve_facts(model, ids, 3, kwargs={"attention_mask": mask})
    assert [facts.step_at(2, s).skipped_flops for s in range(2)] == [0.0, 0.0]


# a static cache ------------------------------------------------------------------------------------

SLOTS = 100
POSITION_BYTES = LAYERS * LAYER_POSITION_BYTES


@pytest.mark.parametrize("side", ["left", "right"])
def test_padded_steps_over_a_static_cache_are_priced_at_each_sequences_slots(side):
    """A Llama over a static cache of 100 slots, rows of 40 and 10 real tokens in 40 positions: each
    step's priced attention = the live masks' True entries x 4 x head dim ((41 + s) + (11 + s) of 2 x
    100 slots per head and layer, by hand); its cache read the rows' (40 + s) + (10 + s) real
    positions, the prefill's write 50, the cache held at the end (44 + 14)."""
    model = tiny_causal_lm("llama", TINY)
    model.generation_config.cache_implementation, model.generation_config.max_cache_len = "static", SLOTS
    ids = _ids(2, 40)
    mask = torch.zeros(2, 40, dtype=torch.int64)
    mask[0] = 1
    if side == "left":
        mask[1, 30:] = 1
    else:
        mask[1, :10] = 1
    new = 5
    seen = generated(model, ids, new, attention_mask=mask)
    assert seen.keys == [SLOTS] * LAYERS * new
    live = [sum(seen.scores[LAYERS * (1 + s):LAYERS * (2 + s)]) for s in range(new - 1)]
    assert live == [LAYERS * HEADS * ((41 + s) + (11 + s)) for s in range(new - 1)]
    facts = serve_facts(model, ids, new, kwargs={"attention_mask": mask})
    for step in range(new - 1):
        work = facts.step_at(2, step)
        assert work.attention_flops - work.skipped_flops == live[step] * PER_SCORE
        assert work.cache_read == pytest.approx((50 + 2 * step) * POSITION_BYTES, abs=64)
    assert facts.prefill_at(2).cache_written == pytest.approx(50 * POSITION_BYTES, abs=64)
    assert facts.at("cache_held", 2) == pytest.approx((44 + 14) * POSITION_BYTES, abs=64)


def test_llama_2_7b_padded_static_steps_by_hand():
    """LLaMA-2-7B's shapes (2 of its layers) on meta, a static cache of 4,096 slots, 8 prompts of
    512..2,048 tokens left-padded to 2,048 (``prompt_lengths``): step 0 (slot 2,048) is handed the
    4,096 slots of each row and needs its own 2,049 - pad: 8 x 4,096 - (10,240 + 8) keys left out x 2
    layers x 32 heads x 4 x 128 FLOPs; it reads the rows' 10,240 real positions x 2 layers x 2 x 4,096
    x 2 bytes."""
    config = transformers.AutoConfig.for_model("llama", num_hidden_layers=2, hidden_size=4096, num_attention_heads=32,
                                               num_key_value_heads=32, intermediate_size=11008, vocab_size=32000)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.generation_config.eos_token_id = None
    model.generation_config.cache_implementation, model.generation_config.max_cache_len = "static", 4096
    lengths = [round(512 + (2048 - 512) * k / 7) for k in range(8)]
    facts = serve_facts(model, torch.zeros(8, 2048, dtype=torch.int64, device="meta"), 3, prompt_lengths=lengths)
    step = facts.step_at(8, 0)
    assert step.skipped_flops == (8 * 4096 - (10240 + 8)) * 2 * 32 * 4 * 128
    assert step.cache_read == pytest.approx(10240 * 2 * 2 * 4096 * 2, abs=64)


# a chunked prefill ---------------------------------------------------------------------------------

def _triangle(n: int) -> int:
    return n * (n + 1) // 2


@pytest.mark.parametrize("side", ["left", "right"])
def test_a_padded_chunked_prefill_is_priced_at_its_sequences(side):
    """A Llama prefilling in chunks of 16, rows of 40 and 25 real tokens in 40 positions: the prefill
    priced as the two prompts alone (each chunked as generate() chunks it), its attention at the two
    triangles by hand; each step's priced attention = the live masks' True entries x 4 x head dim,
    (41 + s) + (26 + s) per head and layer."""
    model = tiny_causal_lm("llama", TINY, chunk=16)
    ids = _ids(2, 40)
    mask = torch.zeros(2, 40, dtype=torch.int64)
    mask[0] = 1
    if side == "left":
        mask[1, 15:] = 1
    else:
        mask[1, :25] = 1
    new = 4
    seen = generated(model, ids, new, attention_mask=mask)
    assert seen.keys[:3 * LAYERS] == [16] * LAYERS + [32] * LAYERS + [40] * LAYERS  # three chunks
    live = [sum(seen.scores[LAYERS * (3 + s):LAYERS * (4 + s)]) for s in range(new - 1)]
    assert live == [LAYERS * HEADS * ((41 + s) + (26 + s)) for s in range(new - 1)]
    facts = serve_facts(model, ids, new, kwargs={"attention_mask": mask})
    prefill = facts.prefill_at(2)
    alone = [serve_facts(model, ids[row:row + 1, mask[row].bool()], new).prefill_at(1) for row in range(2)]
    assert prefill.flops - prefill.skipped_flops == sum(w.flops - w.skipped_flops for w in alone)
    assert prefill.attention_flops - prefill.skipped_attention_flops == \
        LAYERS * HEADS * (_triangle(40) + _triangle(25)) * PER_SCORE
    for step in range(new - 1):
        work = facts.step_at(2, step)
        assert work.attention_flops - work.skipped_flops == live[step] * PER_SCORE
