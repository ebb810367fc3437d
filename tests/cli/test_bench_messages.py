"""What `flopcount bench` tells the user before, during and after timing: the plan (warm-up
count, the floor of timed calls), an estimate of the whole run, progress through the
warm-up, which dimension throughput took as the batch, and how little p90/p99 of a few
samples mean. In-process (main([...])) with small models written to a temp folder."""

from __future__ import annotations

import json
import re
import textwrap

import pytest
from conftest import run_cli as cli

from flopcount.bench.latency import batch_and_source
from flopcount.report.bench import tail_caveat, tail_note

MODELS = textwrap.dedent(
    """
    import time
    import torch
    from torch import nn

    class SeqFirst(nn.Module):  # an LSTM fed (T, B, F): the batch is dim 1
        def __init__(self):
            super().__init__()
            self.lstm = nn.LSTM(16, 8)

        def forward(self, x):
            return self.lstm(x)[0]

    class Sleepy(nn.Module):  # a slow first call on real data (a lazy init), fast after it
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)
            self.cold = True

        def forward(self, x):
            if self.cold and type(x) is torch.Tensor:  # not the count's run on fake tensors
                self.cold = False
                time.sleep(0.4)
            return self.fc(x)

    class Dozy(Sleepy):  # 10 calls take 0.2 s, past a 0.1 s budget
        def forward(self, x):
            time.sleep(0.02)
            return self.fc(x)
    """
)


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    (tmp_path / "bench_models.py").write_text(MODELS)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_iters_and_duration_together_are_refused_before_any_work(workdir, capsys):
    code, out, err = cli(capsys, "bench", "no_such_module:model", "--iters", "5", "--duration", "2")
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "--iters 5 and --duration 2 exclude each other" in err


@pytest.mark.serial  # real sleeps timed by the real clock
def test_plan_estimate_and_warmup_progress_are_on_stderr(workdir, capsys):
    code, out, err = cli(capsys, "bench", "bench_models.py:Sleepy", "-i", "2x4", "--warmup", "4", "--iters", "2")
    assert code == 0, err
    assert "4 untimed warm-up calls, then exactly 2 timed calls" in err
    assert "warm-up 1/4" in err and "warm-up 4/4" in err
    # the first timed-run call sleeps 0.4 s, so the estimate for 4 + 2 calls is at least 2.4 s
    expect = re.search(r"the first call took ([\d.]+) (m?s): expect about ([\d.]+) s in all \(4 warm-up \+ 2 timed calls\)", err)
    assert expect, err
    first, total = float(expect.group(1)) * (1e-3 if expect.group(2) == "ms" else 1), float(expect.group(3))
    assert first >= 0.4 and total == pytest.approx(6 * first, rel=0.1)
    assert "warm-up 1/4" not in out  # progress never reaches stdout


@pytest.mark.serial  # real sleeps timed by the real clock
def test_duration_plan_names_the_floor(workdir, capsys):
    code, _, err = cli(capsys, "bench", "bench_models.py:Dozy", "-i", "2x4", "--warmup", "1", "--duration", "0.1")
    assert code == 0, err
    assert "1 untimed warm-up calls, then timed calls until 0.1 s has passed and at least 10 ran" in err
    assert "timed 10 calls" in err  # the floor, not the 0.1 s, decided


def test_batch_size_flag_and_the_dimension_named(workdir, capsys):
    code, out, err = cli(capsys, "bench", "bench_models.py:SeqFirst", "-i", "10x4x16", "--warmup", "1", "--iters", "10",
                         "--format", "json")
    assert code == 0, err
    bench = json.loads(out)["benchmark"]
    assert (bench["batch_size"], bench["batch_source"]) == (10, "dim 0 of Tensor[10, 4, 16]")
    assert "batch_first=False" in err and "--batch-size" in err  # the LSTM reads dim 1 as its batch
    code, out, err = cli(capsys, "bench", "bench_models.py:SeqFirst", "-i", "10x4x16", "--warmup", "1", "--iters", "10",
                         "--batch-size", "4", "--format", "json")
    assert code == 0, err
    bench = json.loads(out)["benchmark"]
    assert (bench["batch_size"], bench["batch_source"]) == (4, "as given")
    assert bench["throughput"] == pytest.approx(4 / bench["median_s"])
    assert "batch_first" not in err


def test_table_shows_batch_dimension_and_tail_caveats(workdir, capsys):
    code, out, _ = cli(capsys, "bench", "bench_models.py:SeqFirst", "-i", "10x4x16", "--warmup", "1", "--iters", "10")
    assert code == 0
    rows = {line.split()[0]: line for line in out.splitlines() if line.strip()}
    assert "(batch 10: dim 0 of Tensor[10, 4, 16])" in rows["throughput"]
    assert "only 10 samples" in rows["p99"] and "rough: 10 samples" in rows["p90"]


def test_tail_notes_follow_samples_above_the_percentile():
    # k = n * (1 - p/100) samples lie above the p-th percentile: < 1 is the max, < 10 is rough
    assert "about the max" in tail_note(10, 99) and "about the max" in tail_note(5, 90)
    assert "rough" in tail_note(10, 90) and "rough" in tail_note(500, 99)
    assert tail_note(100, 90) == "" and tail_note(1000, 99) == ""
    assert "p90" in tail_caveat(10) and "p99" in tail_caveat(200) and tail_caveat(1000) == ""


def test_batch_and_source_reads_the_first_tensor():
    import torch

    assert batch_and_source((torch.zeros(7, 3), torch.zeros(2)), None, None) == (7, "dim 0 of Tensor[7, 3]")
    assert batch_and_source(torch.zeros(()), None, None) == (1, "the first input is a scalar")
    assert batch_and_source((), {"ids": torch.zeros(3, 5)}, None)[0] == 3
    assert batch_and_source(torch.zeros(7, 3), None, 2) == (2, "as given")
