"""serve's count derived instead of repeated (issue #31's speed target): batch B traced as
count_generation traces it, batch B + 1 only through its prefill and first two decode steps,
every continued step priced once per distinct call. Every figure must equal the full count of
both batch sizes (``serve_facts(..., derived=False)``), on a tiny config of each family, at
batch 1 and 2; where a check cannot hold (a sliding window filling during the decode) the full
count runs."""

from __future__ import annotations

import dataclasses
import functools
import threading
from contextlib import contextmanager
from typing import Any, Callable, Dict, Iterator, Tuple

import pytest
import torch
from conftest import assert_same_state, snapshot
from torch import nn

import flopcount
from flopcount.errors import TraceError
from flopcount.serving import ServeFacts, serve_facts

transformers = pytest.importorskip("transformers")

ATTN: Dict[str, Any] = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                            num_key_value_heads=2, vocab_size=50, max_position_embeddings=256)


def _meta(kind: str, dtype: torch.dtype = torch.float32, seq2seq: bool = False, **config: Any) -> nn.Module:
    cfg = transformers.AutoConfig.for_model(kind, **config)
    auto = transformers.AutoModelForSeq2SeqLM if seq2seq else transformers.AutoModelForCausalLM
    with torch.device("meta"):
        model = auto.from_config(cfg, dtype=dtype)
    return model.eval()


FAMILIES: Dict[str, Tuple[Callable[[], nn.Module], int, int, bool]] = {
    # name: (model, prompt, new tokens, derived?)
    "gpt2": (lambda: _meta("gpt2", n_embd=32, n_layer=2, n_head=4, vocab_size=50, n_positions=64), 5, 8, True),
    "llama-gqa": (lambda: _meta("llama", **ATTN), 7, 9, True),
    # the window (64) is never reached: one run of steps, derived
    "mistral-window-not-reached": (lambda: _meta("mistral", sliding_window=64, **ATTN), 6, 8, True),
    # the window (8) fills during the decode: the steps around it are traced, both batches in full
    "mistral-window-crossed": (lambda: _meta("mistral", sliding_window=8, **ATTN), 6, 8, False),
    "mamba": (lambda: _meta("mamba", hidden_size=32, state_size=8, num_hidden_layers=2, vocab_size=50, expand=2,
                            conv_kernel=4), 6, 8, True),
    "t5": (lambda: _meta("t5", seq2seq=True, d_model=32, d_ff=64, d_kv=8, num_heads=4, num_layers=2,
                         num_decoder_layers=2, vocab_size=60, decoder_start_token_id=0, pad_token_id=0), 6, 8, True),
    "mixtral-moe": (lambda: _meta("mixtral", torch.bfloat16, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, vocab_size=100, num_local_experts=8,
                                  num_experts_per_tok=2), 6, 8, True),
}


def _figures(facts: ServeFacts) -> ServeFacts:
    """Every figure (the notes say how it was counted, so they differ)."""
    return dataclasses.replace(facts, warnings=tuple(w for w in facts.warnings if "decode steps" not in w))


def _was_derived(facts: ServeFacts) -> bool:
    return any("first two decode steps" in w for w in facts.warnings)


@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_derived_figures_equal_counting_both_batches_in_full(family: str, batch: int) -> None:
    make, prompt, new, derived = FAMILIES[family]
    model = make()
    ids = torch.zeros(batch, prompt, dtype=torch.int64, device="meta")
    fast = serve_facts(model, ids, new)
    full = serve_facts(model, ids, new, derived=False)
    assert _was_derived(fast) is derived and not _was_derived(full)
    assert _figures(fast) == _figures(full)
    assert len(fast.steps) == len(fast.fixed["steps"]) == new - 1


@contextmanager
def _forwards() -> Iterator[Dict[str, int]]:
    """Counts the outermost module calls this thread runs (one per forward of the model, or
    of the copy a tracer runs in its place)."""
    from torch.nn.modules import module as module_impl

    thread, depth, seen = threading.get_ident(), [0], {"forwards": 0}

    def enter(module: nn.Module, args: Any) -> None:
        if threading.get_ident() == thread:
            seen["forwards"] += depth[0] == 0
            depth[0] += 1

    def leave(module: nn.Module, args: Any, output: Any) -> None:
        if threading.get_ident() == thread:
            depth[0] -= 1

    handles = [module_impl.register_module_forward_pre_hook(enter),
               module_impl.register_module_forward_hook(leave, always_call=True)]
    try:
        yield seen
    finally:
        for handle in handles:
            handle.remove()


def test_serve_runs_nine_forwards_instead_of_twelve() -> None:
    model = _meta("llama", **ATTN)
    ids = torch.zeros(2, 7, dtype=torch.int64, device="meta")
    with _forwards() as full:
        serve_facts(model, ids, 9, derived=False)
    with _forwards() as derived:
        flopcount.serve(model, ids, 9, on="h100", batch=[1, 8, 64])
    # in full, each batch size (2 and 3): the prefill, decode steps 0, 1, 2, one forward over
    # steps 3..6, step 7 = 6 forwards, 12 in all; derived: batch 2 as before (6), batch 3 only
    # its prefill and steps 0 and 1 (3)
    assert full["forwards"] == 12
    assert derived["forwards"] == 9


