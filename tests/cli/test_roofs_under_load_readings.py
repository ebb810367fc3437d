"""Every reading that prints a bound on "this machine"'s roofs measured under load says it is an
estimate, not a bound (branch hwroofs). Such roofs failed the sanity check (a load average above
the cores, two passes apart): they are below what the machine does, so a "lower bound" on them
can sit above a real run (an int8 MLP that ran in 2.4 ms was held to 8.0 ms under load 5.6).
boundcheck made ``check --on`` say UNDECIDED; ``count --on``, ``profile``, ``serve``, ``roofs``,
``diff`` and the Python ``predict``/``profile``/``serve`` still printed "lower bound" with at
most a ``source`` string. Now the result carries ``bound_certain`` (False) and the reasons
(``Roofs.doubts``, ``bound_doubts``), every renderer marks each figure ``~`` and says why, and
the Python API warns once (:class:`flopcount.EstimatedBoundWarning`). Sane roofs measured now,
cached roofs and datasheet parts are unchanged.

The not-sane path is forced as boundcheck's tests force it: this machine's roofs are toy ones
(1 MFLOP/s float32, 1 TB/s: compute binds every op) and :func:`measured.sanity` returns the
problems given. Oracle: the hand-derived FLOPs of the MLP over the toy roof, and the same
figures on the same roofs found sane (the estimate is the bound's number, said otherwise)."""

from __future__ import annotations

import csv
import io
import json
import warnings

import pytest
import torch
from torch import nn

import flopcount
from flopcount.devices import Roofs, datasheet_roofs, gpu_ceiling
from flopcount.devices import measured as measured_module
from flopcount.errors import EstimatedBoundWarning
from tests.cli._cli_run import cli, toy_machine

# 8 x 16 -> 32 -> 8: 2 * 8 * (16 * 32 + 32 * 8) MAC FLOPs + 8 * 32 ReLU = 12,544 FLOPs; at the
# toy 1 MFLOP/s float32 roof (memory at 1 TB/s never binds) the eager bound is 12.544 ms
LINEAR_FLOPS = 2 * 8 * (16 * 32 + 32 * 8)
FLOPS = LINEAR_FLOPS + 8 * 32
TOY = Roofs({"float32": 1e6}, 1e12, "toy cpu", "measured")
LOAD = "load average 7.04 above the 2 cores"
MARK_LINE = f"~ marks an estimate, not a bound: roofs measured under load ({LOAD})"

LLAMA = ["hf:llama", "--config", "num_hidden_layers=1", "--config", "hidden_size=32", "--config", "intermediate_size=64",
         "--config", "num_attention_heads=2", "--config", "num_key_value_heads=2", "--config", "vocab_size=64"]


@pytest.fixture
def machine(tmp_path, monkeypatch):
    """This machine's roofs are the toy ones, measured (no cache), with the sanity problems given."""
    return toy_machine(tmp_path, monkeypatch, TOY)


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))


def _estimated(caught) -> list:
    return [w for w in caught if issubclass(w.category, EstimatedBoundWarning)]


# ---------------------------------------------------------------------------------------- count --on


def test_count_on_this_machine_under_load_marks_each_figure_an_estimate(machine, capsys):
    machine([LOAD])
    code, out, err = cli(capsys, "count", "bcmodels.py:Mlp", "-i", "8x16", "--on", "this machine")
    assert code == 0, err
    assert f"Eager estimate on toy cpu: ~ {FLOPS / 1e6 * 1e3:.3f} ms" in out
    assert f"Any implementation (fused or not): ~ {FLOPS / 1e6 * 1e3:.3f} ms" in out
    assert f"~ {LINEAR_FLOPS / 1e6 * 1e3:.3f} ms" in out  # aten::linear's row
    assert MARK_LINE in out
    assert "lower bound" not in out and "Bounds, not forecasts" not in out
    assert f"predict: each latency bound is an estimate, not a bound: roofs measured under load ({LOAD})" in err


def test_count_on_this_machine_under_load_markdown_marks_each_figure(machine, capsys):
    machine([LOAD])
    code, out, err = cli(capsys, "count", "bcmodels.py:Mlp", "-i", "8x16", "--on", "this machine", "--format", "markdown")
    assert code == 0, err
    assert f"Eager estimate on toy cpu: ~ {FLOPS / 1e6 * 1e3:.3f} ms" in out and MARK_LINE in out


