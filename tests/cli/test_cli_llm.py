"""hf: shortcuts build encoder-decoders whole, with default decoder / speech inputs, and
`count --generate N` counts generate() (numbers from hand formulas)."""

from __future__ import annotations

import json

import pytest

from flopcount.cli import main

transformers = pytest.importorskip("transformers")


def cli(capsys, *args: str):
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


T5 = ["--config", "d_model=32", "--config", "d_ff=64", "--config", "d_kv=8", "--config", "num_heads=4",
      "--config", "num_layers=2", "--config", "num_decoder_layers=2", "--config", "vocab_size=60"]


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_hf_t5_counts_encoder_and_decoder_without_flags(capsys, device):
    code, out, err = cli(capsys, "count", "hf:t5", *T5, "--device", device, "-f", "json")
    assert code == 0, err
    data = json.loads(out)
    assert data["by_module"][""]["type"] == "T5ForConditionalGeneration"
    assert "decoder_input_ids=Tensor[1, 128] int64" in data["inputs"]
    # per layer: q, k, v, o (32 x 32 each) and the two FFN matrices (32 x 64 each), 128 tokens each side
    encoder_linear = 2 * 128 * (4 * 32 * 32 + 2 * 32 * 64)
    attention = 2 * 4 * 128 * 128 * 2 * 8  # per layer: QK^T and AV over 4 heads of 8
    assert data["by_module"]["encoder"]["macs"] == encoder_linear + attention
    assert data["by_module"]["lm_head"]["macs"] == 128 * 32 * 60
    assert data["entry"].startswith("hf:t5 [d_model=32")  # overrides named in the report


def test_hf_whisper_gets_input_features(capsys):
    code, out, err = cli(capsys, "count", "hf:whisper", "--config", "d_model=32", "--config", "encoder_layers=1",
                         "--config", "decoder_layers=1", "--config", "encoder_attention_heads=2",
                         "--config", "decoder_attention_heads=2", "--config", "encoder_ffn_dim=64",
                         "--config", "decoder_ffn_dim=64", "--config", "max_source_positions=50",
                         "--device", "meta", "-f", "json")
    assert code == 0, err
    data = json.loads(out)
    assert "Tensor[1, 80, 100] float32" in data["inputs"]  # mel bins x 2 * max_source_positions
    # the encoder's two convolutions: 80 -> 32 (k=3) over 100 frames, 32 -> 32 (k=3, stride 2) over 50
    conv = 100 * 80 * 32 * 3 + 50 * 32 * 32 * 3
    assert data["by_module"]["model.encoder.conv1"]["macs"] + data["by_module"]["model.encoder.conv2"]["macs"] == conv
    # the decoder over its default 128 tokens (d = 32, 2 heads of 16), 50 encoder frames, ffn 64:
    # self-attention 4 projections + QK^T and AV; cross-attention q, o on 128, k, v on 50, scores 128 x 50
    t, d, s, ffn = 128, 32, 50, 64
    decoder = (4 * t * d * d + 2 * t * t * d) + (2 * t * d * d + 2 * s * d * d + 2 * t * s * d) + 2 * t * d * ffn
    assert data["by_module"]["model.decoder"]["macs"] == decoder


def test_user_prompt_keeps_the_default_decoder_inputs(capsys):
    code, out, err = cli(capsys, "count", "hf:bart", "--config", "d_model=32", "--config", "encoder_layers=1",
                         "--config", "decoder_layers=1", "--config", "vocab_size=70", "--config", "encoder_ffn_dim=64",
                         "--config", "decoder_ffn_dim=64", "--input", "1x16:int64", "--device", "meta", "-f", "json")
    assert code == 0, err
    data = json.loads(out)
    assert "Tensor[1, 16] int64" in data["inputs"] and "decoder_input_ids=Tensor[1, 128] int64" in data["inputs"]
    assert data["by_module"]["lm_head"]["macs"] == 128 * 32 * 70


LLAMA = ["--config", "hidden_size=64", "--config", "intermediate_size=128", "--config", "num_hidden_layers=2",
         "--config", "num_attention_heads=4", "--config", "num_key_value_heads=2", "--config", "vocab_size=100"]


def test_count_generate(capsys):
    code, out, err = cli(capsys, "count", "hf:llama", *LLAMA, "--device", "meta", "--generate", "5", "--input", "2x12:int64",
                         "-f", "json")
    assert code == 0, err
    data = json.loads(out)
    dense = 2 * (64 * 64 * 2 + 2 * 64 * 32 + 3 * 64 * 128)  # per token: q, o; k, v (2 KV heads); MLP
    attention = 2 * 2 * 4 * 2 * 16  # layers x batch x heads x (QK^T + AV) x head dim, per query-key pair
    assert data["prefill"]["macs"] == 2 * 12 * dense + 2 * 64 * 100 + attention * 12 * 12
    assert [s["macs"] for s in data["steps"]] == [2 * (dense + 64 * 100) + attention * (12 + s + 1) for s in range(4)]
    assert data["kv_cache_bytes"] == 2 * 2 * 2 * 2 * (12 + 4) * 16 * 4  # K and V, layers, batch, KV heads, positions, dim
    code, out, err = cli(capsys, "count", "hf:llama", *LLAMA, "--device", "meta", "--generate", "5", "--input", "2x12:int64")
    assert code == 0, err
    assert "prefill" in out and "decode" in out and "[hidden_size=64" in out


