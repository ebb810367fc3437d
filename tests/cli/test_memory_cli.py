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
    import torch
    from torch import nn

    def mlp():
        return nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 1024))

    if not hasattr(torch.ops.flopcount_memcli_test, "mystery"):
        torch.library.define("flopcount_memcli_test::mystery", "(Tensor x) -> Tensor")
        torch.library.impl("flopcount_memcli_test::mystery", "CompositeExplicitAutograd")(lambda x: x * 2)
        torch.library.register_fake("flopcount_memcli_test::mystery")(lambda x: torch.empty_like(x))

    class Unhandled(nn.Module):
        # an op no handler knows: the FLOPs count is incomplete, the memory estimate is not
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(1024, 1024)

        def forward(self, x):
            return torch.ops.flopcount_memcli_test.mystery(self.fc(x))

    def unhandled():
        return Unhandled()
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


def test_check_says_what_the_peak_includes(workdir, capsys):
    # issue #20.4: the check table names what its memory peak holds: weights, gradients, optimizer
    # state, activations. Oracle: fp32 bytes of the MLP's weights and gradients (4 per parameter).
    from flopcount.units import format_bytes

    code, out, err = cli(capsys, "check", "mem_models.py:mlp", "-i", "64x1024", "--optimizer", "adam",
                         "--max-memory", "1GB")
    assert code == 0, err
    (line,) = [text for text in out.splitlines() if text.startswith("memory: peak")]
    assert "of a training step (adam), reached in the optimizer step" in line
    assert f"weights {format_bytes(4 * N_PARAMS)} + gradients {format_bytes(4 * N_PARAMS)} + optimizer state" in line
    assert "activations" in line
    code, out, err = cli(capsys, "check", "mem_models.py:mlp", "-i", "64x1024", "--max-memory", "1GB", "--format", "markdown")
    assert code == 0, err
    assert f"of an inference step, reached in the forward = weights {format_bytes(4 * N_PARAMS)} + gradients 0 B" in out


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


def test_a_memory_verdict_does_not_rest_on_the_flop_count(workdir, capsys):
    # issue #20.4: an op without a handler makes the FLOPs count incomplete; a --max-memory check
    # rests on the memory estimate alone: its verdict says no "(on an incomplete count)" (the
    # count's own reasons are still listed below it, as the count's diagnostics)
    code, out, err = cli(capsys, "check", "mem_models.py:unhandled", "-i", "64x1024", "--max-memory", "1GB",
                         "--format", "json")
    assert code == 0, err
    budget = json.loads(out)["budget"]
    assert budget["status"] == "PASS" and budget["complete"] is True and budget["incomplete_reasons"] == []
    code, out, err = cli(capsys, "check", "mem_models.py:unhandled", "-i", "64x1024", "--max-memory", "1GB")
    assert code == 0, err
    assert "PASS: all 1 budget(s) met\n" in out and "on an incomplete count" not in out
    # with a FLOPs budget beside it the count's completeness matters again
    code, out, err = cli(capsys, "check", "mem_models.py:unhandled", "-i", "64x1024", "--max-memory", "1GB",
                         "--max-flops", "1T")
    assert code == 3 and "INCOMPLETE" in out and "mystery" in out


def test_count_optimizer_counts_the_training_step_it_estimates(workdir, capsys):
    # issue #20.4: forward + backward + one Adam step, beside the training-step peak
    code, out, err = cli(capsys, "count", "mem_models.py:mlp", "-i", "4x1024", "--optimizer", "adam", "--memory",
                         "--format", "json")
    assert code == 0, err
    data = json.loads(out)
    phases = {phase: v["flops"] for phase, v in data["by_phase"].items()}
    assert list(phases) == ["forward", "backward", "optimizer"]
    # Adam: 11 FLOPs per parameter element + 1 per tensor (its step counter), 4 tensors
    assert phases["optimizer"] == 11 * N_PARAMS + 4
    # forward: two linears, 2 x 4 x 1024 x 4096 MACs, plus the ReLU's 4 x 4096 FLOPs
    assert phases["forward"] == 2 * (2 * 4 * 1024 * 4096) + 4 * 4096
    assert data["memory"]["mode"] == "training step" and data["memory"]["optimizer"] == "adam"
    code, out, err = cli(capsys, "count", "mem_models.py:mlp", "-i", "4x1024", "--optimizer", "sgd")
    assert code == 0, err
    assert "Total (forward + backward + optimizer):" in out and "FLOPs (fwd+bwd+opt)" in out


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["count", "mem_models.py:mlp", "-i", "64x1024", "--optimizer", "lion"], "invalid choice"),
        (["count", "mem_models.py:mlp", "-i", "1x8:int64", "--generate", "2", "--optimizer", "adam"], "drop --backward"),
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