def test_count_on_this_machine_under_load_json_says_the_bound_is_not_certain(machine, capsys):
    machine([LOAD])
    code, out, err = cli(capsys, "count", "bcmodels.py:Mlp", "-i", "8x16", "--on", "this machine", "--format", "json")
    assert code == 0, err
    predict = json.loads(out)["predict"]
    assert predict["bound_certain"] is False and predict["bound_doubts"] == [LOAD]
    assert predict["roofs"]["doubts"] == [LOAD]
    assert predict["latency_s"] == pytest.approx(FLOPS / 1e6)  # the figure itself is unchanged: the words say what it is


def test_count_on_sane_roofs_is_a_lower_bound_as_before(machine, capsys):
    machine([])
    code, out, err = cli(capsys, "count", "bcmodels.py:Mlp", "-i", "8x16", "--on", "this machine")
    assert code == 0, err
    assert f"Eager lower bound on toy cpu: {FLOPS / 1e6 * 1e3:.3f} ms" in out
    assert "~" not in out and "estimate" not in out and "estimate" not in err
    code, out, err = cli(capsys, "count", "bcmodels.py:Mlp", "-i", "8x16", "--on", "this machine", "--format", "json")
    predict = json.loads(out)["predict"]
    assert predict["bound_certain"] is True and predict["bound_doubts"] == []


def test_count_on_a_datasheet_part_is_a_lower_bound_as_before(machine, capsys):
    machine([LOAD])  # this machine's roofs are not read for a datasheet part
    code, out, err = cli(capsys, "count", "bcmodels.py:Mlp", "-i", "8x16", "--on", "h100", "--format", "json")
    assert code == 0, err
    predict = json.loads(out)["predict"]
    assert predict["bound_certain"] is True and predict["bound_doubts"] == [] and predict["roofs"]["doubts"] == []


def test_check_on_this_machine_under_load_says_so_on_stderr_too(machine, capsys):
    """boundcheck's verdict (UNDECIDED, tests/cli/test_check_roofs_under_load.py) stays; the progress
    line said "a bound, not a forecast" beside it."""
    machine([LOAD])
    code, out, err = cli(capsys, "check", "bcmodels.py:Mlp", "-i", "8x16", "--max-latency", "1ms", "--on", "this machine")
    assert code == 3, (out, err)
    assert "an estimate, not a bound\n" in err and "a bound, not a forecast" not in err
    assert f"warning: predict: each latency bound is an estimate, not a bound: roofs measured under load ({LOAD})" in err


# ---------------------------------------------------------------------------------------- profile


@pytest.mark.parametrize("fmt", ["table", "markdown", "html"])
def test_profile_under_load_marks_each_attainable_time(machine, capsys, fmt):
    machine([LOAD])
    code, out, err = cli(capsys, "profile", "bcmodels.py:Mlp", "-i", "8x16", "--steps", "1", "--warmup", "0", "--format", fmt)
    assert code == 0, err
    # linear's 12,288 FLOPs, below the MFLOP an op needs to raise the roof, stay at the toy roof
    assert f"~ {LINEAR_FLOPS / 1e6 * 1e3:.3f} ms" in out
    assert MARK_LINE in out.replace("&#x27;", "'")


def test_profile_under_load_csv_and_json_say_the_bound_is_not_certain(machine, capsys):
    machine([LOAD])
    code, out, err = cli(capsys, "profile", "bcmodels.py:Mlp", "-i", "8x16", "--steps", "1", "--warmup", "0", "--format", "csv")
    assert code == 0, err
    rows = list(csv.DictReader(io.StringIO(out)))
    assert rows and all(r["bound_certain"] == "False" for r in rows)
    assert all(r["bound_doubts"] == f"an estimate, not a bound: roofs measured under load ({LOAD})" for r in rows)
    code, out, err = cli(capsys, "profile", "bcmodels.py:Mlp", "-i", "8x16", "--steps", "1", "--warmup", "0", "--format", "json")
    data = json.loads(out)
    assert data["bound_certain"] is False and data["bound_doubts"] == [LOAD]


def test_profile_on_sane_roofs_marks_nothing(machine, capsys):
    machine([])
    code, out, err = cli(capsys, "profile", "bcmodels.py:Mlp", "-i", "8x16", "--steps", "1", "--warmup", "0", "--format", "csv")
    assert code == 0, err
    rows = list(csv.DictReader(io.StringIO(out)))
    assert rows and all(r["bound_certain"] == "True" and r["bound_doubts"] == "" for r in rows)
    code, out, err = cli(capsys, "profile", "bcmodels.py:Mlp", "-i", "8x16", "--steps", "1", "--warmup", "0")
    assert f"  {LINEAR_FLOPS / 1e6 * 1e3:.3f} ms" in out and "~ marks" not in out and "estimate" not in err


# ---------------------------------------------------------------------------------------- serve, roofs, diff


