"""``flopcount roofs``: a datasheet part's roofs (figures from its datasheet), this machine's
from the cache with when and how they were measured, and the usage errors."""

from __future__ import annotations

import json

import pytest
from conftest import run_cli as cli

from flopcount.devices import MemoryLevel, Roofs
from flopcount.devices.measured import remember_roofs


def test_a_parts_roofs_as_json(capsys):
    code, out, _ = cli(capsys, "roofs", "H100 NVL", "--format", "json")
    assert code == 0
    data = json.loads(out)
    # H100 datasheet, NVL: 3.9 TB/s, BF16 1671 TFLOP/s with sparsity -> 835.5 dense, 94 GB
    assert data["device"] == "H100 NVL" and data["bandwidth"] == 3.9e12
    assert data["peak_flops"]["bfloat16"] == pytest.approx(835.5e12)
    assert data["math"] == {"conv": "tfloat32"} and data["details"]["memory_bytes"] == 94e9
    code, out, _ = cli(capsys, "roofs", "a100", "--matmul-tf32", "--format", "json")
    assert json.loads(out)["math"] == {"conv": "tfloat32", "matmul": "tfloat32"}


def test_this_machines_roofs_say_when_and_how(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    remember_roofs(Roofs({"float32": 2e11}, 1e10, "fake cpu", "measured",
                         {"measured_at": "2026-11-26T13:00:00Z", "how": "a test's seed"}, (MemoryLevel("L2", 1e6, 1e11),)))
    code, out, _ = cli(capsys, "roofs")
    assert code == 0
    assert "measured (cached; measured 2026-11-26T13:00:00Z, a test's seed)" in out
    assert "200 GFLOP/s" in out and "100 GB/s" in out and "10 GB/s" in out


@pytest.mark.parametrize(
    "argv, words",
    [
        (("roofs", "tpu9"), "unknown part 'tpu9'; known parts: H100 SXM"),
        (("roofs", "h100", "--remeasure"), "--remeasure measures this machine"),
        (("roofs", "--matmul-tf32"), "datasheet part's math modes"),
    ],
)
def test_usage_errors(capsys, argv, words):
    code, _, err = cli(capsys, *argv)
    assert code == 2 and words in err and "Traceback" not in err
