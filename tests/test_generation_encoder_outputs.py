"""count_generation of an encoder-decoder called with its encoder's output already computed
(``kwargs={"encoder_outputs": ...}``, as ``model.generate(ids, encoder_outputs=...)``): generate()
runs no encoder and hands every forward, the prefill's and each decode step's, the caller's own
object as it is. The decode steps were handed a BaseModelOutput rebuilt from the prefill's
encoder last hidden state (branch genprep): a plain tuple or the model's own output class was
swapped for another object, and a decoder that reads another field of it (Moonshine's
``attention_mask``) failed at the first step.

Oracles: FlopCounterMode live around each forward of the real ``generate()`` given the same
object (tests/_live_oracles.py ``generate_truth``; eager attention, 2 FLOPs per MAC), and what
each of the real generate()'s forwards is handed (a forward pre-hook on the model: the same
object, by identity). The caller's object is left as found: its class, its fields and their
tensors, unchanged."""

from __future__ import annotations

from typing import Any, Callable, List, Tuple

import pytest
import torch
from _live_oracles import generate_truth
from conftest import assert_same_state, snapshot
from torch import nn

from flopcount.generation.count import count_generation

transformers = pytest.importorskip("transformers")

B, P, N, VOCAB = 2, 7, 5, 60


def _t5(device: str = "cpu") -> nn.Module:
    config = transformers.AutoConfig.for_model(
        "t5", d_model=32, d_ff=64, d_kv=8, num_heads=4, num_layers=2, num_decoder_layers=2, vocab_size=VOCAB,
        decoder_start_token_id=0, pad_token_id=0,
    )
    return _built(config, device)


def _bart(device: str = "cpu") -> nn.Module:
    config = transformers.AutoConfig.for_model(
        "bart", d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
        encoder_ffn_dim=64, decoder_ffn_dim=64, vocab_size=VOCAB, max_position_embeddings=64,
    )
    return _built(config, device)


def _built(config: Any, device: str) -> nn.Module:
    config._attn_implementation = "eager"  # matmuls FlopCounterMode sees
    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.AutoModelForSeq2SeqLM.from_config(config)
    model.generation_config.eos_token_id = None
    return model.eval()


def _own_class(model: nn.Module, ids: torch.Tensor) -> Any:
    """The encoder's own output for ``ids`` (T5's BaseModelOutputWithPastAndCrossAttentions, BART's
    BaseModelOutput), made by the caller."""
    with torch.no_grad():
        return model.get_encoder()(ids)


def _plain_tuple(model: nn.Module, ids: torch.Tensor) -> Any:
    return (_own_class(model, ids).last_hidden_state,)


def _fields(value: Any) -> List[Tuple[str, Any]]:
    """The caller's object as found: its class, and each field with its tensor (the object
    itself, and a copy of its values) or value."""
    items = value.items() if hasattr(value, "items") else enumerate(value)
    return [(type(value).__name__, None)] + [
        (str(key), (item, item.clone()) if isinstance(item, torch.Tensor) else item) for key, item in items
    ]


def _assert_as_found(value: Any, before: List[Tuple[str, Any]]) -> None:
    after = _fields(value)
    assert [key for key, _ in after] == [key for key, _ in before]
    for (_, found), (_, now) in zip(before, after):
        if isinstance(found, tuple) and isinstance(found[0], torch.Tensor):
            assert now[0] is found[0] and torch.equal(now[0], found[1]) and now[0]._version == found[0]._version
        else:
            assert now == found


def _handed(model: nn.Module, run: Callable[[], Any], given: Any) -> List[bool]:
    """Whether each forward of the model that ``run`` makes is handed ``given`` itself."""
    seen: List[bool] = []

    def hook(module: nn.Module, args: Any, kwargs: Any) -> None:
        seen.append(kwargs.get("encoder_outputs") is given)

    handle = model.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        run()
    finally:
        handle.remove()
    return seen


@pytest.mark.parametrize("form", [_own_class, _plain_tuple], ids=["own class", "plain tuple"])
@pytest.mark.parametrize("make", [_t5, _bart], ids=["t5", "bart"])
def test_each_forward_is_handed_the_callers_encoder_output(make: Callable[..., nn.Module], form: Callable[..., Any]) -> None:
    model = make()
    ids = torch.randint(3, VOCAB, (B, P), generator=torch.Generator().manual_seed(1))
    given = form(model, ids)
    as_found, prompt = _fields(given), ids.clone()
    expected, _ = generate_truth(model, ids, N, {"encoder_outputs": given})
    generate_handed = _handed(model, lambda: generate_truth(model, ids, N, {"encoder_outputs": given}), given)
    assert generate_handed == [True] * N  # the oracle: the real generate() hands each forward the caller's object
    _assert_as_found(given, as_found)
    before = snapshot(model)
    result = count_generation(model, ids, new_tokens=N, kwargs={"encoder_outputs": given})
    assert [2 * result.prefill.macs] + [2 * step.macs for step in result.steps] == expected
    assert result.complete, result.incomplete_reasons()
    handed = _handed(model, lambda: count_generation(model, ids, new_tokens=N, kwargs={"encoder_outputs": given}), given)
    assert handed == generate_handed
    assert_same_state(model, before)
    _assert_as_found(given, as_found)
    assert torch.equal(ids, prompt)
    # on meta (fake copies of the model and of the caller's object): the same figures
    meta, meta_ids = make("meta"), ids.to("meta")
    meta_given = form(meta, meta_ids)
    meta_found = _fields(meta_given)
    counted = count_generation(meta, meta_ids, new_tokens=N, kwargs={"encoder_outputs": meta_given})
    assert [2 * counted.prefill.macs] + [2 * step.macs for step in counted.steps] == expected
    assert [key for key, _ in _fields(meta_given)] == [key for key, _ in meta_found]


def _moonshine(device: str = "cpu") -> nn.Module:
    config = transformers.AutoConfig.for_model(
        "moonshine", vocab_size=VOCAB, hidden_size=32, intermediate_size=64, encoder_num_hidden_layers=2,
        decoder_num_hidden_layers=2, encoder_num_attention_heads=4, decoder_num_attention_heads=4,
        encoder_num_key_value_heads=4, decoder_num_key_value_heads=4, max_position_embeddings=64,
        decoder_start_token_id=1, bos_token_id=1, pad_token_id=0,
    )
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.AutoModelForSpeechSeq2Seq.from_config(config)
    model.generation_config.eos_token_id = None
    return model.eval()


def test_a_decoder_that_reads_another_field_of_the_callers_encoder_output() -> None:
    # Moonshine's decoder reads ``encoder_outputs.attention_mask``, a field of its encoder's output
    # class (MoonshineEncoderModelOutput): the rebuilt BaseModelOutput has none, and the first decode
    # step failed with an AttributeError.
    model = _moonshine()
    audio = torch.randn(B, 1600, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        given = model.get_encoder()(audio, attention_mask=torch.ones(B, 1600, dtype=torch.int64))
    assert given.attention_mask is not None
    as_found = _fields(given)
    expected, _ = generate_truth(model, audio, N, {"encoder_outputs": given})
    before = snapshot(model)
    result = count_generation(model, audio, new_tokens=N, kwargs={"encoder_outputs": given})
    assert [2 * result.prefill.macs] + [2 * step.macs for step in result.steps] == expected
    assert result.complete, result.incomplete_reasons()
    assert_same_state(model, before)
    _assert_as_found(given, as_found)