def _serve(capsys, *flags: str):
    code, out, err = cli(capsys, "serve", *LLAMA, "--on", "this machine", "--prompt", "8", "--new", "2",
                         "--dtype", "float32", *flags)
    assert code == 0, err
    return out, err


def test_serve_under_load_marks_each_time_and_ceiling(machine, capsys):
    pytest.importorskip("transformers")
    machine([])
    sane = json.loads(_serve(capsys, "-f", "json")[0])["parts"][0]
    machine([LOAD])
    loaded = json.loads(_serve(capsys, "-f", "json")[0])["parts"][0]
    assert sane["bound_certain"] is True and loaded["bound_certain"] is False and loaded["bound_doubts"] == [LOAD]
    assert loaded["batches"] == sane["batches"]  # the same figures on the same rates: only what they are differs
    out, err = _serve(capsys)
    ttft = sane["batches"][0]["prefill"]["seconds"]
    assert "TTFT ~" in out and "tok/s ~" in out and "TTFT >=" not in out
    assert f"~ {flopcount.units.format_seconds(ttft)} (compute)" in out
    assert MARK_LINE in out
    out, err = _serve(capsys, "-f", "markdown")
    assert "TTFT ~" in out and MARK_LINE in out


def test_serve_on_sane_roofs_keeps_its_bounds(machine, capsys):
    pytest.importorskip("transformers")
    machine([])
    out, err = _serve(capsys)
    assert "TTFT >=" in out and "tok/s <=" in out and "~" not in out


def test_roofs_under_load_says_a_bound_on_them_is_an_estimate(machine, capsys):
    machine([LOAD])
    code, out, err = cli(capsys, "roofs")
    assert code == 0, err
    assert f"A bound on these roofs is an estimate, not a bound: roofs measured under load ({LOAD})" in out
    code, out, err = cli(capsys, "roofs", "--format", "json")
    assert json.loads(out)["doubts"] == [LOAD]


def test_diff_compares_no_estimate(machine, capsys, tmp_path):
    machine([])
    cli(capsys, "count", "bcmodels.py:Mlp", "-i", "8x16", "--on", "this machine", "-f", "json", "-o", str(tmp_path / "sane.json"))
    machine([LOAD])
    cli(capsys, "count", "bcmodels.py:Mlp", "-i", "8x16", "--on", "this machine", "-f", "json", "-o", str(tmp_path / "load.json"))
    same = flopcount.diff(tmp_path / "sane.json", tmp_path / "sane.json")
    assert same.totals.before("latency_bound") == pytest.approx(FLOPS / 1e6)
    for a, b in (("sane", "load"), ("load", "load")):
        result = flopcount.diff(tmp_path / f"{a}.json", tmp_path / f"{b}.json")
        assert result.totals.before("latency_bound") is None, (a, b)
        assert result.b_bound == f"eager estimate on toy cpu, not a bound: roofs measured under load ({LOAD})"
        assert "latency bounds not compared" in result.to_markdown()


# ---------------------------------------------------------------------------------------- the Python API


def test_predict_on_this_machine_under_load_warns_once_and_says_so(machine):
    machine([LOAD])
    model, x = _mlp(), torch.randn(8, 16)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = flopcount.predict(model, x, on="this machine")
    found = _estimated(caught)
    assert len(found) == 1 and found[0].filename == __file__
    assert str(found[0].message) == f"predict: each latency bound is an estimate, not a bound: roofs measured under load ({LOAD})"
    assert result.bound_certain is False and result.roofs.doubts == (LOAD,)
    assert result.latency_s == pytest.approx(FLOPS / 1e6)
    assert [d.kind for d in result.diagnostics()] == ["estimate"]
    assert str(found[0].message) in result.warnings  # stored on the result too
    data = result.to_dict()
    assert data["bound_certain"] is False and data["bound_doubts"] == [LOAD]
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


@pytest.mark.parametrize("on", ["this machine", "h100"])
def test_predict_on_sane_roofs_or_a_part_warns_nothing(machine, on):
    machine([])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = flopcount.predict(_mlp(), torch.randn(8, 16), on=on)
    assert _estimated(caught) == [] and result.bound_certain is True and result.to_dict()["bound_doubts"] == []
    assert "Eager lower bound" in result.table() and "~" not in result.table()