def test_every_batch_prices_the_hand_derived_macs() -> None:
    # LLaMA, hidden H = 32, intermediate I = 64, L = 2 layers, 4 heads of hd = 8, 2 KV heads, vocab V = 50.
    # Per token per layer: q and o 2 x H x 4 x 8 = 2,048, k and v 2 x H x 2 x 8 = 1,024, gate/up/down
    # 3 x H x I = 6,144: 9,216 MACs. Attention over c positions: 4 heads x (QK^T + AV) 2 x 8 x c = 64 c.
    # LM head on the last position only (logits_to_keep=1): H x V = 1,600. The rotary frequencies'
    # (hd / 2 x 1) @ (1 x T) product has an inner dimension of 1, which torch runs as a broadcast
    # multiply: no MACs, so no part of the MACs is fixed in the batch.
    H, V, L, P, N = 32, 50, 2, 7, 9
    model = _meta("llama", **ATTN)
    facts = serve_facts(model, torch.zeros(1, P, dtype=torch.int64, device="meta"), N)
    assert _was_derived(facts)
    for b in (1, 3, 8):
        prefill = b * (L * (P * 9216 + 64 * P * P) + H * V)
        assert facts.prefill_at(b).macs == prefill
        for s in range(N - 1):
            c = P + s + 1  # decode step s attends to the prompt and s + 1 generated positions
            assert facts.step_at(b, s).macs == b * (L * (9216 + 64 * c) + H * V)


@pytest.mark.parametrize("train", [False, True])
def test_the_derived_count_leaves_the_model_as_found(train: bool) -> None:
    cfg = transformers.AutoConfig.for_model("llama", **ATTN)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg).train(train)
    ids = torch.randint(0, 50, (2, 5))
    before, ids_before, rng = snapshot(model), ids.clone(), torch.get_rng_state()
    with _forwards() as seen:
        facts = serve_facts(model, ids, 8)
    assert _was_derived(facts)
    # 6 + 3 forwards: the model is fed no mask, as generate() feeds it none (genall; before, the
    # real run checked the all-ones mask's sum, an integer of batch x context growing by the batch
    # each step, and batch 3's step 2 was traced too: 6 + 4)
    assert seen["forwards"] == 9
    assert _figures(facts) == _figures(serve_facts(model, ids, 8, derived=False))
    assert_same_state(model, before)
    assert torch.equal(ids, ids_before) and torch.equal(torch.get_rng_state(), rng)


def test_a_step_that_batch_b_plus_1_runs_differently_is_counted_in_full() -> None:
    base = transformers.LlamaForCausalLM

    class OddBatches(base):  # type: ignore[misc, valid-type]
        """Its decode steps run one more op when the batch is odd: B + 1 = 3 differs from B = 2."""

        @functools.wraps(base.forward)
        def forward(self, *args: Any, **kwargs: Any) -> Any:
            out = super().forward(*args, **kwargs)
            ids = kwargs.get("input_ids", args[0] if args else None)
            if ids is not None and ids.shape[0] % 2 == 1 and ids.shape[1] == 1:
                out.logits = out.logits + 0
            return out

    cfg = transformers.AutoConfig.for_model("llama", **ATTN)
    with torch.device("meta"):
        model = OddBatches(cfg).eval()
    ids = torch.zeros(2, 7, dtype=torch.int64, device="meta")
    with _forwards() as seen:
        facts = serve_facts(model, ids, 9)
    assert not _was_derived(facts)
    # tried: batch 2 (6 forwards), batch 3's prefill and steps 0, 1, 2 (4); then both in full (12)
    assert seen["forwards"] == 22
    full = serve_facts(model, ids, 9, derived=False)
    assert _figures(facts) == _figures(full)
    # the per-sequence slope is batch 3's step minus batch 2's: batch 3's extra add over its 3 x 50
    # logits is all of it, in every step (as the full count has it)
    plain = serve_facts(_meta("llama", **ATTN), ids, 9)
    assert len(facts.steps) == 8
    assert all(f.flops - g.flops == 3 * 50 for f, g in zip(facts.steps, plain.steps))


def test_a_window_the_config_says_fills_costs_no_forward_before_counting_in_full() -> None:
    model = _meta("mistral", sliding_window=8, **ATTN)  # prompt 6 + 7 steps pass the window of 8
    ids = torch.zeros(1, 6, dtype=torch.int64, device="meta")
    with _forwards() as full:
        serve_facts(model, ids, 8, derived=False)
    with _forwards() as default:
        facts = serve_facts(model, ids, 8)
    assert not _was_derived(facts) and default["forwards"] == full["forwards"]


def test_a_forward_that_raises_mid_decode_leaves_the_model_as_found() -> None:
    base = transformers.LlamaForCausalLM

    class Refuses(base):  # type: ignore[misc, valid-type]
        """Raises at decode step 2 (the cache holds the prompt's 5 positions and 2 generated)."""

        @functools.wraps(base.forward)
        def forward(self, *args: Any, **kwargs: Any) -> Any:
            cache = kwargs.get("past_key_values", kwargs.get("cache"))
            if cache is not None and cache.get_seq_length() >= 7:
                raise RuntimeError("step 2 refuses")
            return super().forward(*args, **kwargs)

    cfg = transformers.AutoConfig.for_model("llama", **ATTN)
    torch.manual_seed(0)
    model = Refuses(cfg).train()
    ids = torch.randint(0, 50, (2, 5))
    before, ids_before, rng = snapshot(model), ids.clone(), torch.get_rng_state()
    with pytest.raises(TraceError, match="step 2 refuses"):
        flopcount.serve(model, ids, 8, on="h100")
    assert_same_state(model, before)
    assert torch.equal(ids, ids_before) and torch.equal(torch.get_rng_state(), rng)
