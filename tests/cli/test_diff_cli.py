"""flopcount diff and check --baseline, end to end in-process: exit codes, per-side options,
formats. Expected deltas are derived by hand from the layer shapes."""

from __future__ import annotations

import csv
import io
import json
import textwrap

import pytest
from _cli_run import cli

N, IN, OUT = 4, 16, 8

MODELS = textwrap.dedent(
    """
    from torch import nn

    class MLP(nn.Module):
        def __init__(self, d_hidden=32, extra=False):
            super().__init__()
            self.fc1 = nn.Linear(16, d_hidden)
            self.act = nn.ReLU()
            self.fc2 = nn.Linear(d_hidden, 8)
            if extra:
                self.head = nn.Linear(8, 8)

        def forward(self, x):
            y = self.fc2(self.act(self.fc1(x)))
            return self.head(y) if hasattr(self, "head") else y

    def mlp(d_hidden=32, extra=False):
        return MLP(d_hidden=d_hidden, extra=extra)
    """
)


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    (tmp_path / "models.py").write_text(MODELS)
    monkeypatch.chdir(tmp_path)
    return tmp_path




def _baseline(capsys, path: str = "base.json", *extra: str) -> None:
    code, _, err = cli(capsys, "count", "models.py:mlp", "--input", f"{N}x{IN}", "--format", "json", "--output", path, "-q", *extra)
    assert code == 0, err


def test_diff_of_two_configs_of_one_entry_per_side(workdir, capsys):
    code, out, err = cli(capsys, "diff", "models.py:mlp", "models.py:mlp", "--input", f"{N}x{IN}",
                         "--a-config", "d_hidden=16", "--b-config", "d_hidden=48", "--format", "json")
    assert code == 0, err
    data = json.loads(out)
    dh = 48 - 16
    assert data["totals"]["macs"]["delta"] == N * dh * (IN + OUT)  # both layers widen
    assert data["totals"]["params"]["delta"] == (IN + 1) * dh + dh * OUT
    assert data["a"] == "models.py:mlp [d_hidden=16]" and data["b"] == "models.py:mlp [d_hidden=48]"
    assert data["totals"]["macs"]["relative"] == pytest.approx(dh / 16)  # MACs are linear in the width


def test_side_options_win_over_shared_ones(workdir, capsys):
    code, out, err = cli(capsys, "diff", "models.py:mlp", "models.py:mlp", "--input", f"{N}x{IN}", "--config", "d_hidden=16",
                         "--b-config", "d_hidden=20", "--b-input", f"{2 * N}x{IN}", "--format", "json")
    assert code == 0, err
    data = json.loads(out)
    # A: N rows x width 16; B: 2N rows x width 20
    assert data["totals"]["macs"]["a"] == N * 16 * (IN + OUT) and data["totals"]["macs"]["b"] == 2 * N * 20 * (IN + OUT)


def test_diff_a_saved_report_against_an_entry_with_added_module(workdir, capsys):
    _baseline(capsys)
    code, out, err = cli(capsys, "diff", "base.json", "models.py:mlp", "--input", f"{N}x{IN}", "--config", "extra=True", "--format", "csv")
    assert code == 0, err
    rows = {(r["kind"], r["name"]): r for r in csv.DictReader(io.StringIO(out))}
    head = rows[("module", "head")]
    assert head["status"] == "added" and int(head["macs_b"]) == N * OUT * OUT and head["macs_a"] == ""
    assert int(rows[("total", "")]["params_delta"]) == OUT * OUT + OUT


