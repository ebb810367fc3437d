"""The CLI's roofline wiring: ``profile``, ``count --on`` and ``check --max-latency
--on``. Oracles: bounds computed by hand from the T4 datasheet figures (8.1 TFLOP/s
float32, 320 GB/s) for a Linear, and count_flops for the profile's FLOPs."""

from __future__ import annotations

import csv
import io
import json
import textwrap

import pytest
from conftest import run_cli as cli

MODELS = textwrap.dedent(
    """
    from torch import nn

    def mlp():
        return nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 64))
    """
)
# Linear(256->512) and Linear(512->64) on a 32x256 input, float32
FLOPS = 2 * 32 * 256 * 512 + 32 * 512 + 2 * 32 * 512 * 64  # the ReLU: one FLOP per element
L1_BYTES = (32 * 256 + 512 * 256 + 512 + 32 * 512) * 4
RELU_BYTES = (32 * 512 + 32 * 512) * 4
L2_BYTES = (32 * 512 + 64 * 512 + 64 + 32 * 64) * 4
# Every op's working set (at most L1_BYTES = 624,640) fits the T4's 4 MB L2, whose bandwidth
# NVIDIA does not publish, so no memory term is claimed: the eager bound is the FLOPs at the
# FP32 peak. The any-implementation bound is the same here: max(FLOPS / 8.1e12, unavoidable
# bytes in L2 -> 0).
T4_BOUND_S = sum(
    max(flops / 8.1e12, 0.0 * moved)
    for flops, moved in ((2 * 32 * 256 * 512, L1_BYTES), (32 * 512, RELU_BYTES), (2 * 32 * 512 * 64, L2_BYTES))
)


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    (tmp_path / "prof_models.py").write_text(MODELS)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_count_predict_json(workdir, capsys):
    code, out, _ = cli(capsys, "count", "prof_models.py:mlp", "-i", "32x256", "--on", "t4", "--format", "json", "-q")
    assert code == 0
    data = json.loads(out)
    assert data["predict"]["latency_s"] == pytest.approx(T4_BOUND_S)
    assert data["predict"]["roofs"]["device"] == "T4"


@pytest.mark.parametrize(
    "budget, code, word",
    [
        (f"{T4_BOUND_S * 1e6 / 2:.3f}us", 1, "FAIL"),  # the bound alone exceeds it: certain
        (f"{T4_BOUND_S * 1e6 * 2:.3f}us", 3, "not decided without measuring"),
    ],
)
def test_check_latency_on_a_device(workdir, capsys, budget, code, word):
    got, out, err = cli(capsys, "check", "prof_models.py:mlp", "-i", "32x256", "--max-latency", budget, "--on", "t4")
    assert got == code
    assert word in out + err
    # a datasheet part: the any-implementation bound decides unless told, and the line says so
    assert "any-implementation lower bound on T4" in out + err


def test_check_bound_flag_names_the_bound(workdir, capsys):
    budget = f"{T4_BOUND_S * 1e6 / 2:.3f}us"
    got, out, err = cli(capsys, "check", "prof_models.py:mlp", "-i", "32x256", "--max-latency", budget, "--on", "t4",
                        "--bound", "eager", "--format", "json")
    assert got == 1
    (line,) = json.loads(out)["lines"] if "lines" in json.loads(out) else json.loads(out)["budget"]["lines"]
    assert line["basis"] == "eager lower bound on T4" and line["actual"] == pytest.approx(T4_BOUND_S)
    code, _, err = cli(capsys, "check", "prof_models.py:mlp", "-i", "32x256", "--max-latency", "1s", "--bound", "any")
    assert code == 2 and "--bound" in err and "--on" in err


def test_check_on_needs_a_latency_budget(workdir, capsys):
    code, _, err = cli(capsys, "check", "prof_models.py:mlp", "-i", "32x256", "--max-flops", "1G", "--on", "t4")
    assert code == 2 and "--max-latency" in err


def test_bad_duration_and_device(workdir, capsys):
    code, _, err = cli(capsys, "check", "prof_models.py:mlp", "--max-latency", "fast", "--on", "t4")
    assert code == 2 and "not a duration" in err
    code, _, err = cli(capsys, "count", "prof_models.py:mlp", "-i", "32x256", "--on", "tpu9", "-q")
    assert code == 2 and "unknown part 'tpu9'; known parts: H100 SXM" in err


def test_profile_csv_flops_match_the_count(workdir, capsys, tmp_path):
    trace = tmp_path / "trace.json"
    code, out, _ = cli(capsys, "profile", "prof_models.py:mlp", "-i", "32x256", "--steps", "2", "--roofs", "100G,10G",
                       "--format", "csv", "--by", "op", "--trace", str(trace), "-q")
    assert code == 0
    rows = list(csv.DictReader(io.StringIO(out)))
    assert sum(float(r["flops"]) for r in rows) == FLOPS
    assert {r["name"] for r in rows} == {"aten::linear", "aten::relu"}
    events = json.loads(trace.read_text())["traceEvents"]
    assert sorted(e["args"]["flops"] for e in events if e.get("name") == "aten::linear" and "flops" in e["args"]) == sorted(
        [2 * 32 * 256 * 512, 2 * 32 * 512 * 64] * 2  # each of the 2 steps
    )


