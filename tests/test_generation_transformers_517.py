"""count_generation under transformers 5.17's generate() (branch tfold): the name generate()
hands the cache under, and the preparer it calls, are read from the installed transformers, not
from the 5.24 spelling. 5.17's ``_prepare_cache_for_generation`` writes the dynamic cache it makes
under ``past_key_values`` (``cache_params`` for Mamba's classes), whatever the forward's parameter is
called; 5.24's writes ``cache``. Under 5.17 count_generation handed no cache and used no
``prepare_inputs_for_generation`` wherever the name was not ``cache``: RecurrentGemma was refused
("returned no cache"), CpmAnt's decode steps were fed the greedy token alone (its forward failed),
and XLM (forward parameter ``cache``, never handed it by 5.17's generate(), which recomputes the
whole sequence each step) was counted as decoding through a cache.

These tests run under the project's transformers (5.24): a model class here renames what 5.17
names differently (the key ``_prepare_cache_for_generation`` writes; the forward's cache
parameter, where 5.17's names it ``past_key_values``). Oracle: a real greedy ``generate()`` under
``FlopCounterMode`` (tests/_live_oracles.py ``generate_truth``) of the model as installed."""

from __future__ import annotations

import inspect
from typing import Any, Dict

import pytest
import torch
from _live_oracles import generate_truth
from conftest import assert_same_state, snapshot
from torch import nn

from flopcount.decoding import forwards
from flopcount.generation.count import count_generation

transformers = pytest.importorskip("transformers")

B, P, N, VOCAB = 2, 12, 6, 128


def _as_517(base: type, *, rename_forward: bool) -> type:
    """``base`` as transformers 5.17 has it: generate() makes the dynamic cache under
    ``past_key_values``; with ``rename_forward``, the forward's ``cache`` parameter is named
    ``past_key_values`` too (5.17's RecurrentGemma and CpmAnt; XLM's keeps ``cache``)."""

    class As517(base):  # type: ignore[misc, valid-type]
        def _prepare_cache_for_generation(self, generation_config: Any, model_kwargs: Dict[str, Any],
                                          *args: Any, **kwargs: Any) -> Any:
            made = super()._prepare_cache_for_generation(generation_config, model_kwargs, *args, **kwargs)
            if "cache" in model_kwargs:
                model_kwargs["past_key_values"] = model_kwargs.pop("cache")
            return made

    if rename_forward:
        def forward(self: Any, *args: Any, past_key_values: Any = None, **kwargs: Any) -> Any:
            # 5.24's own preparer renames past_key_values to cache on the way in
            cache = kwargs.pop("cache", past_key_values)
            return base.forward(self, *args, cache=cache, **kwargs)

        signature = inspect.signature(base.forward)
        renamed = [p.replace(name="past_key_values") if p.name == "cache" else p for p in signature.parameters.values()]
        forward.__signature__ = signature.replace(parameters=renamed)  # type: ignore[attr-defined]
        As517.forward = forward  # type: ignore[method-assign]
    return As517


def _recurrent_gemma(cls: Any = None) -> nn.Module:
    config = transformers.RecurrentGemmaConfig(
        num_hidden_layers=3, vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_attention_heads=4,
        num_key_value_heads=1, head_dim=8, lru_width=32, attention_window_size=8, conv1d_width=4,
        block_types=["recurrent", "recurrent", "attention"],
    )
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = (cls or transformers.RecurrentGemmaForCausalLM)(config)
    model.generation_config.eos_token_id = None
    return model.eval()


def _cpmant(cls: Any = None) -> nn.Module:
    config = transformers.CpmAntConfig(
        vocab_size=VOCAB, hidden_size=64, num_attention_heads=4, dim_head=16, dim_ff=128, num_hidden_layers=3,
        prompt_length=8, position_bias_num_buckets=32, position_bias_max_distance=64,
    )
    torch.manual_seed(0)
    model = (cls or transformers.CpmAntForCausalLM)(config)
    model.generation_config.eos_token_id = None
    return model.eval()


def _xlm(cls: Any = None) -> nn.Module:
    config = transformers.XLMConfig(vocab_size=VOCAB, emb_dim=32, n_layers=2, n_heads=4, max_position_embeddings=64)
    torch.manual_seed(0)
    model = (cls or transformers.XLMWithLMHeadModel)(config)
    model.generation_config.eos_token_id = None
    return model.eval()


def _prompt() -> torch.Tensor:
    return torch.randint(3, VOCAB, (B, P), generator=torch.Generator().manual_seed(1))


def _per_forward(result: Any) -> list:
    return [2 * result.prefill.macs] + [2 * step.macs for step in result.steps]


def test_recurrent_gemma_is_handed_the_cache_under_5_17s_name() -> None:
    """5.17: refused before ("returned no past_key_values"); its forward updates the cache it is
    handed and returns none, as under 5.24."""
    model = _recurrent_gemma(_as_517(transformers.RecurrentGemmaForCausalLM, rename_forward=True))
    ids = _prompt()
    expected, _ = generate_truth(model, ids, N)
    model = _recurrent_gemma(_as_517(transformers.RecurrentGemmaForCausalLM, rename_forward=True))  # state left by generate()
    before = snapshot(model)
    result = count_generation(model, ids, new_tokens=N)
    assert _per_forward(result) == expected
    assert_same_state(model, before)


def test_cpmant_decode_steps_are_made_by_its_preparer_under_5_17s_name() -> None:
    """5.17: the preparer was not used where the cache is not named ``cache``; CpmAnt's forward
    needs the whole sequence and failed on the greedy token alone."""
    model = _cpmant(_as_517(transformers.CpmAntForCausalLM, rename_forward=True))
    ids = _prompt()
    expected, _ = generate_truth(model, ids, N)
    result = count_generation(model, ids, new_tokens=N)
    assert _per_forward(result) == expected


def test_xlm_is_counted_as_5_17s_generate_runs_it() -> None:
    """5.17's generate() hands XLM the cache as ``past_key_values``, which its forward (parameter
    ``cache``) never reads: every step runs the whole sequence again."""
    model = _xlm(_as_517(transformers.XLMWithLMHeadModel, rename_forward=False))
    ids = _prompt()
    expected, _ = generate_truth(model, ids, N)
    result = count_generation(model, ids, new_tokens=N)
    assert _per_forward(result) == expected


def test_the_cache_name_is_the_one_generate_writes() -> None:
    """The key transformers' own ``_prepare_cache_for_generation`` writes, whatever the forward
    names its parameter (XLM's ``cache``); none for a model without that rule."""
    model = _xlm(_as_517(transformers.XLMWithLMHeadModel, rename_forward=False))
    assert forwards._generated_cache_key(model) == "past_key_values"
    assert forwards._generated_cache_key(nn.Linear(2, 2)) is None
