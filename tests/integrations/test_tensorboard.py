"""`flopcount count --tensorboard DIR`: the scalars and tables read back with TensorBoard's
own event reader; MACs and parameters against the hand formula of a two-layer MLP."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest

pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from flopcount.cli import main

MODEL = textwrap.dedent(
    """
    from torch import nn
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))
    """
)
B = 4
MACS = B * 16 * 32 + B * 32 * 8
PARAMS = 16 * 32 + 32 + 32 * 8 + 8


def _read(log_dir):
    events = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    scalars = {tag: events.Scalars(tag)[-1].value for tag in events.Tags()["scalars"]}
    texts = {tag: events.Tensors(tag)[-1].tensor_proto.string_val[0].decode() for tag in events.Tags()["tensors"]}
    return scalars, texts


def test_count_writes_scalars_and_tables(tmp_path, monkeypatch, capsys):
    (tmp_path / "models.py").write_text(MODEL)
    monkeypatch.chdir(tmp_path)
    code = main(["count", "models.py:model", "--input", f"{B}x16", "--format", "json", "--quiet", "--tensorboard", "tb"])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    scalars, texts = _read(tmp_path / "tb")
    assert scalars["flopcount/macs"] == MACS and scalars["flopcount/params"] == PARAMS
    assert scalars["flopcount/flops"] == report["flops"]
    assert scalars["flopcount/modules/0"] + scalars["flopcount/modules/1"] + scalars["flopcount/modules/2"] == report["flops"]
    modules, operators = texts["flopcount/modules/text_summary"], texts["flopcount/operators/text_summary"]
    assert modules.startswith("**models.py:model**") and "Linear" in modules
    assert f"| aten::linear | {2 * MACS:,} | {MACS:,} | 2 |" in operators  # 2 FLOPs per MAC


def test_missing_tensorboard_is_one_line_exit_2(tmp_path, monkeypatch, capsys):
    (tmp_path / "models.py").write_text(MODEL)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    code = main(["count", "models.py:model", "--input", f"{B}x16", "--tensorboard", "tb"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "pip install flopcount[tensorboard]" in err
    assert not (tmp_path / "tb").exists()
