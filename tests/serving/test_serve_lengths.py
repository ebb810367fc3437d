"""serve's ``prompt_lengths=`` (``--prompt-lengths``): a padded batch stated by its rows' real
lengths, for a prompt without values (branch servepad2).

A meta prompt has no values, so a mask made on meta proves nothing and serve priced the padded
batch in full (every pad position, as transformers computes it). ``prompt_lengths`` states each
row's real tokens, left-padded as generate() expects; serve makes that mask on the CPU and prices
each sequence at its own tokens. Oracles: the causal triangles of the real rows x 4 x head dim
per score, and each step's own keys, by hand."""

from __future__ import annotations

import json

import pytest
import torch

import flopcount
from flopcount.cli import main
from flopcount.errors import UsageError
from flopcount.serving import serve_facts

transformers = pytest.importorskip("transformers")

LAYERS, HEADS, KV_HEADS, HEAD_DIM = 2, 4, 2, 16
TINY = dict(hidden_size=HEADS * HEAD_DIM, intermediate_size=128, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
            num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM, vocab_size=50, max_position_embeddings=400)
PER_SCORE = LAYERS * HEADS * 4 * HEAD_DIM  # QK^T and PV, 2 x head dim each, every head and layer
POSITION_BYTES = LAYERS * 2 * KV_HEADS * HEAD_DIM * 4  # one float32 position, keys and values of every layer


def _triangle(n: int) -> int:
    return n * (n + 1) // 2


def _meta_llama():
    config = transformers.AutoConfig.for_model("llama", **TINY)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    model.generation_config.eos_token_id = None
    return model


def test_prompt_lengths_price_a_meta_batch_at_its_sequences():
    """Rows of 40 and 25 real tokens in 40 positions, on meta: the prefill's attention at the two
    triangles, step s at (41 + s) + (26 + s) keys, its cache read at (40 + s) + (25 + s) positions;
    the count stays transformers' (2 x 40 positions)."""
    model = _meta_llama()
    ids = torch.zeros(2, 40, dtype=torch.int64, device="meta")
    facts = serve_facts(model, ids, 4, prompt_lengths=[40, 25])
    prefill = facts.prefill_at(2)
    assert prefill.attention_flops - prefill.skipped_attention_flops == PER_SCORE * (_triangle(40) + _triangle(25))
    mask = torch.ones(2, 40, dtype=torch.int64)
    mask[1, :15] = 0
    # counted as transformers computes it, pads included: count_generation's with the mask by hand
    assert prefill.flops == flopcount.count_generation(model, ids, 4, kwargs={"attention_mask": mask}).prefill.flops
    for step in range(3):
        work = facts.step_at(2, step)
        assert work.attention_flops - work.skipped_flops == PER_SCORE * (41 + step + 26 + step)
        assert work.cache_read == pytest.approx((40 + 25 + 2 * step) * POSITION_BYTES, abs=64)
    assert facts.at("cache_held", 2) == pytest.approx((40 + 25 + 2 * 3) * POSITION_BYTES, abs=64)


def test_prompt_lengths_are_the_left_padded_mask():
    """The same figures as the CPU mask of left-padded rows it stands for (the mask by hand)."""
    model = _meta_llama()
    ids = torch.zeros(3, 12, dtype=torch.int64, device="meta")
    mask = torch.tensor([[0] * 5 + [1] * 7, [1] * 12, [0] * 9 + [1] * 3])
    stated = serve_facts(model, ids, 3, prompt_lengths=torch.tensor([7, 12, 3]))
    given = serve_facts(model, ids, 3, kwargs={"attention_mask": mask})
    assert stated.prefill_at(3) == given.prefill_at(3)
    assert [stated.step_at(3, s) for s in range(2)] == [given.step_at(3, s) for s in range(2)]


@pytest.mark.parametrize("lengths, words", [
    ([40], "1 lengths for the prompt's 2 rows"),
    ([40, 41], "must each be 1..40"),
    ([40, 0], "must each be 1..40"),
    ([40, 2.5], "one whole number per prompt row"),
    ("40,25", "one whole number per prompt row"),
    ([True, 40], "one whole number per prompt row"),
])
def test_prompt_lengths_are_checked_against_the_prompt(lengths, words):
    with pytest.raises(UsageError, match=words):
        serve_facts(_meta_llama(), torch.zeros(2, 40, dtype=torch.int64, device="meta"), 3, prompt_lengths=lengths)


def test_prompt_lengths_and_a_mask_are_one_or_the_other():
    with pytest.raises(UsageError, match="both given"):
        serve_facts(_meta_llama(), torch.zeros(2, 8, dtype=torch.int64, device="meta"), 3, prompt_lengths=[8, 4],
                    kwargs={"attention_mask": torch.ones(2, 8, dtype=torch.int64)})


