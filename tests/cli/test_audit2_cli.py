"""Branch audit2: what the CLI said to a user gating on a hardware claim, mistyping a flag,
or asking a vision model to generate. Each test failed on the parent of its fix."""

from __future__ import annotations

import pytest

from flopcount.units import format_seconds
from tests.cli._cli_run import cli

MODEL = """
import torch.nn as nn


def mlp():
    return nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 64))
"""

# T4 datasheet: FP32 8.1 TFLOP/s, 4 MB L2 (bandwidth unpublished: no memory term for a working
# set it holds). The any-implementation bound of a 32 x 256 batch: the two linears' FLOPs and
# the ReLU's, at the FP32 peak.
T4_BOUND_S = (2 * 32 * 256 * 512 + 32 * 512 + 2 * 32 * 512 * 64) / 8.1e12


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    (tmp_path / "audit2_models.py").write_text(MODEL)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("limit, code, verdict, actual", [
    ("1ms", 3, "UNDECIDED: latency is not decided without measuring (its any-implementation lower bound on T4 is within the budget)",
     f">= {T4_BOUND_S * 1e3:.3f} ms"),
    # a 1 ns budget read "0.000 ms" in milliseconds: both in microseconds (branch gatewalk)
    ("1ns", 1, "FAIL: 1 of 1 budget(s) exceeded: latency (any-implementation lower bound on T4)", f">= {T4_BOUND_S * 1e6:.3f} us"),
])
def test_a_latency_gates_report_names_the_part_and_the_bound(workdir, capsys, limit, code, verdict, actual):
    """check --on t4 --format markdown (the PR comment) said 'latency >= 0.002 ms' and UNDECIDED
    or FAIL without the part or the bound: only stderr and the JSON's 'basis' named them."""
    got, out, err = cli(capsys, "check", "audit2_models.py:mlp", "-i", "32x256", "--max-latency", limit, "--on", "t4",
                        "--format", "markdown")
    assert got == code, err
    assert f"**{verdict}**" in out
    row = next(text for text in out.splitlines() if text.startswith("| latency"))
    assert actual in row


@pytest.mark.parametrize("command, flag, hint", [
    (("bench", "audit2_models.py:mlp", "-i", "4x256"), ("--runs", "5"), "; did you mean --iters?"),
    (("count", "audit2_models.py:mlp", "-i", "4x256"), ("--detph", "2"), "; did you mean --depth, --dtype?"),
    (("roofs", "t4"), ("--fromat=json",), "; did you mean --format?"),
])
def test_an_unknown_flag_is_refused_by_its_command(workdir, capsys, command, flag, hint):
    """'flopcount bench ... --runs 5' answered 'flopcount: error: unrecognized arguments: --runs 5
    (see flopcount --help)': the top level's help, which lists no bench flag, and no hint."""
    code, out, err = cli(capsys, *command, *flag)
    name = command[0]
    assert code == 2 and out == ""
    assert err == f"flopcount {name}: error: unrecognized arguments: {' '.join(flag)}{hint} (see flopcount {name} --help)\n"


VISION = """
import torch.nn as nn


def net():
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten())
"""


@pytest.mark.parametrize("command", [
    ("count", "audit2_vision.py:net", "-i", "1x3x8x8", "--generate", "4"),
    ("serve", "audit2_vision.py:net", "--on", "h100", "--prompt", "8", "--new", "2"),
])
def test_generate_on_a_vision_model_says_what_it_needs(workdir, capsys, command):
    """--generate and serve on a conv net ended in 'forward failed in the root module ... TypeError:
    Sequential.forward() got an unexpected keyword argument 'input_ids''."""
    (workdir / "audit2_vision.py").write_text(VISION)
    code, out, err = cli(capsys, *command)
    who = "serve" if command[0] == "serve" else "count_generation"
    assert code == 2 and out == ""
    assert err.splitlines()[-1] == (f"flopcount: error: {who} counts generate() of a language model, whose forward takes "
                                    "the prompt as input_ids; Sequential.forward(input) takes no input_ids")


@pytest.mark.parametrize("word, says", [
    ("predict", "flopcount.predict()'s bounds are `flopcount count ENTRY --on PART`"),
    ("benchmark", "flopcount.benchmark() is `flopcount bench ENTRY`"),
    ("estimate_memory", "flopcount.estimate_memory() is `flopcount count ENTRY --memory`"),
])
def test_an_api_functions_name_as_a_command_points_to_the_command(capsys, word, says):
    """'flopcount predict example:resnet18 --on h100' answered 'invalid choice: 'predict' (choose
    from 'count', ...)': nothing said that count --on is predict's command."""
    code, out, err = cli(capsys, word, "example:resnet18", "--on", "h100")
    assert code == 2 and out == ""
    assert err.startswith(f"flopcount: error: no command {word!r}: {says}")
    assert "(commands: count, bench, check, diff, profile, plan, serve, roofs)" in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("flag, fmt", [(("--on", "h100"), "html"), (("--memory",), "csv")])