def test_profile_under_load_warns_once_and_says_so(machine):
    machine([LOAD])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = flopcount.profile(_mlp(), torch.randn(8, 16), steps=1, warmup=0, keep_trace=True)
    found = _estimated(caught)
    assert len(found) == 1 and found[0].filename == __file__
    assert result.bound_certain is False and result.to_dict()["bound_doubts"] == [LOAD]
    assert "estimate" in [d.kind for d in result.diagnostics()]
    linear = result.by_operator()["aten::linear"]
    assert linear.attainable_s == pytest.approx(LINEAR_FLOPS / 1e6)
    assert MARK_LINE in result.table()
    # TensorBoard's efficiency scalars and the Chrome trace's op events say it too
    from flopcount.core.rendering import render
    from flopcount.integrations.tensorboard import profile_scalars

    tags = profile_scalars(result)
    assert "flopcount/profile/op_efficiency_estimate/aten::linear" in tags and not any("/op_efficiency/" in t for t in tags)
    joined = [e["args"] for e in render(result, "chrome_trace")["traceEvents"]
              if isinstance(e, dict) and "attainable_us" in e.get("args", {})]
    assert joined and all(a["bound_certain"] is False for a in joined)


def test_profile_with_given_roofs_warns_nothing(machine):
    machine([LOAD])  # not read: the roofs are given
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = flopcount.profile(_mlp(), torch.randn(8, 16), steps=1, warmup=0, roofs=TOY)
    assert _estimated(caught) == [] and result.bound_certain is True and "~ marks" not in result.table()
    from flopcount.integrations.tensorboard import profile_scalars

    assert "flopcount/profile/op_efficiency/aten::linear" in profile_scalars(result)


def test_serve_under_load_warns_once_and_says_so(machine):
    transformers = pytest.importorskip("transformers")
    machine([LOAD])
    config = transformers.LlamaConfig(num_hidden_layers=1, hidden_size=32, intermediate_size=64, num_attention_heads=2,
                                      num_key_value_heads=2, vocab_size=64)
    model = transformers.LlamaForCausalLM(config)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = flopcount.serve(model, torch.zeros(1, 8, dtype=torch.int64), 2, on="this machine")
    found = _estimated(caught)
    assert len(found) == 1 and found[0].filename == __file__
    assert result.bound_certain is False and result.to_dict()["bound_doubts"] == [LOAD]
    assert [d.kind for d in result.diagnostics()][:1] == ["estimate"]
    assert MARK_LINE in result.table() and "note: serve: each time bound" not in result.table()


# ---------------------------------------------------------------------------------------- the roofs themselves


def _roofs(rate: float) -> Roofs:
    return Roofs({"float32": rate}, 1e10, "cpu", "measured")


def test_machine_roofs_carry_their_doubts_only_when_not_sane(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("FLOPCOUNT_NO_ROOFS_CACHE", raising=False)
    # load 5.6 on 2 cores: not sane, not cached, doubts said
    busy = measured_module.machine_roofs("cpu", measure=lambda d: _roofs(1e9), loadavg=lambda: (5.6, 0, 0), cores=2)
    assert busy.doubts == ("load average 5.60 above the 2 cores",) and not busy.certain
    # quiet: sane, cached, no doubts; and read back from the cache, still none
    quiet = measured_module.machine_roofs("cpu", measure=lambda d: _roofs(1e9), loadavg=lambda: (0.5, 0, 0), cores=2)
    assert quiet.doubts == () and quiet.certain
    cached = measured_module.machine_roofs("cpu", measure=lambda d: pytest.fail("measured again"), loadavg=lambda: (9.0, 0, 0),
                                           cores=2)
    assert cached.source.startswith("measured (cached") and cached.doubts == ()


def test_a_report_saved_before_doubts_were_a_field_reads_its_doubts_back():
    saved = {**TOY.to_dict(), "source": f"measured (not cached: {LOAD})", "details": {"not_cached": [LOAD]}}
    del saved["doubts"]
    assert Roofs.from_dict(saved).doubts == (LOAD,)
    assert Roofs.from_dict({**TOY.to_dict()}).doubts == ()
    round_trip = Roofs(TOY.peak_flops, TOY.bandwidth, doubts=(LOAD,))
    assert Roofs.from_dict(round_trip.to_dict()).doubts == (LOAD,)


def test_a_gpu_ceiling_is_as_certain_as_its_datasheet():
    """A GPU's roofs measured under load are each raised to the datasheet's: a bound on them is a
    bound, unless a measured column has no datasheet figure to raise it to."""
    sheet = datasheet_roofs("h100")
    loaded = Roofs({"float32": 1e12, "bfloat16": 2e12}, 1e11, "H100", "measured (not cached: x)", doubts=("x",))
    ceiling = gpu_ceiling(loaded, sheet)
    assert ceiling.certain and ceiling.peak_flops["bfloat16"] == sheet.peak_flops["bfloat16"]
    odd = Roofs({"float32": 1e12, "complex64": 1e12}, 1e11, "H100", "measured (not cached: x)", doubts=("x",))
    assert gpu_ceiling(odd, sheet).doubts == ("x",)