LLAMA = ["hf:llama", *(f for key, value in TINY.items() if key != "head_dim" for f in ("--config", f"{key}={value}"))]


def test_the_cli_prices_prompt_lengths(capsys):
    """``--prompt-lengths 40,25``: two rows left-padded to the longest, priced at batch 2 (one per
    length) by default; the prefill priced at the two prompts' alone (unpadded, on meta), step 0's
    attention at 41 + 26 keys by hand."""
    code = main(["serve", *LLAMA, "--on", "h100", "--prompt-lengths", "40,25", "--new", "3", "-f", "json", "-q"])
    out, err = capsys.readouterr()
    assert code == 0, err
    row = json.loads(out)["parts"][0]["batches"][0]
    assert row["batch"] == 2
    alone = [serve_facts(_meta_llama(), torch.zeros(1, n, dtype=torch.int64, device="meta"), 3).prefill_at(1)
             for n in (40, 25)]
    assert row["prefill"]["flops"] - row["prefill"]["skipped_flops"] == sum(w.flops - w.skipped_flops for w in alone)
    step = row["first_step"]
    assert step["attention_flops"] - step["skipped_flops"] == PER_SCORE * (41 + 26)


@pytest.mark.parametrize("args, words", [
    (["--prompt-lengths", "40,x"], "--prompt-lengths: 'x' is not an integer"),
    (["--prompt", "30", "--prompt-lengths", "40,25"], "must each be 1..30"),
    (["--prompt-lengths", "40,0"], "--prompt-lengths: lengths must be >= 1"),
])
def test_the_cli_says_what_is_wrong_with_prompt_lengths(capsys, args, words):
    code = main(["serve", *LLAMA, "--on", "h100", "--new", "3", *args])
    _, err = capsys.readouterr()
    assert code == 2 and words in err


def test_the_cli_refuses_a_length_above_prompt_in_its_flags_terms(capsys):
    """walk27: a length above ``--prompt`` is named with both flags before the model is built (it
    was refused after the build, as ``serve: prompt_lengths must each be 1..30 (... input_ids of
    shape (2, 30))``, arguments the user never wrote)."""
    code = main(["serve", *LLAMA, "--on", "h100", "--new", "3", "--prompt", "30", "--prompt-lengths", "40,25,31"])
    _, err = capsys.readouterr()
    assert code == 2
    assert "--prompt-lengths: lengths must each be 1..30 (the rows are left-padded to --prompt 30), got 40, 31" in err
    assert "counting generate()" not in err and "input_ids" not in err


def test_the_lengths_priced_are_in_the_facts_and_the_json(capsys):
    """walk27: the sequences' lengths the bounds priced are data (``facts.sequence_lengths``, JSON
    ``sequence_lengths``), not only a note's text: stated, proved by a CPU mask (by hand), or none."""
    model = _meta_llama()
    ids = torch.zeros(3, 12, dtype=torch.int64, device="meta")
    mask = torch.tensor([[0] * 5 + [1] * 7, [1] * 12, [0] * 9 + [1] * 3])
    assert serve_facts(model, ids, 2, kwargs={"attention_mask": mask}).sequence_lengths == (7, 12, 3)
    assert serve_facts(model, ids, 2, prompt_lengths=[12, 4, 1]).sequence_lengths == (12, 4, 1)
    assert serve_facts(model, ids, 2).sequence_lengths == ()
    code = main(["serve", *LLAMA, "--on", "h100,l4", "--prompt-lengths", "40,25", "--new", "2", "-f", "json", "-q"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert [part["sequence_lengths"] for part in json.loads(out)["parts"]] == [[40, 25], [40, 25]]


def test_the_cli_refuses_prompt_lengths_for_an_encoder_decoder_in_its_flags_terms(capsys):
    """walk27: docs/llm.md says prompt_lengths is not for an encoder-decoder; the CLI said so in the
    API's terms ("pass its attention_mask in kwargs", which no flag does), after the progress line
    of a count it would not run."""
    t5 = ["hf:t5", *(f for key, value in dict(num_layers=1, num_decoder_layers=1, d_model=32, d_ff=64, num_heads=2,
                                              d_kv=16, vocab_size=100).items() for f in ("--config", f"{key}={value}"))]
    code = main(["serve", *t5, "--on", "h100", "--new", "2", "--prompt-lengths", "4,8"])
    _, err = capsys.readouterr()
    assert code == 2
    assert ("--prompt-lengths prices a decoder-only model's padded prompt, and hf:t5 is an encoder-decoder: leave "
            "--prompt-lengths out (its --prompt is priced unpadded)") in err
    assert "kwargs" not in err and "counting generate()" not in err
