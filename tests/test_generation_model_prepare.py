"""count_generation feeds each decode step as the model's own ``prepare_inputs_for_generation``
makes it, also when that override takes the cache and the step length through ``**kwargs``
(transformers' CpmAnt: ``prepare_inputs_for_generation(input_ids, next_sequence_length=None,
**kwargs)``, whose forward needs the whole sequence and slices the cached prefix off itself).
Found by benchmarks/zoo_reuse_hf_types.py: the step was fed the greedy token alone and the
forward failed.

generate() makes the prefill's inputs with the preparer too (``_prefill``:
``is_first_iteration=True``): XLM's appends its mask token to every forward's ids, the
prefill's included. count_generation's prefill was fed the prompt as given, its cache held one
position fewer than generate()'s, and the first decode step failed (branch genprep).

Oracle: a real greedy ``generate()`` with ``FlopCounterMode`` around each forward it runs
(tests/_live_oracles.py ``generate_truth``), on tiny CpmAnt and XLM configs, batch 2."""

from __future__ import annotations

from typing import Callable

import pytest
import torch
from _live_oracles import generate_truth
from conftest import assert_same_state, snapshot
from torch import nn

from flopcount.generation.count import count_generation

transformers = pytest.importorskip("transformers")

B, P, N, VOCAB = 2, 12, 6, 128


def _cpmant(device: str = "cpu") -> nn.Module:
    config = transformers.CpmAntConfig(
        vocab_size=VOCAB, hidden_size=64, num_attention_heads=4, dim_head=16, dim_ff=128, num_hidden_layers=3,
        prompt_length=8, position_bias_num_buckets=32, position_bias_max_distance=64,
    )
    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.CpmAntForCausalLM(config)
    model.generation_config.eos_token_id = None
    return model.eval()


def _xlm(device: str = "cpu") -> nn.Module:
    config = transformers.XLMConfig(vocab_size=VOCAB, emb_dim=32, n_layers=2, n_heads=4, max_position_embeddings=64)
    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.XLMWithLMHeadModel(config)
    model.generation_config.eos_token_id = None
    return model.eval()


@pytest.mark.parametrize("make", [_cpmant, _xlm], ids=["cpmant", "xlm"])
def test_each_forward_matches_a_real_generate(make: Callable[..., nn.Module]) -> None:
    model = make()
    ids = torch.randint(3, VOCAB, (B, P), generator=torch.Generator().manual_seed(1))
    expected, _ = generate_truth(model, ids, N)
    before, prompt = snapshot(model), ids.clone()
    result = count_generation(model, ids, new_tokens=N)
    assert [2 * result.prefill.macs] + [2 * step.macs for step in result.steps] == expected
    assert result.complete, result.incomplete_reasons()
    assert_same_state(model, before)
    assert torch.equal(ids, prompt)
    meta = count_generation(make("meta"), ids.to("meta"), new_tokens=N)
    assert [2 * meta.prefill.macs] + [2 * step.macs for step in meta.steps] == expected


def test_xlm_prefill_hand_formula() -> None:
    """XLM's prefill runs P + 1 positions (its mask token appended), the LM head on the last one
    (``logits_to_keep=1``); step s runs one position against P + s + 2 keys. Per layer and
    position: q, k, v, o (4 dim^2) and the FFN (2 dim x 4 dim); attention q.k and a.v (2 x keys x dim)."""
    model = _xlm()
    ids = torch.randint(3, VOCAB, (B, P), generator=torch.Generator().manual_seed(1))
    result = count_generation(model, ids, new_tokens=N)
    dim, layers = 32, 2
    per_position = layers * (4 * dim * dim + 2 * dim * 4 * dim)
    head = dim * VOCAB

    def attention(queries: int, keys: int) -> int:
        return layers * 2 * queries * keys * dim

    positions = P + 1
    assert result.prefill.macs == B * (positions * per_position + head + attention(positions, positions))
    assert [step.macs for step in result.steps] == [B * (per_position + head + attention(1, P + s + 2)) for s in range(N - 1)]
