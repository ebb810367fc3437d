"""A new user's walk through the Python API (branch apiwalk): a tokenizer's output handed to
count_generation / serve as the prompt (as ``generate(**encoding)`` takes it), prompts of the wrong
kind said by what they are, and a list of tensors given where a tuple is unpacked."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import flopcount
from flopcount.errors import TraceError, UsageError

transformers = pytest.importorskip("transformers")

LAYERS, HIDDEN, FFN, HEADS, KV_HEADS, VOCAB = 2, 64, 128, 4, 2, 128
HEAD_DIM = HIDDEN // HEADS


def _llama():
    config = transformers.LlamaConfig(num_hidden_layers=LAYERS, hidden_size=HIDDEN, intermediate_size=FFN,
                                      num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, vocab_size=VOCAB)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval()


def _generation_macs(prompt: int, new_tokens: int) -> int:
    """Greedy generate()'s MACs by hand: per token and layer q, o (H x H), k, v (H x kv_heads x head_dim),
    the SwiGLU MLP (3 x H x FFN); QK^T and AV over the keys so far (heads x keys x head_dim each);
    the LM head on the last position of each forward only."""
    linears = LAYERS * (2 * HIDDEN * HIDDEN + 2 * HIDDEN * KV_HEADS * HEAD_DIM + 3 * HIDDEN * FFN)
    head = VOCAB * HIDDEN

    def attention(queries: int, keys: int) -> int:
        return LAYERS * 2 * HEADS * queries * keys * HEAD_DIM

    total = prompt * linears + head + attention(prompt, prompt)
    for keys in range(prompt + 1, prompt + new_tokens):
        total += linears + head + attention(1, keys)
    return total


def _encoding(ids):
    return transformers.BatchEncoding({"input_ids": ids, "attention_mask": torch.ones_like(ids)})


def test_count_generation_takes_a_tokenizers_output_as_generate_does():
    """Before: 'input_ids must be a (batch, prompt length) tensor' for what tokenizer(text,
    return_tensors="pt") returns; generate(**encoding) takes it."""
    ids = torch.randint(0, VOCAB, (1, 8))
    counted = flopcount.count_generation(_llama(), _encoding(ids), new_tokens=3)
    assert counted.macs == _generation_macs(8, 3) == 783_104
    assert flopcount.count_generation(_llama(), dict(_encoding(ids)), new_tokens=3).macs == _generation_macs(8, 3)


def test_serve_takes_a_tokenizers_output():
    ids = torch.zeros(1, 8, dtype=torch.int64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        served = flopcount.serve(_llama(), _encoding(ids), 3, on="h100")
    # float32: 4 B a weight; KV: layers x (K, V) x kv_heads x head_dim x 4 B a token
    parameters = sum(p.numel() for p in _llama().parameters())
    assert served.weight_bytes == 4 * parameters
    assert served.kv_bytes_per_sequence == LAYERS * 2 * KV_HEADS * HEAD_DIM * 4 * (8 + 3 - 1)


def test_a_tokenizers_output_without_the_prompt_and_a_key_given_twice_are_named():
    ids = torch.zeros(1, 8, dtype=torch.int64)
    with pytest.raises(UsageError, match=r"count_generation: the dict given as the prompt has no 'input_ids' \(its keys: attention_mask\)"):
        flopcount.count_generation(_llama(), {"attention_mask": ids}, new_tokens=2)
    with pytest.raises(UsageError, match=r"serve: attention_mask given twice: in the BatchEncoding given as the prompt and in kwargs"):
        flopcount.serve(_llama(), _encoding(ids), 2, kwargs={"attention_mask": torch.ones_like(ids)})


@pytest.mark.parametrize("prompt, said", [
    ([[1, 2, 3]], r"input_ids must be a \(batch, prompt length\) tensor, got list: make it one, e\.g\. torch\.tensor\(\[\[1, 2, 3\]\]\)"),
    (torch.arange(8), r"input_ids must be a \(batch, prompt length\) tensor, got one of shape \(8,\): add the batch dimension, e\.g\. input_ids\[None\]"),
])
def test_a_prompt_of_the_wrong_kind_says_what_it_is(prompt, said):
    """Before: the list and the 1-D tensor got 'must be a (batch, prompt length) tensor' alone."""
    for call in (lambda: flopcount.count_generation(_llama(), prompt, new_tokens=2), lambda: flopcount.serve(_llama(), prompt, 2)):
        with pytest.raises(UsageError, match=said):
            call()


def test_a_list_of_tensors_is_said_to_be_one_input():
    """A list is one argument, a tuple is unpacked (docs/api.md); before: torch's 'linear(): argument
    'input' must be Tensor, not list' and nothing more."""
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU())
    x = torch.randn(4, 16)
    with pytest.raises(TraceError, match=r"not list; the list of 1 tensor went in as forward's one argument \(a list is one "
                                         r"input; a tuple is unpacked into forward's arguments\): give count_flops\(model, \(x,\)\)$"):
        flopcount.count_flops(model, [x])
    with pytest.raises(TraceError, match=r"give benchmark\(model, \(x,\)\)$"):
        flopcount.benchmark(model, [x], iters=1, warmup=0)
    assert flopcount.count_flops(model, (x,)).macs == 4 * 16 * 32  # the remedy it names


def test_a_list_a_forward_takes_gets_no_hint():
    """A forward that takes a list and fails for another reason is not told to pass a tuple."""
    class Sum(nn.Module):
        def forward(self, xs):
            return torch.stack(xs).sum(0) @ torch.ones(3, 2)

    with pytest.raises(TraceError) as raised:
        flopcount.count_flops(Sum(), [torch.randn(4, 5), torch.randn(4, 5)])
    assert "a list is one input" not in str(raised.value)


@pytest.mark.parametrize("reading", ["count_flops", "benchmark"])
def test_inputs_in_another_dtype_than_the_model_say_both(reading):
    """A float16 input into a float32 Linear: before, torch's 'mat1 and mat2 must have the same dtype,
    but got Half and Float' alone (which is the input?); the CLI said it (--dtype), the API did not."""
    model = nn.Sequential(nn.Linear(16, 32))
    call = getattr(flopcount, reading)
    options = {"iters": 1, "warmup": 0} if reading == "benchmark" else {}
    with pytest.raises(TraceError, match=r"same dtype, but got Half and Float; the floating inputs are float16 but the model's "
                                         r"parameters are float32: give the inputs as x\.to\(torch\.float32\), or cast the "
                                         r"model, model\.to\(torch\.float16\)$"):
        call(model, torch.randn(4, 16, dtype=torch.float16), **options)
    assert flopcount.count_flops(model, torch.randn(4, 16)).macs == 4 * 16 * 32  # the inputs cast: counted


def test_inputs_in_the_models_dtype_get_no_dtype_hint():
    model = nn.Sequential(nn.Linear(16, 32))
    with pytest.raises(TraceError) as raised:
        flopcount.count_flops(model, torch.randn(4, 17))
    assert "floating inputs are" not in str(raised.value)
