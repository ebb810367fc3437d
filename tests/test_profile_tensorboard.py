"""The exported trace in the real client: torch-tb-profiler's own loader (the TensorBoard
profiler plugin) reads a flopcount trace, lists its ops in the operator view, and the trace
it serves to its trace viewer carries each op's FLOPs in ``args``. Skipped without the plugin
(it runs in a venv that has it: docs/profile.md)."""

from __future__ import annotations

import gzip
import json

import pytest
import torch
from torch import nn

import flopcount
from flopcount.devices.roofline import Roofs

tb_io = pytest.importorskip("torch_tb_profiler.io")
loader = pytest.importorskip("torch_tb_profiler.profiler.loader")


def test_tensorboard_plugin_loads_a_flopcount_trace(tmp_path):
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 14 * 14, 10)).eval()
    x = torch.randn(4, 3, 16, 16)
    result = flopcount.profile(model, x, roofs=Roofs({"float32": 1e11}, 1e10), warmup=1, steps=2)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    result.export_chrome_trace(str(run_dir / "worker0.pt.trace.json"))

    run = loader.RunLoader("flopcount", str(run_dir), tb_io.Cache(str(tmp_path / "cache"))).load()
    (profile,) = run.get_profiles()
    ops = {row["name"]: row for row in profile.operation_table_by_name["data"]}
    assert ops["aten::conv2d"]["calls"] == ops["aten::linear"]["calls"] == 2  # one per profiled step

    served = profile.trace_file_path  # what the plugin's trace viewer shows
    opener = gzip.open if str(served).endswith(".gz") else open
    with opener(served, "rt") as fh:
        events = json.load(fh)["traceEvents"]
    flops = {e["name"]: e["args"]["flops"] for e in events if "flops" in e.get("args", {})}
    assert flops["aten::conv2d"] == 2 * 4 * 8 * 14 * 14 * 3 * 3 * 3  # MACs: out elements x C_in x k x k
    assert flops["aten::linear"] == 2 * 4 * 10 * 8 * 14 * 14
