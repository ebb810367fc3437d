"""count_generation feeds each forward what a real greedy generate() feeds it, so that every
operator of each forward is counted as generate() runs it, not only the contractions (branch
genall). Oracle: tests/_live_oracles.py ``generate_all_flops``: each forward of a real
``model.generate()`` (and an encoder-decoder's encoder run, booked with the first decoder
forward) replayed with the exact arguments it received under flopcount's dispatch tracer, all
operators by FLOPs. Compared per forward with ``count_generation(..., trace_every_step=True)``
on real weights and on a meta copy of the same configuration, batch 2.

What generate() feeds a decoder-only model that count_generation did not feed before: no
attention mask (generate() makes an all-ones one, takes the position ids from it, then drops
it: the model's mask checks, ``aten::sum``/``aten::all``/``cumsum``, never run) and
``position_ids`` of one row per prompt (LLaMA's rotary ``cos``/``sin`` are of batch x
positions, not 1 x positions). An encoder-decoder gets no mask at all."""

from __future__ import annotations

from typing import Any, Dict, List

import pytest
import torch
from _live_oracles import generate_all_flops
from conftest import assert_same_state, snapshot
from torch import nn

from flopcount.generation.count import count_generation

transformers = pytest.importorskip("transformers")

B, P, N, VOCAB = 2, 12, 4, 64


def _config(kind: str) -> Any:
    if kind == "llama":
        return transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                        max_position_embeddings=128)
    if kind == "gpt2":
        return transformers.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=128)
    return transformers.T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                                 decoder_start_token_id=0)


def _model(kind: str, device: str = "cpu") -> nn.Module:
    config = _config(kind)
    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.AutoModelForSeq2SeqLM.from_config(config) if kind == "t5" else \
            transformers.AutoModelForCausalLM.from_config(config)
    model.generation_config.eos_token_id = None  # no early stop: N forwards
    return model.eval()


def _prompt() -> torch.Tensor:
    return torch.randint(3, VOCAB, (B, P), generator=torch.Generator().manual_seed(1))


def _forwards(result: Any) -> List[Dict[str, int]]:
    return [forward.by_operator() for forward in (result.prefill, *result.steps)]


def _totals(rows: List[Dict[str, int]]) -> List[int]:
    return [sum(forward.values()) for forward in rows]


@pytest.mark.parametrize("kind", ["llama", "gpt2", "t5"])
def test_every_operator_of_each_forward_matches_a_real_generate(kind: str) -> None:
    model, ids = _model(kind), _prompt()
    truth = generate_all_flops(model, ids, N)
    assert len(truth) == N
    before = snapshot(model)
    real = count_generation(model, ids, N, trace_every_step=True)
    assert_same_state(model, before)
    meta = count_generation(_model(kind, "meta"), ids.to("meta"), N, trace_every_step=True)
    # before genall (f1cf68f) every forward differed: LLaMA's by -408, -10, -8, -6 FLOPs on real
    # weights (rotary cos/sin of one row, not one per prompt; the mask's sum), GPT-2's prefill by +24
    # (the mask's sum), T5's by +48 (a mask generate() does not pass, checked with aten::all)
    assert _totals(_forwards(real)) == _totals(truth)
    assert _totals(_forwards(meta)) == _totals(truth)
    assert _forwards(real) == truth
    assert _forwards(meta) == truth


def test_a_given_all_ones_mask_is_dropped_as_generate_drops_it() -> None:
    """A caller's all-ones mask: generate() makes the position ids from it, then drops it."""
    model, ids = _model("llama"), _prompt()
    mask = torch.ones(B, P, dtype=torch.int64)
    truth = generate_all_flops(model, ids, N, {"attention_mask": mask})
    result = count_generation(model, ids, N, {"attention_mask": mask}, trace_every_step=True)
    assert _forwards(result) == truth


def test_a_padded_mask_is_kept_with_its_position_ids() -> None:
    """A left-padded prompt: generate() keeps the mask, and the position ids it makes from it."""
    model, ids = _model("llama"), _prompt()
    mask = torch.ones(B, P, dtype=torch.int64)
    mask[0, :3] = 0
    truth = generate_all_flops(model, ids, N, {"attention_mask": mask})
    result = count_generation(model, ids, N, {"attention_mask": mask}, trace_every_step=True)
    assert _forwards(result) == truth


PAD = 1  # the generation config's pad token, not an end-of-sequence token (none is set)


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_a_prompt_holding_the_pad_token_is_fed_the_mask_generate_infers(kind: str) -> None:
    """No mask given, the pad token in the prompt and not the end of sequence: generate() infers
    the mask ``ids != pad`` (``_prepare_attention_mask_for_generation``), keeps it, and makes the
    position ids from it (branch leftfix: count_generation fed its all-ones mask, then dropped it)."""
    model, ids = _model(kind), _prompt()  # ids from 3 up: no pad token but those set here
    model.generation_config.pad_token_id = PAD
    ids[0, :3] = PAD  # a left-padded first prompt
    before = snapshot(model)
    truth = generate_all_flops(model, ids, N)
    result = count_generation(model, ids, N, trace_every_step=True)
    assert_same_state(model, before)
    assert model.generation_config.pad_token_id == PAD  # the model's config left as found
    assert _forwards(result) == truth


def test_on_meta_a_pad_token_cannot_be_seen_and_the_mask_is_all_ones() -> None:
    """Meta ids have no values: count_generation feeds generate()'s all-ones case, as before."""
    model = _model("llama", "meta")
    model.generation_config.pad_token_id = PAD
    truth = generate_all_flops(_model("llama"), _prompt(), N)  # a prompt without the pad token
    result = count_generation(model, _prompt().to("meta"), N, trace_every_step=True)
    assert _forwards(result) == truth


def test_chunked_prefill_feeds_each_chunk_its_position_ids() -> None:
    """generate()'s chunked prefill slices the position ids to each chunk."""
    model, ids = _model("llama"), _prompt()
    truth = generate_all_flops(model, ids, N, {"prefill_chunk_size": 5})
    chunks = len(truth) - (N - 1)
    prefill: Dict[str, int] = {}
    for rows in truth[:chunks]:
        for op, flops in rows.items():
            prefill[op] = prefill.get(op, 0) + flops
    result = count_generation(model, ids, N, trace_every_step=True, prefill_chunk_size=5)
    assert _totals(_forwards(result)) == _totals([prefill, *truth[chunks:]])


@pytest.mark.parametrize("version, drops", [("4.57.6", False), ("5.17.0", False), ("5.18.0", True),
                                            ("5.18.0.dev0", True), ("5.24.0", True), ("6.0.0", True)])
def test_the_own_mask_is_dropped_only_where_generate_drops_it(monkeypatch: Any, version: str, drops: bool) -> None:
    """generate() drops an all-ones mask from transformers 5.18 on (huggingface/transformers#48814;
    checked in each release's wheel, 5.17 to 5.24). Under 5.17 (a lent GPU's, and a venv here),
    count_generation dropped it anyway, so every forward missed the model's mask checks: the prompt's
    ``aten::sum`` (24 FLOPs at batch 2 x 12) and one more per step, against the live oracle above."""
    import importlib

    from flopcount.decoding import forwards

    # the module an import finds now (a test elsewhere may have imported transformers afresh)
    monkeypatch.setattr(importlib.import_module("transformers"), "__version__", version)
    forwards._drops_all_ones_mask.cache_clear()
    try:
        assert forwards._drops_all_ones_mask() is drops
    finally:
        forwards._drops_all_ones_mask.cache_clear()
