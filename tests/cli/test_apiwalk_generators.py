"""``serve`` and ``count --generate`` build, for an ``hf:`` name, the class generate() runs (branch apiwalk):
a vision-language decoder such as Qwen2-VL is no causal LM in transformers' tables, so count's class
for its type is the base model (Qwen2VLModel, no language-model head) and a text prompt could not be
served ("returned hidden states ... no language-model head"). Now the commands that generate take
the type's image-text-to-text class (Qwen2VLForConditionalGeneration); ``count`` is unchanged."""

from __future__ import annotations

import json

import pytest
from _cli_run import cli

transformers = pytest.importorskip("transformers")

# a tiny Qwen2-VL, written as a config.json without "architectures" (what hf:qwen2_vl's type alone says)
LAYERS, HIDDEN, FFN, HEADS, KV_HEADS, VOCAB = 2, 64, 128, 4, 2, 256
VISION = dict(depth=1, embed_dim=32, hidden_size=HIDDEN, num_heads=2)  # patch 14, temporal 2, mlp_ratio 4, merge 2


def _write_config(folder, architectures=None):
    text = dict(hidden_size=HIDDEN, intermediate_size=FFN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                num_key_value_heads=KV_HEADS, vocab_size=VOCAB, max_position_embeddings=512, bos_token_id=1,
                eos_token_id=2, rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]})
    config = transformers.Qwen2VLConfig(text_config=text, vision_config=VISION, bos_token_id=1, eos_token_id=2,
                                        image_token_id=3, video_token_id=4, vision_start_token_id=5)
    if architectures:
        config.architectures = architectures
    folder.mkdir()
    config.to_json_file(str(folder / "config.json"))
    return folder


def _hand_parameters() -> int:
    """Qwen2-VL's parameters from its config, by hand: the text decoder (q/k/v with biases, o and the
    SwiGLU MLP without, two RMSNorms a layer, untied embedding and LM head) and the vision tower
    (Conv3d patch embedding without bias, one pre-norm block, the 2x2 patch merger into the text width)."""
    head_dim = HIDDEN // HEADS
    attention = (HIDDEN * HIDDEN + HIDDEN) + 2 * (HIDDEN * KV_HEADS * head_dim + KV_HEADS * head_dim) + HIDDEN * HIDDEN
    layer = attention + 3 * HIDDEN * FFN + 2 * HIDDEN
    text = 2 * VOCAB * HIDDEN + LAYERS * layer + HIDDEN
    width = VISION["embed_dim"]
    patch = 3 * width * 2 * 14 * 14
    block = 2 * 2 * width + (width * 3 * width + 3 * width) + (width * width + width) + (width * 4 * width + 4 * width) + (4 * width * width + width)
    merged = width * 4
    merger = 2 * width + (merged * merged + merged) + (merged * HIDDEN + HIDDEN)
    return text + patch + block + merger


@pytest.fixture
def qvl(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return _write_config(tmp_path / "qvl")


def test_serve_of_a_vision_language_type_serves_a_text_prompt_with_the_configs_figures(qvl, capsys):
    """Before: exit 2, 'it returned hidden states (last_hidden_state) and no logits'. The weights are the
    whole checkpoint's (vision tower included: a server loads it), 4 B each; the KV cache is
    layers x (K, V) x kv_heads x head_dim x 4 B a token."""
    code, out, err = cli(capsys, "serve", "hf:./qvl", "--on", "h100", "--prompt", "64", "--new", "4", "--batch", "1", "-f", "json")
    assert code == 0, err
    part = json.loads(out)["parts"][0]
    assert part["weight_bytes"] == 4 * _hand_parameters() == 728_960
    assert part["kv_bytes_per_token"] == LAYERS * 2 * KV_HEADS * (HIDDEN // HEADS) * 4 == 512
    assert part["kv_bytes_per_sequence"] == 512 * (64 + 4 - 1)


def test_serve_decode_step_runs_the_language_model_head(qvl, capsys):
    """A decode step's FLOPs hold the LM head's vocab x hidden matmul (2 FLOPs a MAC) for its one token:
    the hf:qwen2_vl built before had no head. Counted apart: the step less its head is the same model's
    decode step with vocab 256 -> 512 minus 2 x 256 x 64 more FLOPs."""
    code, out, err = cli(capsys, "serve", "hf:./qvl", "--on", "h100", "--prompt", "16", "--new", "3", "--batch", "1", "-f", "json")
    assert code == 0, err
    small = json.loads(out)["parts"][0]["decode_flops_per_token"]
    config = json.loads((qvl / "config.json").read_text())
    config["text_config"]["vocab_size"] = 2 * VOCAB
    (qvl / "config.json").write_text(json.dumps(config))
    code, out, err = cli(capsys, "serve", "hf:./qvl", "--on", "h100", "--prompt", "16", "--new", "3", "--batch", "1", "-f", "json")
    assert code == 0, err
    assert json.loads(out)["parts"][0]["decode_flops_per_token"] - small == 2 * VOCAB * HIDDEN


def test_count_generate_of_a_vision_language_type_counts_the_steps(qvl, capsys):
    """Before: exit 2 (no language-model head). 3 new tokens: a prefill and 2 decode steps."""
    code, out, err = cli(capsys, "count", "hf:./qvl", "--input", "1x8:int64", "--generate", "3", "-f", "json")
    assert code == 0, err
    assert len(json.loads(out)["steps"]) == 2


def test_count_without_generate_keeps_the_base_model(qvl):
    """count's class for the type is unchanged (the bare model, as for every multimodal type)."""
    from flopcount.cli.entry import load_entry

    assert type(load_entry("hf:./qvl", device="meta").model).__name__ == "Qwen2VLModel"
    assert type(load_entry("hf:./qvl", device="meta", generating=True).model).__name__ == "Qwen2VLForConditionalGeneration"


def test_a_config_naming_the_base_model_still_generates_with_the_head(tmp_path, monkeypatch):
    """A config.json whose "architectures" names Qwen2VLModel: count builds what it names; the
    commands that generate build the class generate() runs (Qwen2VLModel.can_generate() is False)."""
    from flopcount.cli.entry import load_entry

    monkeypatch.chdir(tmp_path)
    _write_config(tmp_path / "base", ["Qwen2VLModel"])
    assert type(load_entry("hf:./base", device="meta").model).__name__ == "Qwen2VLModel"
    assert type(load_entry("hf:./base", device="meta", generating=True).model).__name__ == "Qwen2VLForConditionalGeneration"


@pytest.mark.parametrize("model_type, generator", [("qwen2_vl", "Qwen2VLForConditionalGeneration"),
                                                   ("llava", "LlavaForConditionalGeneration"),
                                                   ("llama", "LlamaForCausalLM")])
def test_a_model_type_name_builds_the_class_generate_runs(model_type, generator):
    """transformers' own tables: a causal LM type keeps AutoModelForCausalLM's class; a vision-language
    type gets AutoModelForImageTextToText's (the hub checkpoints of both name these classes)."""
    from transformers.models.auto import modeling_auto

    from flopcount.cli.entry import load_entry

    expected = modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type) or modeling_auto.MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES[model_type]
    assert expected == generator
    config = {"num_hidden_layers": 1} if model_type == "llama" else {}
    assert type(load_entry(f"hf:{model_type}", device="meta", config=config, generating=True).model).__name__ == generator