def test_a_reading_without_a_form_in_the_format_is_refused_before_the_count(workdir, capsys, flag, fmt):
    """count --on h100 --format html counted the model, bounded it ('bounding the latency of
    ... on h100'), then refused the format: the work was done for an error."""
    code, out, err = cli(capsys, "count", "audit2_models.py:mlp", "-i", "4x256", *flag, "--format", fmt)
    assert code == 2 and out == ""
    assert err == f"flopcount: error: {flag[0]} has no {fmt} form; use --format table, tree, markdown or json\n"


@pytest.mark.parametrize("flag", [("--on", "h100"), ("--memory",)])
def test_generate_refuses_the_readings_it_does_not_give(capsys, flag):
    """count --generate 2 --on h100 (or --memory) printed the generation's count and exited 0:
    the bound and the memory asked for were silently left out."""
    code, out, err = cli(capsys, "count", "hf:gpt2", "--config", "n_layer=1", "--input", "1x8:int64", "--generate", "2", *flag)
    assert code == 2 and out == ""
    assert err == (f"flopcount: error: --generate does not read {flag[0]}: it reports the KV cache; generate()'s latency "
                   "bounds and memory per batch on a part are `flopcount serve ENTRY --on PART`\n")


def _t4_bound_s(batch: int) -> float:
    # the two linears' FLOPs and the ReLU's at the T4's FP32 peak (the weights sit in its L2)
    return (2 * batch * 256 * 512 + batch * 512 + 2 * batch * 512 * 64) / 8.1e12


def test_diff_compares_the_latency_bounds_two_reports_hold(workdir, capsys):
    """diff of two `count --on t4 --format json` reports dropped the bounds they held: no
    row, no word, where the peak memory and the measured latency get a row."""
    for batch, name in ((4, "a.json"), (8, "b.json")):
        code, _, err = cli(capsys, "count", "audit2_models.py:mlp", "-i", f"{batch}x256", "--on", "t4", "-f", "json", "-o", name)
        assert code == 0, err
    code, out, err = cli(capsys, "diff", "a.json", "b.json", "--format", "json")
    assert code == 0, err
    import json

    data = json.loads(out)
    assert "latency_bound" in data["metrics"]
    total = data["totals"]["latency_bound"]
    assert total["a"] == pytest.approx(_t4_bound_s(4)) and total["b"] == pytest.approx(_t4_bound_s(8))
    assert data["a_bound"] == data["b_bound"] == "any-implementation lower bound on T4"
    code, out, err = cli(capsys, "diff", "a.json", "b.json")
    row = next(text for text in out.splitlines() if text.startswith("Latency bound"))
    assert f"+{_t4_bound_s(4) * 1e9:.1f} ns" in row
    assert "latency bound: the any-implementation lower bound on T4 (count --on), a bound, not a measurement" in out


def test_diff_does_not_compare_bounds_on_two_parts(workdir, capsys):
    for part, name in (("t4", "a.json"), ("h100", "b.json")):
        code, _, err = cli(capsys, "count", "audit2_models.py:mlp", "-i", "4x256", "--on", part, "-f", "json", "-o", name)
        assert code == 0, err
    code, out, err = cli(capsys, "diff", "a.json", "b.json")
    assert code == 0 and "Latency bound" not in out
    assert ("latency bounds not compared: A's is the any-implementation lower bound on T4, B's the any-implementation "
            "lower bound on H100 SXM") in out


DEEP = """
import torch.nn as nn


def deep():
    return nn.Sequential(*[nn.Linear(512, 512) for _ in range(8)])
"""


def test_the_eager_bound_is_not_called_per_op_when_the_any_bound_sets_it(workdir, capsys):
    """check --bound eager --on t4 said 'eager per-op lower bound on T4: 13.8 us (eager 0.5 us,
    ...)': the figure held to was the any-implementation bound (the larger), not the per-op sum."""
    (workdir / "audit2_deep.py").write_text(DEEP)
    code, out, err = cli(capsys, "check", "audit2_deep.py:deep", "-i", "1x512", "--max-latency", "1us", "--on", "t4",
                         "--bound", "eager")
    assert code == 1, err
    # T4 datasheet: 8.1 TFLOP/s FP32, 320 GB/s, 4 MB L2 (bandwidth unpublished). Each linear's 1 MB
    # working set fits the L2, so the per-op sum is its FLOPs alone: 8 x 2 x 512 x 512 / 8.1e12 = 0.52 us;
    # the any bound reads the 8 weights and biases and the input once: (8 x (512 x 512 + 512) + 512) x 4 B,
    # less the 4 MB the L2 holds, over 320 GB/s = 13.8 us, the larger, so the one held to.
    per_op_s = 8 * 2 * 512 * 512 / 8.1e12
    unavoidable = (8 * (512 * 512 + 512) + 512) * 4
    any_s = (unavoidable - 4e6) / 320e9
    assert any_s > per_op_s
    assert f"budget exceeded: latency >= {any_s * 1e3:.3f} ms > 0.001 ms (eager lower bound on T4)" in err
    assert "per-op lower bound" not in err + out
    assert f"(eager per-op sum {format_seconds(per_op_s)}, any implementation {format_seconds(any_s)};" in err
    assert format_seconds(per_op_s) == "517.8 ns" and format_seconds(any_s) == "13.8 us"
