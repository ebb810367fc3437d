"""Issue #27, "one place" on the package's face (each test fails before the change):

* the trainer callbacks' modeled part is resolved once, when the callback is made
  (``bench.peak.mfu_part``); ``resolve_peak`` at the start of a run resolved it again;
* ``flopcount check`` reads ``[tool.flopcount]`` once for its budgets, its baseline gate and its
  ENTRY (it parsed the file three times, once per loader);
* no public method or property of ``BenchmarkResult`` / ``StepTimer`` that neither the docs name
  nor flopcount reads (``StepTimer.reset``, ``BenchmarkResult.overhead_per_iter_us`` were such).
"""

from __future__ import annotations

import dataclasses
import re
import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Any, List

import pytest
import tomllib
import torch
from _cli_run import cli
from torch import nn

import flopcount.bench.peak as bench_peak
import flopcount.integrations._rates as rates
from flopcount.bench.result import BenchmarkResult
from flopcount.bench.steps import StepTimer

ROOT = Path(__file__).resolve().parents[2]


def _spy_parts(monkeypatch: pytest.MonkeyPatch) -> List[str]:
    calls: List[str] = []
    real = bench_peak.resolve_part

    def spy(name: str) -> Any:
        calls.append(name)
        return real(name)

    monkeypatch.setattr(bench_peak, "resolve_part", spy)  # the callbacks' on= is checked by bench.peak.mfu_part
    return calls


def test_the_callbacks_resolve_their_part_once(monkeypatch: pytest.MonkeyPatch) -> None:
    from flopcount.integrations.hf import FlopcountCallback

    calls = _spy_parts(monkeypatch)
    callback = FlopcountCallback(on="a100 80gb")
    # NVIDIA A100 datasheet, dense BF16 tensor cores: 312 TFLOP/s (REFERENCES.md)
    peak, note = rates.resolve_peak(torch.device("cpu"), torch.bfloat16, callback.peak_flops, callback.on)
    assert (peak, note) == (pytest.approx(312e12), "")
    assert calls == ["a100 80gb"]


def test_the_lightning_monitor_resolves_its_part_once(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("lightning")
    from flopcount.integrations.lightning import FlopcountMonitor

    calls = _spy_parts(monkeypatch)
    monitor = FlopcountMonitor(on="h100")
    assert monitor.on == "h100"  # as given
    module = nn.Linear(4, 4)
    trainer = SimpleNamespace(precision="bf16-mixed", strategy=SimpleNamespace(root_device=torch.device("cpu")))
    monitor.on_fit_start(trainer, module)
    try:
        # H100 SXM dense BF16: 989.5 TFLOP/s (NVIDIA datasheet, half the "with sparsity" 1979)
        assert monitor._peak == pytest.approx(989.5e12)
    finally:
        monitor.teardown(trainer, module, "fit")
    assert calls == ["h100"]
    assert "flops_per_batch" not in vars(module)  # the module as found


MODEL = textwrap.dedent(
    """
    from torch import nn

    def mlp(width=32):
        return nn.Sequential(nn.Linear(16, width), nn.ReLU(), nn.Linear(width, 8))
    """
)


def test_check_reads_its_config_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "models.py").write_text(MODEL)
    monkeypatch.chdir(tmp_path)
    code, _, err = cli(capsys, "count", "models.py:mlp", "--input", "4x16", "--format", "json", "--output", "base.json", "-q")
    assert code == 0, err
    (tmp_path / "pyproject.toml").write_text(textwrap.dedent(
        """
        [tool.flopcount]
        entry = "models.py:mlp"
        input = ["4x16"]
        baseline = "base.json"
        max-growth = "flops=10%"
        max-macs = "1M"
        """
    ))
    reads: List[Any] = []
    real = tomllib.load
    monkeypatch.setattr(tomllib, "load", lambda fh: reads.append(fh.name) or real(fh))
    code, out, err = cli(capsys, "check")
    assert code == 0, err
    # 4 rows x (16 x 32 + 32 x 8) MACs = 3,072 of a 1M budget; the same model as the baseline
    assert "PASS: all 1 budget(s) met" in out and "PASS: all 1 metric(s)" in out
    assert len(reads) == 1, reads
    # a width of 40 grows the FLOPs by 2 x 4 x 8 x (16 + 8) + 4 x 8 = 1,568 of 6,272: 25 % > 10 %
    reads.clear()
    code, _, err = cli(capsys, "check", "--config", "width=40")
    assert code == 1 and "flops +25.00% > +10%" in err
    assert len(reads) == 1, reads


def test_a_named_config_file_that_is_missing_is_still_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    code, _, err = cli(capsys, "check", "models.py:mlp", "--config-file", "nothere.toml")
    assert code == 2 and err.strip().endswith("config file not found: nothere.toml"), err


def test_every_public_member_of_the_timing_results_is_documented_or_read() -> None:
    docs = "".join(p.read_text() for p in (ROOT / "docs").glob("*.md") if p.name not in ("internals.md", "performance.md"))
    source = "".join(p.read_text() for p in (ROOT / "flopcount").rglob("*.py"))
    unused = []
    for cls in (BenchmarkResult, StepTimer):
        fields = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
        for name in (n for n in vars(cls) if not n.startswith("_") and not n.isupper() and n not in fields):
            if not re.search(rf"\b{name}\b", docs) and not re.search(rf"\.{name}\b", source):
                unused.append(f"{cls.__name__}.{name}")
    assert unused == []
