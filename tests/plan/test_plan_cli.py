"""``flopcount plan`` and ``check --max-memory --fsdp/--tp``, in process. Oracles: the
FSDP2 formulas of docs/parallel.md, and the unsharded estimate (estimate_memory, checked
against MemTracker in test_memory.py) as the line a sharded plan must come in under."""

from __future__ import annotations

import json
import textwrap
from typing import Any

import pytest
import torch
from conftest import run_cli as cli

import flopcount

MODELS = textwrap.dedent(
    """
    from torch import nn

    def encoder():
        layer = nn.TransformerEncoderLayer(d_model=64, nhead=4, dim_feedforward=128, dropout=0.0, batch_first=True)
        return nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
    """
)
LAYER_PARAMS = 4 * 64 * 64 + 4 * 64 + 2 * 64 * 128 + 128 + 64 + 4 * 64  # attention, MLP, two norms


@pytest.fixture
def workdir(tmp_path: Any, monkeypatch: Any) -> Any:
    (tmp_path / "plan_models.py").write_text(MODELS)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_plan_json(workdir: Any, capsys: Any) -> None:
    code, out, _ = cli(capsys, "plan", "plan_models.py:encoder", "--input", "2x16x64", "--fsdp", "2", "-f", "json",
                       "--link", "nvlink4")
    assert code == 0
    data = json.loads(out)
    gathers = [r for r in data["comm"] if r["kind"] == "all_gather"]
    # two blocks gathered in forward and again in backward; the root holds no parameters of its own
    assert gathers[0]["calls"] == 4 and gathers[0]["tensor_bytes"] == 2 * 2 * LAYER_PARAMS * 4
    assert data["state_bytes"]["parameters"] == 2 * LAYER_PARAMS * 4 // 2
    assert data["step_time"]["comm_s"] == pytest.approx(sum(r["wire_bytes"] for r in data["comm"]) / 450e9)


def test_check_memory_is_per_rank_with_fsdp(workdir: Any, capsys: Any) -> None:
    from _plan_gloo import tiny_encoder  # the same model as plan_models.py:encoder

    sharded = flopcount.plan(tiny_encoder, (torch.randn(2, 16, 64),), fsdp=2, on=None).peak_bytes
    whole = flopcount.estimate_memory(tiny_encoder(), torch.randn(2, 16, 64), backward=True, optimizer="adamw").peak_bytes
    assert sharded < whole
    budget = str((sharded + whole) // 2)
    args = ("check", "plan_models.py:encoder", "--input", "2x16x64", "--max-memory", budget, "--optimizer", "adamw")
    assert cli(capsys, *args, "--fsdp", "2")[0] == 0
    assert cli(capsys, *args)[0] == 1


@pytest.mark.parametrize("bad", [("--fsdp", "0"), ("--link", "carrier-pigeon"), ("--on", "abacus")])
def test_bad_input_is_one_line_exit_2(workdir: Any, capsys: Any, bad: Any) -> None:
    code, out, err = cli(capsys, "plan", "plan_models.py:encoder", "--input", "2x16x64", "--fsdp", "2", *bad)
    assert code == 2 and out == ""
    assert len([line for line in err.splitlines() if line.strip()]) == 1


@pytest.mark.parametrize("flag", ["--kwarg", "--config"])
def test_a_key_given_twice_is_one_line_exit_2(workdir: Any, capsys: Any, flag: str) -> None:
    # as count and serve say it; plan took the last --kwarg silently before
    pair = "src_key_padding_mask=2x16:bool" if flag == "--kwarg" else "num_layers=int:2"
    code, out, err = cli(capsys, "plan", "plan_models.py:encoder", "--input", "2x16x64", "--fsdp", "2", "-q", flag, pair, flag, pair)
    assert code == 2 and out == ""
    assert [line for line in err.splitlines() if line.strip()] == [f"flopcount: error: {flag} {pair.split('=')[0]} is given twice"]


def test_backend_gloo_is_planned_and_echoed(workdir: Any, capsys: Any) -> None:
    # the value itself is checked against real gloo ranks in test_plan_mixed_precision.py (serial)
    from _plan_gloo import tiny_encoder

    code, out, _ = cli(capsys, "plan", "plan_models.py:encoder", "--input", "2x16x64", "--fsdp", "2", "-f", "json",
                       "--backend", "gloo", "--mixed-precision", "bfloat16")
    assert code == 0
    data = json.loads(out)
    planned = flopcount.plan(tiny_encoder, (torch.randn(2, 16, 64),), fsdp=2, mixed_precision="bfloat16", backend="gloo")
    assert data["backend"] == "gloo" and data["peak_bytes"] == planned.peak_bytes
    assert "gloo collectives" in flopcount.plan(tiny_encoder, (torch.randn(2, 16, 64),), fsdp=2, backend="gloo").table()


def test_unknown_backend_is_a_usage_error() -> None:
    from _plan_gloo import tiny_encoder

    with pytest.raises(flopcount.UsageError, match="backend must be one of nccl, gloo, got 'mpi'"):
        flopcount.plan(tiny_encoder, (torch.randn(2, 16, 64),), fsdp=2, backend="mpi")