def test_markdown_is_a_pull_request_comment(workdir, capsys):
    _baseline(capsys)
    code, out, err = cli(capsys, "diff", "base.json", "models.py:mlp", "--input", f"{N}x{IN}", "--config", "d_hidden=64",
                         "--format", "markdown", "--top", "2")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == "### flopcount diff: `base.json (models.py:mlp)` → `models.py:mlp [d_hidden=64]`"
    assert lines[2].startswith("**FLOPs +") and "modules: 4 changed, 0 added, 0 removed" in lines[2]  # the model, fc1, act, fc2
    top = out.split("#### Top 2 module changes")[1].split("<details>")[0]
    rows = [line for line in top.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert [row.split("|")[1].strip() for row in rows] == ["fc1", "fc2"]  # fc1: N x 16 x 32 more MACs; fc2: N x 32 x 8
    assert out.count("<details><summary>") == 2


def test_diff_refuses_entry_options_on_saved_reports(workdir, capsys):
    _baseline(capsys, "a.json")
    _baseline(capsys, "b.json")
    code, out, err = cli(capsys, "diff", "a.json", "b.json", "--a-config", "d_hidden=4")
    assert code == 2 and "--a-config: A is a saved report (a.json)" in err and "Traceback" not in err
    code, out, err = cli(capsys, "diff", "a.json", "b.json", "--input", "2x16")
    assert code == 2 and "--input: A and B are both saved reports" in err
    code, out, err = cli(capsys, "diff", "a.json", "b.json", "--depth", "0")
    assert code == 0 and "no cost change" in out
    code, out, err = cli(capsys, "diff", "a.json", "missing.json")
    assert code == 2 and "missing.json: no such file" in err


def test_diff_of_a_newer_report_is_refused(workdir, capsys):
    _baseline(capsys)
    data = json.loads((workdir / "base.json").read_text())
    data["schema_version"] = 99
    (workdir / "new.json").write_text(json.dumps(data))
    code, out, err = cli(capsys, "diff", "new.json", "base.json")
    assert code == 2 and "schema_version 99 is newer" in err and len(err.strip().splitlines()) == 1


# --------------------------------------------------------------------------- check --baseline


def test_check_baseline_exit_codes(workdir, capsys):
    _baseline(capsys)
    code, out, err = cli(capsys, "check", "models.py:mlp", "--input", f"{N}x{IN}", "--baseline", "base.json")
    assert code == 0, err
    assert "PASS: all 3 metric(s) within the allowed growth" in out  # default: params, flops, macs may not grow
    code, out, err = cli(capsys, "check", "models.py:mlp", "--input", f"{N}x{IN}", "--config", "d_hidden=33", "--baseline", "base.json",
                         "--max-growth", "flops=2%,params=0")
    # width 32 -> 33: MACs N x 32 x (IN + OUT) = 3072 grow by N x (IN + OUT) = 96; FLOPs = 2 x MACs + the
    # ReLU's N x width: 6272 grow by 192 + 4 = 196 (+3.125 %); params by IN + 1 + OUT = 25
    assert code == 1
    assert "flops +3.12% > +2%" in err and "params +" in err
    assert f"most in fc1 (Linear) +{2 * N * IN}" in err  # 2 FLOPs per MAC
    code, out, err = cli(capsys, "check", "models.py:mlp", "--input", f"{N}x{IN}", "--config", "d_hidden=33", "--baseline", "base.json",
                         "--max-growth", "flops=3.125%,params=25")  # exactly at both allowances
    assert code == 0, err


def test_check_baseline_incomplete_side_exits_3_and_certain_params_failure_exits_1(workdir, capsys):
    _baseline(capsys)
    data = json.loads((workdir / "base.json").read_text())
    data.update(unsupported_ops={"aten::mystery": {"count": 1, "modules": ["fc1"]}}, complete=False,
                incomplete_reasons=["aten::mystery ran 1x without a handler"])
    (workdir / "short.json").write_text(json.dumps(data))
    code, out, err = cli(capsys, "check", "models.py:mlp", "--input", f"{N}x{IN}", "--baseline", "short.json", "--max-growth", "flops=0")
    assert code == 3 and "INCOMPLETE" in err
    code, out, err = cli(capsys, "check", "models.py:mlp", "--input", f"{N}x{IN}", "--config", "d_hidden=40", "--baseline", "short.json",
                         "--max-growth", "flops=0,params=0")
    assert code == 1 and "params" in err


def test_check_baseline_bad_input_is_one_line_exit_2(workdir, capsys):
    _baseline(capsys)
    for args, message in [
        (["--baseline", "nope.json"], "--baseline nope.json: no such file"),
        (["--baseline", "base.json", "--max-growth", "speed=2%"], "unknown metric 'speed'"),
        (["--max-growth", "flops=2%"], "--max-growth needs --baseline"),
        (["--baseline", "base.json", "--max-growth", "memory=5%"], "has no peak memory"),
        (["--baseline", "base.json", "--backward"], None),
    ]:
        code, out, err = cli(capsys, "check", "models.py:mlp", "--input", f"{N}x{IN}", *args)
        if message is None:
            continue
        assert code == 2, (args, err)
        assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    _baseline(capsys, "backward.json", "--backward")
    code, out, err = cli(capsys, "check", "models.py:mlp", "--input", f"{N}x{IN}", "--baseline", "backward.json")
    assert code == 2 and "counts forward + backward, check counts forward" in err


def test_check_baseline_memory_allowance(workdir, capsys):
    _baseline(capsys, "base.json", "--memory")
    code, out, err = cli(capsys, "check", "models.py:mlp", "--input", f"{N}x{IN}", "--baseline", "base.json",
                         "--max-growth", "memory=0", "--format", "json")
    assert code == 0, err
    data = json.loads(out)
    (line,) = data["baseline"]["lines"]
    assert line["metric"] == "memory" and line["baseline"] == line["current"] == data["memory"]["peak_bytes"]


def test_check_reads_entry_baseline_and_allowances_from_pyproject(workdir, capsys):
    _baseline(capsys)
    (workdir / "pyproject.toml").write_text(textwrap.dedent(
        f"""
        [tool.flopcount]
        entry = "models.py:mlp"
        input = ["{N}x{IN}"]
        baseline = "base.json"
        max-growth = "flops=10%,params=30"
        max-params = "1M"
        """
    ))
    code, out, err = cli(capsys, "check")
    assert code == 0, err
    assert "PASS: all 1 budget(s) met" in out and "PASS: all 2 metric(s)" in out
    # width +8: FLOPs grow by 2 x N x 8 x (IN + OUT) + N x 8 = 1568 of 6272 = 25 %
    code, out, err = cli(capsys, "check", "--config", "d_hidden=40")
    assert code == 1 and "flops +25.00% > +10%" in err
    (workdir / "pyproject.toml").write_text('[tool.flopcount]\nbaseline = "base.json"\nmax-growth = { flops = "30%" }\n')
    code, out, err = cli(capsys, "check", "models.py:mlp", "--input", f"{N}x{IN}", "--config", "d_hidden=40", "--format", "markdown")
    assert code == 0, err
    assert out.startswith("### flopcount check: PASS") and "#### Growth against the baseline" in out
    code, out, err = cli(capsys, "check")
    assert code == 2 and "no ENTRY" in err


def test_diff_of_two_hf_configs_on_meta_is_one_layer(capsys):
    pytest.importorskip("transformers")
    h, inter, t = 64, 128, 8
    shared = ["--config", f"hidden_size={h}", "--config", f"intermediate_size={inter}", "--config", "num_attention_heads=4",
              "--config", "num_key_value_heads=4", "--config", "vocab_size=100"]
    code, out, err = cli(capsys, "diff", "hf:llama", "hf:llama", "--device", "meta", "--input", f"1x{t}:int64", *shared,
                         "--a-config", "num_hidden_layers=1", "--b-config", "num_hidden_layers=2", "--format", "json")
    assert code == 0, err
    data = json.loads(out)
    # one decoder layer: q, k, v, o (h x h each, no bias), gate/up/down (h x inter each), two RMSNorm weights
    assert data["totals"]["params"]["delta"] == 4 * h * h + 3 * h * inter + 2 * h
    # its MACs: every weight once per token, plus attention QK^T and AV: 2 x T^2 x h (docs/REFERENCES)
    assert data["totals"]["macs"]["delta"] == t * (4 * h * h + 3 * h * inter) + 2 * t * t * h
    added = [m for m in data["modules"] if m["status"] == "added"]
    assert added[0]["name"] == "model.layers.1" and added[0]["type"] == "LlamaDecoderLayer"


def test_peak_memory_and_latency_rows_come_from_the_reports_that_hold_them(workdir, capsys):
    for name, width in (("a", 32), ("b", 64)):
        _baseline(capsys, f"{name}_mem.json", "--memory", "--config", f"d_hidden={width}")
        code, _, err = cli(capsys, "bench", "models.py:mlp", "--input", f"{N}x{IN}", "--config", f"d_hidden={width}", "--iters", "3",
                           "--warmup", "0", "--format", "json", "--output", f"{name}_bench.json", "-q")
        assert code == 0, err
    peaks = [json.loads((workdir / f"{n}_mem.json").read_text())["memory"]["peak_bytes"] for n in "ab"]
    medians = [json.loads((workdir / f"{n}_bench.json").read_text())["benchmark"]["median_s"] for n in "ab"]
    code, out, err = cli(capsys, "diff", "a_mem.json", "b_mem.json", "--format", "json")
    data = json.loads(out)
    assert data["metrics"] == ["params", "macs", "flops", "bytes", "peak_memory"]  # no latency in count reports
    assert data["totals"]["peak_memory"]["delta"] == peaks[1] - peaks[0]
    code, out, err = cli(capsys, "diff", "a_bench.json", "b_bench.json", "--format", "json")
    data = json.loads(out)
    assert data["metrics"][-1] == "latency"
    assert data["totals"]["latency"]["delta"] == pytest.approx(medians[1] - medians[0])  # seconds
    code, out, err = cli(capsys, "diff", "a_mem.json", "b_bench.json", "--format", "json")
    assert json.loads(out)["metrics"] == ["params", "macs", "flops", "bytes"]  # only what both sides hold
    # an ENTRY diff with --memory estimates both peaks: the same figures as count --memory
    code, out, err = cli(capsys, "diff", "models.py:mlp", "models.py:mlp", "--input", f"{N}x{IN}", "--a-config", "d_hidden=32",
                         "--b-config", "d_hidden=64", "--memory", "--format", "json")
    assert code == 0, err
    assert json.loads(out)["totals"]["peak_memory"] == {"a": peaks[0], "b": peaks[1], "delta": peaks[1] - peaks[0],
                                                        "relative": (peaks[1] - peaks[0]) / peaks[0]}


def test_a_bare_amount_under_one_part_per_million_is_remarked_on(workdir, capsys):
    """``flops=6`` is 6 FLOPs (docs/ci.md), which is most likely a percentage written without %:
    check says so where the amount is under one part per million of the baseline (branch leftfix)."""
    batch = 4096
    # FLOPs = 2 x MACs + the ReLU's: 2 x batch x (IN x 32 + 32 x OUT) + batch x 32
    flops = 2 * batch * (IN * 32 + 32 * OUT) + batch * 32
    assert flops == 6_422_528  # one part per million: 6.42 FLOPs
    code, _, err = cli(capsys, "count", "models.py:mlp", "--input", f"{batch}x{IN}", "--format", "json", "--output", "big.json", "-q")
    assert code == 0, err
    check = ("check", "models.py:mlp", "--input", f"{batch}x{IN}", "--baseline", "big.json", "-q")
    said = (f"the flops allowance +6 is an amount, 6 FLOPs, under one part per million of the baseline's {flops:,}; "
            "a percentage is written with %: flops=N%")
    code, out, err = cli(capsys, *check, "--max-growth", "flops=6,params=0")
    assert code == 0, err  # the documented meaning and exit code are kept
    assert said in out.splitlines()
    assert "params" not in "".join(line for line in out.splitlines() if "part per million" in line)  # 0: no growth, meant
    code, out, err = cli(capsys, *check, "--max-growth", "flops=7")  # 7 >= 6.42: no remark
    assert code == 0, err
    assert "part per million" not in out
    code, out, err = cli(capsys, *check, "--max-growth", "flops=6", "--format", "json")
    assert code == 0, err
    assert json.loads(out)["baseline"]["notes"] == [said]
    code, out, err = cli(capsys, *check, "--max-growth", "flops=6", "--format", "markdown")
    assert code == 0, err
    assert "under one part per million of the baseline" in out