def test_count_generate_needs_a_token_prompt(capsys):
    code, _, err = cli(capsys, "count", "hf:llama", *LLAMA, "--device", "meta", "--generate", "3", "--backward")
    assert code != 0 and "--generate" in err


def test_count_generate_says_the_kv_cache_dtype_and_takes_dtype(capsys):
    # issue #20.4: `count --dtype` casts the model and floating inputs (as check's --dtype does for
    # memory); the KV-cache line says its dtype
    code, out, err = cli(capsys, "count", "hf:llama", *LLAMA, "--device", "meta", "--generate", "5", "--input", "2x12:int64",
                         "--dtype", "bfloat16", "-f", "json")
    assert code == 0, err
    data = json.loads(out)
    # K and V x layers x batch x KV heads x positions x head dim, 2 bytes each in bfloat16
    assert data["kv_cache_bytes"] == 2 * 2 * 2 * 2 * (12 + 4) * 16 * 2
    assert data["kv_cache_dtype"] == "bfloat16"
    code, out, err = cli(capsys, "count", "hf:llama", *LLAMA, "--generate", "3", "--input", "1x8:int64")
    assert code == 0, err
    kv = 2 * 2 * 1 * 2 * (8 + 2) * 16 * 4  # float32 on cpu
    assert f"KV cache after the last step {kv / 1000:.2f} kB (float32)" in out


def test_count_generate_does_not_print_transformers_cache_rename_notice(capsys):
    # issue #20.4: "`past_key_values`/`cache_params` are deprecated" was printed on every --generate
    # run; it is silenced inside flopcount's own call only
    import logging

    seen = []

    class Grab(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    logger = logging.getLogger("transformers.utils.generic")
    grab = Grab()
    logger.addHandler(grab)
    once = getattr(logging.Logger.warning_once, "cache_clear", None)  # transformers logs it once per process
    try:
        if once is not None:
            once()
        code, _, err = cli(capsys, "count", "hf:llama", *LLAMA, "--generate", "2", "--input", "1x8:int64")
        assert code == 0, err
        assert not [m for m in seen if "deprecated" in m]
        # outside flopcount's call the notice is transformers' again (nothing silenced globally)
        logger.warning("`past_key_values`/`cache_params` are deprecated. Use `cache` instead.")
        assert [m for m in seen if "deprecated" in m]
    finally:
        logger.removeHandler(grab)


def test_count_dtype_casts_the_weights(capsys):
    code, out, err = cli(capsys, "count", "hf:llama", *LLAMA, "--device", "meta", "--input", "2x12:int64",
                         "--dtype", "float16", "-f", "json")
    assert code == 0, err
    data = json.loads(out)
    assert data["param_bytes_by_dtype"] == {"float16": 2 * data["params"]}


MIXTRAL = ["--config", "hidden_size=32", "--config", "intermediate_size=48", "--config", "num_hidden_layers=2",
           "--config", "num_attention_heads=4", "--config", "num_key_value_heads=2", "--config", "num_local_experts=4",
           "--config", "num_experts_per_tok=2", "--config", "vocab_size=50"]


def test_count_generate_prints_every_warning_of_its_counts(capsys):
    """#20.3: the MoE-on-meta note of the prefill's count reached neither the table nor the JSON."""
    import torch

    from flopcount.generation.count import count_generation

    config = transformers.AutoConfig.for_model("mixtral", **{a.split("=")[0]: int(a.split("=")[1]) for a in MIXTRAL[1::2]})
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config).eval()
    gen = count_generation(model, torch.zeros(2, 6, dtype=torch.int64, device="meta"), new_tokens=3)
    expected = [w for w in gen.prefill.warnings if "_grouped_mm" in w]
    assert expected
    code, out, err = cli(capsys, "count", "hf:mixtral", *MIXTRAL, "--device", "meta", "--generate", "3", "--input", "2x6:int64")
    assert code == 0, err
    assert all(f"note: {w}" in out for w in expected)
    code, out, err = cli(capsys, "count", "hf:mixtral", *MIXTRAL, "--device", "meta", "--generate", "3", "--input", "2x6:int64",
                         "-f", "json")
    assert all(w in json.loads(out)["warnings"] for w in expected)
