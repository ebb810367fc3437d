"""Issue #29, CLI items 12-14, 21, 22: the training step's mode, plan's messages, budgets and
kwargs spelled on the command line, user errors that are not bugs, --timeout. Expected numbers
are derived by hand in the comments."""

from __future__ import annotations

import json
import textwrap

import pytest

from flopcount.cli import main

MODELS = textwrap.dedent(
    """
    import time
    import torch
    from torch import nn

    def bn():
        return nn.Sequential(nn.Linear(16, 8), nn.BatchNorm1d(8))

    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x, scale=1.0, times=1, double=False, name="a"):
            y = self.fc(x)
            for _ in range(times):
                y = y * scale
            if double:
                y = self.fc(y)
            assert name in ("a", "b c"), name
            return y

    class Sleeper(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            time.sleep(60)
            return self.fc(x)

    def slow_factory():
        time.sleep(60)
        return nn.Linear(4, 4)

    class NoParams(nn.Module):
        def forward(self, x):
            return x * 2
    """
)


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    (tmp_path / "models.py").write_text(MODELS)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def cli(capsys, *args: str):
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


# --------------------------------------------------------------------------- 12: train mode

# Linear(16, 8) then BatchNorm1d(8) on a B x 16 input; N = B * 8 elements, G = 8 channels.
# Linear: B*16*8 MACs = 2*B*128 FLOPs (the bias is fused into addmm: free).
# BatchNorm, eval (running stats): normalise 2N + 2G, affine 2N.
# BatchNorm, train (batch stats): + mean and biased variance 4N + 2G (docs/conventions.md).


@pytest.mark.parametrize("batch", [4, 6])
@pytest.mark.parametrize("flags", [["--backward"], ["--optimizer", "sgd"]])
def test_training_step_counts_in_train_mode(workdir, capsys, batch, flags):
    n, g = batch * 8, 8
    linear = 2 * batch * 16 * 8
    eval_forward = linear + (2 * n + 2 * g) + 2 * n
    train_forward = eval_forward + 4 * n + 2 * g
    code, out, err = cli(capsys, "count", "models.py:bn", "-i", f"{batch}x16", *flags, "-f", "json")
    assert code == 0, err
    assert json.loads(out)["by_phase"]["forward"]["flops"] == train_forward
    assert "train() mode" in err
    code, out, err = cli(capsys, "count", "models.py:bn", "-i", f"{batch}x16", *flags, "--eval", "-f", "json")
    assert code == 0, err
    assert json.loads(out)["by_phase"]["forward"]["flops"] == eval_forward
    # an inference count stays in eval mode
    code, out, err = cli(capsys, "count", "models.py:bn", "-i", f"{batch}x16", "-f", "json")
    assert code == 0, err
    assert json.loads(out)["flops"] == eval_forward


def test_eval_without_training_step_is_refused(workdir, capsys):
    code, _, err = cli(capsys, "count", "models.py:bn", "-i", "4x16", "--eval")
    assert code == 2 and "--eval applies to a training step" in err
