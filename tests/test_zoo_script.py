"""benchmarks/zoo.py (the coverage zoo): its checks must be able to fail, and its rows
must carry the numbers the docs quote. Oracles are hand-derived formulas."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

BENCH = next(p / "benchmarks" for p in Path(__file__).resolve().parents if (p / "benchmarks" / "zoo.py").exists())
sys.path.insert(0, str(BENCH))

import zoo  # noqa: E402
import zoo_nn  # noqa: E402


def test_snapshot_sees_a_running_stat_update_and_a_changed_input() -> None:
    model, x = nn.BatchNorm1d(3).train(), torch.randn(4, 3)
    before = zoo.snapshot(model, (x,))
    model(x)  # a plain train-mode forward updates running_mean/var
    changed = zoo.changes(before, zoo.snapshot(model, (x,)))
    assert any(c.startswith("state_dict (num_batches_tracked, running_mean") for c in changed)
    before = zoo.snapshot(model, (x,))
    x.add_(1.0)
    model.eval()
    assert zoo.changes(before, zoo.snapshot(model, (x,))) == ["training flags", "inputs"]


def test_snapshot_sees_a_lazy_module_materialised() -> None:
    model = nn.LazyLinear(2)
    before = zoo.snapshot(model, ())
    model(torch.randn(3, 4))
    changed = zoo.changes(before, zoo.snapshot(model, ()))
    assert any("LazyLinear→Linear" in c for c in changed)


def test_nc_is_non_contiguous_with_the_asked_shape() -> None:
    x = zoo_nn.nc(2, 4, 6)
    assert x.shape == (2, 4, 6) and not x.is_contiguous()


def test_linear_and_conv_rows_against_hand_formulas(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "rows.json"
    assert zoo.main(["--only", "nn", "--match", "Conv2d", "--limit", "1", "--json", str(out)]) == 0
    assert zoo.main(["--only", "nn", "--match", "Linear(no bias)", "--json", str(tmp_path / "lin.json")]) == 0
    conv = json.loads(out.read_text())["rows"][0]
    linear = json.loads((tmp_path / "lin.json").read_text())["rows"][0]
    # Conv2d(4, 6, 3) on 2x4x8x8: output 2x6x6x6, each output element 4*3*3 MACs
    assert conv["name"] == "Conv2d" and conv["results"]["dispatch"]["macs"] == 2 * 6 * 6 * 6 * 4 * 9
    assert conv["vs_ref"] == "=" and conv["jit_vs_dispatch"] == "=" and conv["meta_vs_cpu"] == "="
    assert not conv["changed"] and not conv["errors"]
    # Linear(6, 5, bias=False) on a non-contiguous 2x4x6: 8 rows x 6 x 5 MACs, 2 FLOPs each, under every tracer
    for tracer in ("auto", "jit", "dispatch", "meta"):
        assert linear["results"][tracer]["macs"] == 8 * 6 * 5
        assert linear["results"][tracer]["flops"] == 2 * 8 * 6 * 5
    report = capsys.readouterr().out
    assert "| Conv2d | 2×4×8×8 nc |" in report and "## Summary" in report
    assert zoo.main(["--from-json", str(out), str(tmp_path / "lin.json")]) == 0
    assert "- models: 2 (nn 2)" in capsys.readouterr().out


def test_every_nn_class_has_a_row_or_a_reason() -> None:
    listed = {c.name.split("(")[0].split(" ")[0] for c in zoo_nn.cases()}
    missing = zoo_nn.unlisted()
    assert set(missing) == set(zoo_nn.SKIPPED)  # nothing falls through as "no spec yet"
    assert {"Linear", "Conv2d", "LSTM", "MultiheadAttention", "Transformer", "CTCLoss"} <= listed


def test_transformers_analytical_counts_match_the_references_formula() -> None:
    pytest.importorskip("transformers")
    import zoo_hf

    counts = zoo_hf._analytic()
    b, t, d, layers, vocab = zoo_hf.B, zoo_hf.T, zoo_hf.D, zoo_hf.L, zoo_hf.V
    # GPT-2: 12 d^2 per token and layer (c_attn 3d^2, c_proj d^2, MLP 8d^2), attention 2 T^2 d, tied LM head
    assert counts["gpt2"] == b * (layers * (t * 12 * d * d + 2 * t * t * d) + t * d * vocab)
