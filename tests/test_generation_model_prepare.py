"""count_generation feeds each decode step as the model's own ``prepare_inputs_for_generation``
makes it, also when that override takes the cache and the step length through ``**kwargs``
(transformers' CpmAnt: ``prepare_inputs_for_generation(input_ids, next_sequence_length=None,
**kwargs)``, whose forward needs the whole sequence and slices the cached prefix off itself).
Found by benchmarks/zoo_reuse_hf_types.py: the step was fed the greedy token alone and the
forward failed.

Oracle: a real greedy ``generate()`` with ``FlopCounterMode`` around each forward it runs
(tests/_live_oracles.py ``generate_truth``), on a tiny CpmAnt config, batch 2."""

from __future__ import annotations

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


def test_cpmant_decode_steps_match_a_real_generate() -> None:
    model = _cpmant()
    ids = torch.randint(3, VOCAB, (B, P), generator=torch.Generator().manual_seed(1))
    expected, _ = generate_truth(model, ids, N)
    before = snapshot(model)
    result = count_generation(model, ids, new_tokens=N)
    assert [2 * result.prefill.macs] + [2 * step.macs for step in result.steps] == expected
    assert result.complete, result.incomplete_reasons()
    assert_same_state(model, before)
    meta = count_generation(_cpmant("meta"), ids.to("meta"), new_tokens=N)
    assert [2 * meta.prefill.macs] + [2 * step.macs for step in meta.steps] == expected
