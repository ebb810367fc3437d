"""Branch tf32rule: ``--matmul-tf32`` / ``--no-conv-tf32`` on a part without a TF32 peak (a T4,
a V100: Turing and Volta have no TF32 tensor cores) change nothing; on the parent they were
accepted in silence. A note on stderr says so, and the run goes on (exit 0) with the same
FP32 figures. Each test failed on the parent (no note)."""

from __future__ import annotations

import json

import pytest

from tests.cli._cli_run import cli

MODEL = """
import torch.nn as nn


def mlp():
    return nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 64))
"""

# T4 datasheet: FP32 8.1 TFLOP/s, no TF32 column
T4_FP32 = 8.1e12
FLOPS = 2 * 32 * 256 * 512 + 32 * 512 + 2 * 32 * 512 * 64


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    (tmp_path / "tf32rule_models.py").write_text(MODEL)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("flags, said", [
    (("--matmul-tf32",), "--matmul-tf32 change(s) nothing there"),
    (("--no-conv-tf32",), "--no-conv-tf32 change(s) nothing there"),
    (("--matmul-tf32", "--no-conv-tf32"), "--matmul-tf32 and --no-conv-tf32 change(s) nothing there"),
])
def test_count_on_a_part_without_tf32_says_the_flags_change_nothing(workdir, capsys, flags, said):
    code, out, err = cli(capsys, "count", "tf32rule_models.py:mlp", "-i", "32x256", "--on", "t4", *flags, "-f", "json")
    assert code == 0, err
    assert f"flopcount: note: T4 has no TF32 peak (no TF32 tensor cores): {said}; its float32 work is priced at FP32" in err
    assert err.count("has no TF32 peak") == 1  # said once: the bound's own reading of the flags says nothing again
    predict = json.loads(out)["predict"]
    assert predict["float32_math"] == {}
    # the T4 bound is FP32's either way (its 4 MB L2 holds the 0.6 MB of weights and inputs: no memory term)
    assert predict["any_s"] == pytest.approx(FLOPS / T4_FP32, rel=1e-9)


def test_check_and_roofs_on_a_v100_say_it_too(workdir, capsys):
    code, out, err = cli(capsys, "check", "tf32rule_models.py:mlp", "-i", "32x256", "--max-latency", "1ns", "--on", "v100",
                         "--matmul-tf32")
    assert code == 1, err  # FAIL: the FP32 bound, 10,502,144 FLOPs / 15.7 TFLOP/s = 669 ns
    assert "FAIL: 1 of 1 budget(s) exceeded: latency (any-implementation lower bound on V100 SXM2)" in out
    assert "note: V100 SXM2 has no TF32 peak" in err
    assert err.count("has no TF32 peak") == 1
    code, out, err = cli(capsys, "roofs", "v100", "--matmul-tf32", "--format", "json")
    assert code == 0, err
    assert "note: V100 SXM2 has no TF32 peak" in err
    assert json.loads(out)["math"] == {}


def test_a_part_with_tf32_gets_no_note(workdir, capsys):
    code, out, err = cli(capsys, "count", "tf32rule_models.py:mlp", "-i", "32x256", "--on", "h100", "--matmul-tf32")
    assert code == 0, err
    assert "no TF32 peak" not in err
