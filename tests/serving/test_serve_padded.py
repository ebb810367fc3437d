"""serve's bounds for a padded batch of prompts: each sequence's real tokens (branch servepad).

A batch of prompts of different lengths is padded to one length P with an attention mask (left
padding, as generate() expects of a decoder-only model, or right). transformers computes every pad
position: the projections and MLP over B x P tokens, each attention over the P x P square with an
explicit mask, each decode step over P + s keys per sequence, the cache holding the pads. An engine
with variable-length (packed or paged) attention (vLLM, TGI, SGLang) never computes or holds a pad
position. Where the mask's values prove each row's real tokens (one run of ones at the start or the
end of the row), serve now prices the prefill as each sequence prefilled alone, each decode step's
attention at each sequence's own positions, and the cache at the sequences' own positions; the
count (count_generation, ``flops``) stays what transformers computes.

Oracles: the True entries of the masks transformers itself builds in ``generate()`` (read live by
wrapping SDPA, or by a forward pre-hook on eager attention) on the real rows, times 4 x head dim
FLOPs per score; hand formulas for the cache's positions; and the invariant that the padded batch's
priced prefill is the sum of its sequences' priced prefills, each an unpadded prompt.
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

import pytest
import torch

import flopcount
from flopcount.devices import named_roofs
from flopcount.serving import ServeFacts, serve_facts, serve_on
from tests.serving._sdpa_masks import generated, tiny_causal_lm

transformers = pytest.importorskip("transformers")

BF16 = 989.5e12  # the H100 SXM datasheet's dense BF16 peak
LAYERS, HEADS, KV_HEADS, HEAD_DIM, PROMPT, SHORT = 2, 4, 2, 16, 40, 25
TINY: Dict[str, Any] = dict(hidden_size=HEADS * HEAD_DIM, intermediate_size=128, num_hidden_layers=LAYERS,
                            num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM, vocab_size=50,
                            max_position_embeddings=400)
#: one position of the tiny models' float32 cache, keys and values of every layer, per sequence
POSITION_BYTES = LAYERS * 2 * KV_HEADS * HEAD_DIM * 4
PER_SCORE = 4 * HEAD_DIM  # QK^T and PV, 2 x head dim each


def _triangle(n: int) -> int:
    return n * (n + 1) // 2


def _mask(side: str, lengths: Tuple[int, ...] = (PROMPT, SHORT)) -> torch.Tensor:
    mask = torch.zeros(len(lengths), PROMPT, dtype=torch.int64)
    for row, length in enumerate(lengths):
        start = PROMPT - length if side == "left" else 0
        mask[row, start:start + length] = 1
    return mask


def _ids(rows: int = 2) -> torch.Tensor:
    torch.manual_seed(1)
    return torch.randint(1, 50, (rows, PROMPT))


def _row(facts: ServeFacts, batch: int) -> Any:
    return serve_on(facts, named_roofs("h100"), "H100 SXM", None, "", batch=batch, dtype="bfloat16").at(batch)


def _priced(work: Any) -> float:
    return work.flops - work.skipped_flops


def _per_forward(values: List[int], forwards: int) -> List[int]:
    per = len(values) // forwards
    assert per * forwards == len(values)
    return [sum(values[k * per:(k + 1) * per]) for k in range(forwards)]


# the premise, live ---------------------------------------------------------------------------------

@pytest.mark.parametrize("side", ["left", "right"])
def test_transformers_computes_the_pads(side):
    """A tiny Llama, rows of 40 and 25 real tokens in 40 positions: the prefill hands SDPA an explicit
    40 x 40 mask whose real query rows admit each sequence's triangle, 820 + 325 per head (right
    padding also admits each pad query row's 25 real keys: computed, and thrown away); decode step s
    is handed 41 + s keys per sequence, its mask admitting 41 + s and 26 + s."""
    model = tiny_causal_lm("llama", TINY)
    mask = _mask(side)
    seen = generated(model, _ids(), 4, attention_mask=mask)
    assert seen.keys == [PROMPT] * LAYERS + [PROMPT + 1 + s for s in range(3) for _ in range(LAYERS)]
    pad_rows = 0 if side == "left" else (PROMPT - SHORT) * SHORT
    assert seen.scores[:LAYERS] == [HEADS * (_triangle(PROMPT) + _triangle(SHORT) + pad_rows)] * LAYERS
    assert _per_forward(seen.scores[LAYERS:], 3) == [LAYERS * HEADS * (PROMPT + 1 + s + SHORT + 1 + s) for s in range(3)]


# the prefill: each sequence alone ------------------------------------------------------------------

@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("new", [3, 8])  # 8: serve's derived count (batch 3 from its prefill and two steps)
def test_the_prefill_is_priced_at_each_sequence_alone(side, new):
    """Priced attention = the live masks' True entries on the real rows x 4 x head dim (each
    sequence's triangle, by hand); priced FLOPs = the two unpadded prompts' priced prefills summed;
    the count unchanged (transformers' B x P); the compute term from what is priced."""
    model = tiny_causal_lm("llama", TINY)
    ids, mask = _ids(), _mask(side)
    facts = serve_facts(model, ids, new, kwargs={"attention_mask": mask})
    prefill = facts.prefill_at(2)
    assert prefill.attention_flops - prefill.skipped_attention_flops == \
        LAYERS * HEADS * (_triangle(PROMPT) + _triangle(SHORT)) * PER_SCORE
    alone = [serve_facts(model, ids[row:row + 1, mask[row].bool()], new) for row in range(2)]
    assert _priced(prefill) == sum(_priced(f.prefill_at(1)) for f in alone)
    # the count is what transformers computes, pads included: count_generation's
    assert prefill.flops == flopcount.count_generation(model, ids, new, kwargs={"attention_mask": mask}).prefill.flops
    row = _row(facts, 2)
    assert row.prefill.compute_s == pytest.approx(_priced(prefill) / BF16, rel=1e-12)


# decode steps: each sequence at its own positions ----------------------------------------------------

@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("new", [3, 8])
def test_decode_steps_are_priced_at_each_sequences_positions(side, new):
    """Each step's priced attention = the live mask's True entries x 4 x head dim; its cache read the
    (40 + s) + (25 + s) positions written before it (not 2 x (40 + s)); the cache held at the end
    (40 + new - 1) + (25 + new - 1) positions."""
    model = tiny_causal_lm("llama", TINY)
    ids, mask = _ids(), _mask(side)
    seen = generated(model, ids, new, attention_mask=mask)
    live = _per_forward(seen.scores[LAYERS:], new - 1)
    facts = serve_facts(model, ids, new, kwargs={"attention_mask": mask})
    for step in range(new - 1):
        work = facts.step_at(2, step)
        assert work.attention_flops - work.skipped_flops == live[step] * PER_SCORE
        assert work.cache_read == pytest.approx((PROMPT + SHORT + 2 * step) * POSITION_BYTES, abs=64)
    assert facts.at("cache_held", 2) == pytest.approx((PROMPT + SHORT + 2 * (new - 1)) * POSITION_BYTES, abs=64)
    assert facts.prefill_at(2).cache_written == pytest.approx((PROMPT + SHORT) * POSITION_BYTES, abs=64)


def test_an_eager_padded_step_is_priced_off_the_matmuls_column():
    """A Llama loaded eager: at step 0 the short row's 41 keys hold 15 pads, each worth
    4 x 16 + 7 FLOPs (two matmuls, scaling, mask, softmax), per head and layer; none off attention's."""
    cfg = transformers.AutoConfig.for_model("llama", **TINY, attn_implementation="eager")
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    model.generation_config.eos_token_id = None
    facts = serve_facts(model, _ids(), 4, kwargs={"attention_mask": _mask("left")})
    for step in range(3):
        work = facts.step_at(2, step)
        assert work.skipped_flops == (PROMPT - SHORT) * LAYERS * HEADS * (PER_SCORE + 7)
        assert work.skipped_attention_flops == 0


def test_any_batch_is_priced_as_sequences_of_the_mean():
    """Any batch b is priced as b sequences of the counted pair's mean: the prefill at b / 2 x the two
    prompts alone, each step leaving out b / 2 x the short row's 15 pad keys per head and layer (by
    hand), its cache read b / 2 x the two rows' positions."""
    model = tiny_causal_lm("llama", TINY)
    ids, mask = _ids(), _mask("left")
    facts = serve_facts(model, ids, 4, kwargs={"attention_mask": mask})
    alone = sum(_priced(serve_facts(model, ids[row:row + 1, mask[row].bool()], 4).prefill_at(1)) for row in range(2))
    for batch in (1, 2, 4):
        assert _priced(facts.prefill_at(batch)) == pytest.approx(alone * batch / 2, rel=1e-12)
        step = facts.step_at(batch, 1)
        assert step.skipped_flops == pytest.approx((PROMPT - SHORT) * LAYERS * HEADS * PER_SCORE * batch / 2, rel=1e-12)
        assert step.cache_read == pytest.approx((PROMPT + SHORT + 2) * POSITION_BYTES * batch / 2, abs=64)


def test_a_meta_model_with_a_cpu_mask_is_priced_by_the_masks_values():
    """LLaMA-2-7B's layer shapes (2 layers) on meta, rows of 256 and 128 real tokens left-padded to
    256, the mask on the CPU: the attention priced at the two triangles by hand, 2 x 32 heads x
    4 x 128 per score; step 0 at 257 + 129 keys."""
    config = transformers.AutoConfig.for_model("llama", num_hidden_layers=2, hidden_size=4096, num_attention_heads=32,
                                               num_key_value_heads=32, intermediate_size=11008, vocab_size=32000)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.generation_config.eos_token_id = None
    mask = torch.ones(2, 256, dtype=torch.int64)
    mask[1, :128] = 0
    facts = serve_facts(model, torch.zeros(2, 256, dtype=torch.int64, device="meta"), 3, kwargs={"attention_mask": mask})
    per_score = 2 * 32 * 4 * 128
    prefill = facts.prefill_at(2)
    assert prefill.attention_flops - prefill.skipped_attention_flops == per_score * (_triangle(256) + _triangle(128))
    step = facts.step_at(2, 0)
    assert step.attention_flops - step.skipped_flops == per_score * (257 + 129)


# left priced as before -------------------------------------------------------------------------------

@pytest.mark.parametrize("mask, rows", [
    ([[1, 1, 1, 1], [0, 0, 1, 1]], ((0, 4), (2, 2))),        # left padding
    ([[1, 1, 1, 0], [1, 1, 1, 1]], ((0, 3), (0, 4))),        # right padding
    ([[1, 1, 1, 1], [1, 1, 1, 1]], None),                    # no pad: the unpadded rule
    ([[1, 0, 1, 1], [1, 1, 1, 1]], None),                    # a hole
    ([[0, 1, 1, 0], [1, 1, 1, 1]], None),                    # padded on both sides
    ([[0, 0, 0, 0], [1, 1, 1, 1]], None),                    # a row of pads only
    ([[2, 1, 1, 1], [1, 1, 1, 1]], None),                    # not a 0/1 mask
])
def test_padded_rows_are_proved_from_the_masks_values(mask, rows):
    from flopcount.decoding.forwards import padded_rows  # new in servepad

    assert padded_rows(torch.tensor(mask), 2, 4) == rows


def test_a_mask_without_values_is_not_proved():
    from flopcount.decoding.forwards import padded_rows  # new in servepad

    assert padded_rows(torch.ones(2, 4, dtype=torch.int64, device="meta"), 2, 4) is None
    assert padded_rows(torch.tensor([[0.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0]]), 2, 4) is None  # a float mask


def test_a_padded_prompt_with_a_sliding_layer_prices_its_prefill_and_its_steps():
    """Mistral (window 24): the prefill at the sequences alone; the decode steps over the sliding
    cache's 24 keys at each row's own (branch servepad2: before, left as counted): the short row's
    slots 17 + s..40 + s hold 13 pads, so 13 keys per head and layer are left out (by hand)."""
    model = tiny_causal_lm("mistral", TINY, sliding_window=24)
    ids, mask = _ids(), _mask("left", (PROMPT, 10))
    facts = serve_facts(model, ids, 4, kwargs={"attention_mask": mask})
    alone = [serve_facts(model, ids[row:row + 1, mask[row].bool()], 4) for row in range(2)]
    assert _priced(facts.prefill_at(2)) == sum(_priced(f.prefill_at(1)) for f in alone)
    assert [facts.step_at(2, s).skipped_flops for s in range(3)] == [(13 - s) * LAYERS * HEADS * PER_SCORE for s in range(3)]


def test_a_padded_prompt_with_other_arguments_stays_in_full():
    """Position ids of the caller's: the mapping of rows to positions is not proved; nothing left out."""
    model = tiny_causal_lm("llama", TINY)
    mask = _mask("left")
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    facts = serve_facts(model, _ids(), 4, kwargs={"attention_mask": mask, "position_ids": positions})
    assert facts.prefill.skipped_flops == 0
    assert [facts.step_at(2, s).skipped_flops for s in range(3)] == [0.0] * 3
