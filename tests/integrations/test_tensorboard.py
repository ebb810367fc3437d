"""`flopcount count --tensorboard DIR`: the scalars and tables read back with TensorBoard's
own event reader; MACs and parameters against the hand formula of a two-layer MLP."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest

pytest.importorskip("tensorboard")  # tensorboard's own package only: its event reader is imported where read

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
    # imported here, not at collection, where it cost each pytest-xdist worker ~0.1-0.2 s of CPU
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

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


def test_profile_writes_scalars_table_and_the_plugins_trace(tmp_path, monkeypatch, capsys):
    """`flopcount profile --tensorboard DIR` (#23): the step's FLOPs (hand formula), its time and
    the top operators' time read back with TensorBoard's own reader; the Chrome trace lands where
    the PyTorch Profiler plugin looks (``*.pt.trace.json``), each Linear call with its FLOPs."""
    (tmp_path / "models.py").write_text(MODEL)
    monkeypatch.chdir(tmp_path)
    code = main(["profile", "models.py:model", "--input", f"{B}x16", "--format", "json", "--quiet",
                 "--steps", "2", "--warmup", "1", "--roofs", "1T,10G", "--tensorboard", "tb"])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    scalars, texts = _read(tmp_path / "tb")
    relu = B * 32  # one FLOP per element
    assert scalars["flopcount/profile/flops"] == 2 * MACS + relu
    assert scalars["flopcount/profile/step_ms"] == pytest.approx(report["total_time_s"] * 1e3, rel=1e-6)
    linear_ms = sum(row["time_s"] for row in report["by_operator"] if row["name"] == "aten::linear") * 1e3
    assert scalars["flopcount/profile/op_ms/aten::linear"] == pytest.approx(linear_ms, rel=1e-6)
    assert "aten::linear" in texts["flopcount/profile/operators/text_summary"]
    (trace,) = (tmp_path / "tb" / "profile").glob("*.pt.trace.json")
    events = json.loads(trace.read_text())["traceEvents"]
    linear_flops = sorted(e["args"]["flops"] for e in events if e.get("name") == "aten::linear" and "flops" in e.get("args", {}))
    assert linear_flops == sorted([2 * B * 16 * 32, 2 * B * 32 * 8] * 2)  # two steps, two layers each
