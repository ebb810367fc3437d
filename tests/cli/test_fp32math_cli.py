"""Branch fp32math: ``count``/``check --on PART`` price a float32 LSTM under the cuDNN flag
(``--no-conv-tf32``), as cuDNN runs it, and say so: "convolutions and RNN layers in TF32". On
the parent the LSTM was priced as a matmul (FP32 under the defaults) and the line said "float32
matmuls in FP32". Each test failed on the parent."""

from __future__ import annotations

import json

import pytest

from tests.cli._cli_run import cli

MODEL = """
import torch.nn as nn


def lstm():
    return nn.LSTM(64, 128)
"""

# H100 SXM datasheet, dense: FP32 67 TFLOP/s, TF32 494.5 TFLOP/s
FP32 = 67e12
TF32 = 494.5e12
# one layer, 10 steps x batch 4 = 40 positions: 2 FLOPs per MAC of the 4 gates' projections
# (512x64 and 512x128 weights) plus 22 FLOPs of gate arithmetic per position and hidden unit
FLOPS = 2 * 40 * (512 * 64 + 512 * 128) + 22 * 40 * 128


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    (tmp_path / "fp32math_models.py").write_text(MODEL)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("flags, peak, column", [((), TF32, "tfloat32"), (("--no-conv-tf32",), FP32, "float32"),
                                                 (("--no-conv-tf32", "--matmul-tf32"), FP32, "float32")])
def test_count_prices_an_lstm_under_the_cudnn_flag(workdir, capsys, flags, peak, column):
    """0.4 MB of weights, inputs and states sit in the 50 MB L2 (bandwidth unpublished): no
    memory term, the bound is FLOPs / peak."""
    code, out, err = cli(capsys, "count", "fp32math_models.py:lstm", "-i", "10x4x64", "--on", "h100", *flags, "-f", "json")
    assert code == 0, err
    predict = json.loads(out)["predict"]
    assert predict["any_s"] == pytest.approx(FLOPS / peak, rel=1e-9)
    assert predict["float32_math"] == {"conv": column}


def test_check_says_rnn_layers_in_its_math(workdir, capsys):
    code, out, err = cli(capsys, "check", "fp32math_models.py:lstm", "-i", "10x4x64", "--max-latency", "1ns", "--on", "h100")
    assert code == 1, err  # FAIL: 16.1 ns > 1 ns
    assert ("FAIL: 1 of 1 budget(s) exceeded: latency (any-implementation lower bound on H100 SXM with float32 "
            "convolutions and RNN layers in TF32)") in out


def test_roofs_names_each_family_and_its_rate(capsys):
    """``flopcount roofs h100`` says what each float32 family is priced at, by the names the
    math sentence uses (before: "float32 conv work", which also holds the RNN layers), with the
    rates from the datasheet: FP32, TF32 / 3, TF32."""
    code, out, err = cli(capsys, "roofs", "h100")
    assert code == 0, err
    assert out.splitlines()[-3:] == [
        f"float32 matmuls priced at the float32 peak ({FP32 / 1e12:g} TFLOP/s)",
        f"float32 attention priced at the tfloat32x3 peak ({TF32 / 3 / 1e12:.1f} TFLOP/s)",
        f"float32 convolutions and RNN layers priced at the tfloat32 peak ({TF32 / 1e12:g} TFLOP/s)",
    ]
