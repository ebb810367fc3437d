"""The CLI's memory wiring: ``check --max-memory [--backward] [--optimizer]`` and
``count --memory``. Oracles: the published MemTracker figure for the MLP (REFERENCES.md)
and torch's MemTracker run live on a real forward."""

from __future__ import annotations

import json
import textwrap

import pytest
import torch
from conftest import run_cli as cli

MemTracker = pytest.importorskip("torch.distributed._tools.mem_tracker").MemTracker

# REFERENCES.md: MLP 1024 -> 4096 -> 1024, batch 64, forward + backward on cpu peaks at 68,460,552 bytes (MemTracker)
MLP_TRAIN_PEAK = 68_460_552
N_PARAMS = 1024 * 4096 + 4096 + 4096 * 1024 + 1024

MODELS = textwrap.dedent(
    """
    from torch import nn

    def mlp():
        return nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 1024))
    """
)


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    (tmp_path / "mem_models.py").write_text(MODELS)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _inference_truth() -> int:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024)).eval()
    x = torch.randn(64, 1024)
    tracker = MemTracker()
    tracker.track_external(model, x)
    with tracker, torch.no_grad():
        model(x)
    (peak,) = tracker.get_tracker_snapshot("peak").values()
    return peak["Total"]


def test_check_max_memory_of_a_training_step(workdir, capsys):
    code, out, err = cli(capsys, "check", "mem_models.py:mlp", "-i", "64x1024", "--backward",
                         "--max-memory", str(MLP_TRAIN_PEAK), "--format", "json")
    assert code == 0, err
    data = json.loads(out)
    (line,) = data["budget"]["lines"]
    assert (line["name"], line["actual"], line["unit"]) == ("memory", MLP_TRAIN_PEAK, "bytes")
    assert data["memory"]["peak_bytes"] == MLP_TRAIN_PEAK
    code, out, err = cli(capsys, "check", "mem_models.py:mlp", "-i", "64x1024", "--backward",
                         "--max-memory", str(MLP_TRAIN_PEAK - 1))
    assert code == 1 and "memory" in err and "FAIL" in out
    # byte units: 65.3 MiB = 68,471,603 bytes > the peak; 68.4 MB = 68,400,000 < it
    assert cli(capsys, "check", "mem_models.py:mlp", "-i", "64x1024", "--backward", "--max-memory", "65.3MiB")[0] == 0
    assert cli(capsys, "check", "mem_models.py:mlp", "-i", "64x1024", "--backward", "--max-memory", "68.4MB")[0] == 1


def test_check_max_memory_of_inference_matches_memtracker(workdir, capsys):
    code, out, err = cli(capsys, "check", "mem_models.py:mlp", "-i", "64x1024", "--max-memory", "1GB", "--format", "json")
    assert code == 0, err
    assert json.loads(out)["budget"]["lines"][0]["actual"] == _inference_truth()


def test_optimizer_implies_backward_and_adds_its_state(workdir, capsys):
    code, out, err = cli(capsys, "check", "mem_models.py:mlp", "-i", "64x1024", "--optimizer", "adam",
                         "--max-memory", "1GB", "--format", "json")
    assert code == 0, err
    memory = json.loads(out)["memory"]
    assert memory["optimizer"] == "adam" and memory["mode"] == "training step"
    # Adam's two moment buffers (2 x 4 bytes per parameter) live through the whole step
    assert memory["peak_bytes"] >= MLP_TRAIN_PEAK + 2 * 4 * N_PARAMS


def test_count_memory_prints_the_estimate_after_the_flop_table(workdir, capsys):
    code, out, err = cli(capsys, "count", "mem_models.py:mlp", "-i", "64x1024", "--backward", "--memory", "--depth", "1")
    assert code == 0, err
    assert out.index("Total (forward + backward):") < out.index("At peak")
    assert "68,460,552 bytes" in out
    code, out, err = cli(capsys, "count", "mem_models.py:mlp", "-i", "64x1024", "--backward", "--memory", "--format", "json")
    assert code == 0, err
    data = json.loads(out)
    # one contraction is 64 x 1024 x 4096 MACs: two forward, fc2's grad_input and grad_weight, fc1's
    # grad_weight (the input needs no gradient)
    assert data["memory"]["peak_bytes"] == MLP_TRAIN_PEAK and data["macs"] == 5 * 64 * 1024 * 4096


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["count", "mem_models.py:mlp", "-i", "64x1024", "--optimizer", "adam"], "add --memory"),
        (["count", "mem_models.py:mlp", "-i", "64x1024", "--memory", "--format", "csv"], "--memory has no csv form"),
        (["check", "mem_models.py:mlp", "-i", "64x1024"], "--max-memory"),
        (["check", "mem_models.py:mlp", "--max-memory", "12XB"], "'12XB' is not a size"),
        (["check", "mem_models.py:mlp", "--max-memory", "1GB", "--optimizer", "rmsprop"], "invalid choice"),
    ],
)
def test_memory_usage_errors_exit_2(workdir, capsys, argv, fragment):
    code, out, err = cli(capsys, *argv)
    assert code == 2 and out == "" and fragment in err


def test_max_memory_from_pyproject(workdir, capsys):
    (workdir / "pyproject.toml").write_text('[tool.flopcount]\nmax-memory = "1MiB"\n')
    code, out, err = cli(capsys, "check", "mem_models.py:mlp", "-i", "64x1024")
    assert code == 1 and "memory" in err