def test_profile_usage_errors(workdir, capsys):
    code, _, err = cli(capsys, "profile", "prof_models.py:mlp", "-i", "32x256", "--device", "meta")
    assert code == 2 and "for real" in err
    code, _, err = cli(capsys, "profile", "prof_models.py:mlp", "--roofs", "1T")
    assert code == 2 and "PEAK_FLOPS,BANDWIDTH" in err
    code, _, err = cli(capsys, "profile", "prof_models.py:mlp", "--format", "tree")
    assert code == 2


def test_profile_html_and_json(workdir, capsys):
    pytest.importorskip("matplotlib")
    code, out, _ = cli(capsys, "profile", "prof_models.py:mlp", "-i", "32x256", "--steps", "1", "--roofs", "100G,10G",
                       "--format", "html", "-q")
    assert code == 0 and "<table>" in out and "<svg" in out
    code, out, _ = cli(capsys, "profile", "prof_models.py:mlp", "-i", "32x256", "--steps", "1", "--roofs", "100G,10G",
                       "--format", "json", "--by", "module", "-q")
    data = json.loads(out)
    assert code == 0 and data["roofs"]["source"] == "given"
    assert sum(r["flops"] for r in data["rows"]) == FLOPS


@pytest.mark.parametrize("flag, labels", [((), 2), (("--plot-top", "1"), 1)])
def test_profile_plot_top_sets_the_roofline_labels(workdir, capsys, monkeypatch, flag, labels):
    # --plot-top was accepted and ignored by profile; it now picks how many of the slowest
    # operators are labelled (default 6). The mlp's points are its 2 operators (aten::addmm
    # for both Linears, aten::relu), so the default labels both.
    pytest.importorskip("matplotlib")
    from flopcount.report import roofline_plot

    drawn = []
    original = roofline_plot.draw_roofline

    def recording(result, **options):
        figure = original(result, **options)
        drawn.append(sum(len(ax.texts) for ax in figure.axes))
        return figure

    monkeypatch.setattr(roofline_plot, "draw_roofline", recording)
    code, _, err = cli(capsys, "profile", "prof_models.py:mlp", "-i", "32x256", "--steps", "1", "--roofs", "100G,10G",
                       "--plot", "roof.png", "-q", *flag)
    assert code == 0, err
    assert drawn == [labels] and (workdir / "roof.png").stat().st_size > 0


@pytest.mark.skipif(not __import__("os").path.exists("/dev/full"), reason="needs /dev/full (a device whose writes fail with ENOSPC)")
def test_profile_trace_write_failure_is_one_line(workdir, capsys):
    # --trace passes the early path check (/dev/full exists and is writable) and then fails
    # with ENOSPC: the user's disk, not a bug of ours. It was reported as an internal error
    # (exit 4); like --output and --plot it is one line naming the flag, exit 2.
    code, out, err = cli(capsys, "profile", "prof_models.py:mlp", "-i", "32x256", "--steps", "1", "--roofs", "100G,10G",
                         "--format", "json", "--trace", "/dev/full", "-q")
    assert code == 2, err
    assert json.loads(out)["steps"] == 1  # the report was written before the trace
    assert err.strip().splitlines()[-1].startswith("flopcount: error: --trace /dev/full: ")
    assert "internal error" not in err


def test_check_json_holds_the_latency_line_in_seconds(workdir, capsys):
    # issue #27 item 6: the budget's data in seconds (0.2 wrote "latency_ms" in ms); 0.2's ms keys beside, one release
    code, out, err = cli(capsys, "check", "prof_models.py:mlp", "-i", "32x256", "--max-latency", "1ms", "--on", "t4",
                         "--format", "json")
    assert code == 3, err  # the T4 bound (about 1.3 us) is within 1 ms: not decided without measuring
    (line,) = json.loads(out)["budget"]["lines"]
    assert (line["name"], line["unit"], line["limit"]) == ("latency", "s", 0.001)
    assert line["actual"] == pytest.approx(T4_BOUND_S) and line["actual_ms"] == pytest.approx(T4_BOUND_S * 1e3)
    assert line["limit_ms"] == 1.0 and line["status"] == "UNDECIDED"
    # the text still shows milliseconds
    code, out, err = cli(capsys, "check", "prof_models.py:mlp", "-i", "32x256", "--max-latency", "1ms", "--on", "t4")
    row = next(text for text in out.splitlines() if text.startswith("latency"))
    assert row.split()[:3] == ["latency", "1.000", "ms"] and f"{T4_BOUND_S * 1e3:.3f} ms" in row
    assert "UNDECIDED: latency is not decided without measuring" in err


@pytest.mark.parametrize("key, value, warned", [("max-latency-s", "0.001", False), ("max-latency-ms", "1", True)])
def test_check_reads_the_files_latency_in_seconds_and_warns_of_the_02_key(workdir, capsys, key, value, warned):
    (workdir / "pyproject.toml").write_text(f"[tool.flopcount]\n{key} = {value}\n")
    code, out, err = cli(capsys, "check", "prof_models.py:mlp", "-i", "32x256", "--on", "t4", "--format", "json")
    assert code == 3, err
    (line,) = json.loads(out)["budget"]["lines"]
    assert (line["name"], line["limit"]) == ("latency", 0.001)
    said = "flopcount: warning: pyproject.toml [tool.flopcount]: max-latency-ms is deprecated"
    assert (said in err) == warned and ("use max-latency-s in seconds" in err) == warned
