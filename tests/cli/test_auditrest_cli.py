"""Branch auditrest: the math mode of the part ``count``, ``check`` and ``serve --on`` model
(``--matmul-tf32``, ``--no-conv-tf32``), said in the bound, the output and check's verdict. Each
test failed on the parent of its fix (the flags did not exist there: exit 2)."""

from __future__ import annotations

import json

import pytest

from tests.cli._cli_run import cli

MODEL = """
import torch.nn as nn


def mlp():
    return nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 64))
"""

# H100 SXM datasheet (dense): FP32 67 TFLOP/s, TF32 494.5 TFLOP/s, a 50 MB L2 whose bandwidth is
# unpublished, so no memory term for this batch's few hundred kB. The float32 work of a 32 x 256
# batch: the two linears and the ReLU. Only the linears run under the matmul mode; the ReLU
# never runs on tensor cores, so it stays at FP32 (branch tf32rule).
MATMUL_FLOPS = 2 * 32 * 256 * 512 + 2 * 32 * 512 * 64
RELU_FLOPS = 32 * 512
FLOPS = MATMUL_FLOPS + RELU_FLOPS
FP32_S = FLOPS / 67e12   # 156.7 ns
TF32_S = MATMUL_FLOPS / 494.5e12 + RELU_FLOPS / 67e12  # 21.45 ns


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    (tmp_path / "auditrest_models.py").write_text(MODEL)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_count_on_prices_float32_matmuls_at_the_math_it_is_told(workdir, capsys):
    """count --on h100 priced a float32 model at FP32 with no way to say TF32 (TensorRT's default)."""
    bounds = {}
    for flags, column in (((), "float32"), (("--matmul-tf32",), "tfloat32")):
        code, out, err = cli(capsys, "count", "auditrest_models.py:mlp", "-i", "32x256", "--on", "h100", *flags, "-f", "json")
        assert code == 0, err
        predict = json.loads(out)["predict"]
        assert predict["float32_math"] == {"matmul": column}
        bounds[column] = predict["any_s"]
    assert bounds["float32"] == pytest.approx(FP32_S, rel=1e-9)
    assert bounds["tfloat32"] == pytest.approx(TF32_S, rel=1e-9)


def test_count_on_says_the_math_in_its_table(workdir, capsys):
    code, out, err = cli(capsys, "count", "auditrest_models.py:mlp", "-i", "32x256", "--on", "h100", "--matmul-tf32")
    assert code == 0, err
    assert "Math: float32 matmuls in TF32 (the part's math modes for float32 work)" in out


@pytest.mark.parametrize("flags, code, verdict", [
    ((), 1, "FAIL: 1 of 1 budget(s) exceeded: latency (any-implementation lower bound on H100 SXM with float32 matmuls in FP32)"),
    (("--matmul-tf32",), 3, "UNDECIDED: latency is not decided without measuring (its any-implementation lower bound on "
                            "H100 SXM with float32 matmuls in TF32 is within the budget)"),
])
def test_check_on_a_certain_fail_is_certain_under_the_math_it_names(workdir, capsys, flags, code, verdict):
    """A 100 ns budget: above the FP32 bound (156.7 ns), within the TF32 one (21.4 ns: the ReLU at FP32). The FAIL
    was called certain with no word that it assumed FP32 matmuls, which a TF32 engine beats."""
    got, out, err = cli(capsys, "check", "auditrest_models.py:mlp", "-i", "32x256", "--max-latency", "100ns",
                        "--on", "h100", *flags)
    assert got == code, err
    assert verdict in out


@pytest.mark.parametrize("command", [
    ("count", "auditrest_models.py:mlp", "-i", "4x256", "--matmul-tf32"),
    ("check", "auditrest_models.py:mlp", "-i", "4x256", "--max-flops", "1G", "--no-conv-tf32"),
])
def test_the_math_flags_without_a_part_are_refused(workdir, capsys, command):
    code, out, err = cli(capsys, *command)
    assert code == 2 and out == ""
    assert "set the math of the part --on PART models: add --on" in err


def test_the_math_flags_on_this_machine_are_refused_before_any_work(workdir, capsys):
    code, out, err = cli(capsys, "count", "auditrest_models.py:mlp", "-i", "4x256", "--on", "this machine", "--matmul-tf32")
    assert code == 2 and out == ""
    assert "model a datasheet part's math modes; this machine's are its own" in err


def test_serve_on_prices_a_float32_forward_at_the_math_it_is_told(workdir, capsys):
    pytest.importorskip("transformers")
    llama = ["hf:llama", "--config", "num_hidden_layers=2", "--config", "hidden_size=64", "--config", "intermediate_size=128",
             "--config", "num_attention_heads=4", "--config", "num_key_value_heads=2", "--config", "vocab_size=100"]
    prefill = {}
    # branch serveattn: attention's FLOPs have a column of their own (the faster of the matmul
    # mode and 3xTF32, the memory-efficient SDPA kernel's float32 math), so float32_math names it
    for flags, math in (((), {"matmul": "float32", "attention": "tfloat32x3"}),
                        (("--matmul-tf32",), {"matmul": "tfloat32", "attention": "tfloat32"})):
        code, out, err = cli(capsys, "serve", *llama, "--dtype", "float32", "--prompt", "16", "--new", "2", *flags, "-f", "json")
        assert code == 0, err
        part = json.loads(out)["parts"][0]
        assert part["float32_math"] == math
        prefill[math["matmul"]] = part["batches"][0]["prefill"]
    # SDPA over the 16-token prompt: 2 FLOPs x (2 layers x 4 heads x 16 x 16 x (16 + 16) MACs; head dim 64 / 4)
    attention = 2 * 2 * 4 * 16 * 16 * (16 + 16)
    assert prefill["float32"]["attention_flops"] == prefill["tfloat32"]["attention_flops"] == attention
    # the causal prompt's kernel computes each query's scores up to the diagonal only (branch
    # servecausal): the 16 x 15 / 2 pairs above it are left out of the compute term, not the count
    skipped = 2 * 2 * 4 * (16 * 15 // 2) * (16 + 16)
    # under the defaults: attention at TF32 / 3, every other FLOP as a matmul at FP32 (the datasheet peaks)
    rest = prefill["float32"]["flops"] - attention
    assert prefill["float32"]["compute_s"] == pytest.approx((attention - skipped) / (494.5e12 / 3) + rest / 67e12, rel=1e-9)
    # under --matmul-tf32 both are at TF32 (faster than 3xTF32): FLOPs / the TF32 peak
    assert prefill["tfloat32"]["compute_s"] == pytest.approx((prefill["tfloat32"]["flops"] - skipped) / 494.5e12, rel=1e-9)
    code, out, err = cli(capsys, "serve", *llama, "--dtype", "float32", "--prompt", "16", "--new", "2", "--matmul-tf32")
    assert code == 0, err
    assert "H100 SXM: compute float32 (float32 matmuls in TF32, attention in TF32)" in out
