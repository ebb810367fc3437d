"""Issue #29, CLI items 12-14, 21, 22: the training step's mode, plan's messages, budgets and
kwargs spelled on the command line, user errors that are not bugs, --timeout. Expected numbers
are derived by hand in the comments."""

from __future__ import annotations

import csv
import io
import json
import re
import textwrap

import pytest
from _cli_run import cli

from flopcount.cli import main

MODELS = textwrap.dedent(
    """
    import time
    import torch
    from torch import nn

    def bn():
        return nn.Sequential(nn.Linear(16, 8), nn.BatchNorm1d(8))

    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x, scale=1.0, times=1, double=False, name="a"):
            y = self.fc(x)
            for _ in range(times):
                y = y * scale
            if double:
                y = self.fc(y)
            assert name in ("a", "b c"), name
            return y

    class Sleeper(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            time.sleep(60)
            return self.fc(x)

    def slow_factory():
        time.sleep(60)
        return nn.Linear(4, 4)

    class NoParams(nn.Module):
        def forward(self, x):
            return x * 2
    """
)


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    (tmp_path / "models.py").write_text(MODELS)
    monkeypatch.chdir(tmp_path)
    return tmp_path




# --------------------------------------------------------------------------- 12: train mode

# Linear(16, 8) then BatchNorm1d(8) on a B x 16 input; N = B * 8 elements, G = 8 channels.
# Linear: B*16*8 MACs = 2*B*128 FLOPs (the bias is fused into addmm: free).
# BatchNorm, eval (running stats): normalise 2N + 2G, affine 2N.
# BatchNorm, train (batch stats): + mean and biased variance 4N + 2G (docs/conventions.md).


@pytest.mark.parametrize("batch", [4, 6])
@pytest.mark.parametrize("flags", [["--backward"], ["--optimizer", "sgd"]])
def test_training_step_counts_in_train_mode(workdir, capsys, batch, flags):
    n, g = batch * 8, 8
    linear = 2 * batch * 16 * 8
    eval_forward = linear + (2 * n + 2 * g) + 2 * n
    train_forward = eval_forward + 4 * n + 2 * g
    code, out, err = cli(capsys, "count", "models.py:bn", "-i", f"{batch}x16", *flags, "-f", "json")
    assert code == 0, err
    assert json.loads(out)["by_phase"]["forward"]["flops"] == train_forward
    assert "train() mode" in err
    code, out, err = cli(capsys, "count", "models.py:bn", "-i", f"{batch}x16", *flags, "--eval", "-f", "json")
    assert code == 0, err
    assert json.loads(out)["by_phase"]["forward"]["flops"] == eval_forward
    # an inference count stays in eval mode
    code, out, err = cli(capsys, "count", "models.py:bn", "-i", f"{batch}x16", "-f", "json")
    assert code == 0, err
    assert json.loads(out)["flops"] == eval_forward


def test_eval_without_training_step_is_refused(workdir, capsys):
    code, _, err = cli(capsys, "count", "models.py:bn", "-i", "4x16", "--eval")
    assert code == 2 and "--eval applies to a training step" in err


# --------------------------------------------------------------------------- 13: plan's messages

ENCODER = textwrap.dedent(
    """
    from torch import nn

    def encoder():
        layer = nn.TransformerEncoderLayer(d_model=64, nhead=4, dim_feedforward=128, dropout=0.0, batch_first=True)
        return nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
    """
)

LLAMA = ("--config", "num_hidden_layers=1", "--config", "hidden_size=64", "--config", "intermediate_size=64",
         "--config", "vocab_size=128", "--config", "max_position_embeddings=128")


@pytest.mark.parametrize("heads, kv_heads, tp", [(4, 4, 3), (4, 2, 4), (8, 8, 3)])
def test_plan_llama_heads_not_divisible_by_tp(workdir, capsys, heads, kv_heads, tp):
    pytest.importorskip("transformers")
    code, out, err = cli(capsys, "plan", "hf:llama", *LLAMA, "--config", f"num_attention_heads={heads}",
                         "--config", f"num_key_value_heads={kv_heads}", "--tp", str(tp), "-i", "2x8:int64")
    assert code == 2 and out == ""
    last = err.strip().splitlines()[-1]
    assert f"divisible by tp={tp}" in last and f"{heads} heads, {kv_heads} key/value heads" in last


def test_plan_llama_divisible_heads_still_plan(workdir, capsys):
    pytest.importorskip("transformers")
    code, out, err = cli(capsys, "plan", "hf:llama", *LLAMA, "--config", "num_attention_heads=4",
                         "--config", "num_key_value_heads=2", "--tp", "2", "-i", "2x8:int64")
    assert code == 0, err
    assert "micro-batch per rank: (Tensor[2, 8] int64" in out


def test_plan_names_its_micro_batch_and_the_default_input(workdir, capsys):
    (workdir / "enc.py").write_text(ENCODER)
    code, out, err = cli(capsys, "plan", "enc.py:encoder", "-i", "3x16x64", "--fsdp", "2")
    assert code == 0, err
    assert "micro-batch per rank: (Tensor[3, 16, 64] float32" in out
    assert "no --input" not in out + err
    pytest.importorskip("transformers")
    # hf: entries default to one 1x128 token prompt (docs/cli.md, SPEC); without -i the plan says so
    code, out, err = cli(capsys, "plan", "hf:llama", *LLAMA, "--config", "num_attention_heads=4",
                         "--config", "num_key_value_heads=4")
    assert code == 0, err
    assert "micro-batch per rank: (Tensor[1, 128] int64" in out
    assert "note: no --input was given: the micro-batch is the default input of hf:llama (1x128:int64)" in out
    assert "no --input: planning the default input of hf:llama (1x128:int64)" in err


def test_check_memory_says_which_peak_it_checked(workdir, capsys):
    (workdir / "enc.py").write_text(ENCODER)
    base = ("check", "enc.py:encoder", "-i", "2x16x64", "--max-memory", "1GB")
    code, out, err = cli(capsys, *base)
    assert code == 0, err
    assert "of an inference step" in out
    code, out, err = cli(capsys, *base, "--fsdp", "2")
    assert code == 0, err
    assert "of rank 0 in a training step (forward + backward + adamw) sharded over fsdp=2 x tp=1 ranks" in out
    code, out, err = cli(capsys, *base, "--fsdp", "2", "-f", "json")
    data = json.loads(out)
    assert data["memory"]["peak_bytes"] == data["budget"]["lines"][0]["actual"]
    assert "training step" in data["memory"]["of"]


# --------------------------------------------------------------------------- 14: budgets, kwargs, CSV units


@pytest.mark.parametrize("flag, value, says", [
    ("--max-latency", "-5ms", "a latency budget must be > 0"),
    ("--max-latency", "10", "'10' has no unit"),
    ("--max-latency-ms", "-5", "a latency budget must be > 0"),
    ("--max-params", "-3M", "is negative: a number below 0 is not allowed"),
])
def test_negative_and_unitless_budgets_are_named(workdir, capsys, flag, value, says):
    code, out, err = cli(capsys, "check", "models.py:bn", "-i", "4x16", flag, value)
    assert code == 2 and out == ""
    line = err.strip()
    assert len(line.splitlines()) == 1 and flag in line and says in line and "expected one argument" not in line


def test_latency_with_a_unit_still_parses():
    from flopcount.cli.parser import parse_duration_ms

    assert parse_duration_ms("10ms") == 10.0 and parse_duration_ms("2.5s") == 2500.0 and parse_duration_ms("800us") == 0.8


# Scaled: y = fc(x) (Linear(4, 4) on B x 4: 16*B MACs, 32*B FLOPs, the bias fused into addmm), then `times`
# multiplies by `scale` (4*B FLOPs each), then fc again when `double` (32*B more FLOPs, 16*B MACs).


@pytest.mark.parametrize("tracer", ["auto", "dispatch", "jit"])
@pytest.mark.parametrize("batch", [2, 3])
def test_scalar_kwargs_from_the_command_line(workdir, capsys, tracer, batch):
    base = ("count", "models.py:Scaled", "-i", f"{batch}x4", "--tracer", tracer, "-f", "json")
    code, out, err = cli(capsys, *base, "--kwarg", "times=int:3", "--kwarg", "scale=0.5", "--kwarg", "double=true",
                         "--kwarg", "name=str:b c")
    assert code == 0, err
    data = json.loads(out)
    assert data["macs"] == 2 * 16 * batch
    assert data["flops"] == 2 * 32 * batch + 3 * 4 * batch
    code, out, err = cli(capsys, *base, "--kwarg", "times=int:0", "--kwarg", "double=bool:false", "--kwarg", "scale=float:2")
    assert code == 0, err
    assert json.loads(out)["flops"] == 32 * batch


@pytest.mark.parametrize("text, says", [("times=int:x", "'x' is not an int"), ("double=bool:maybe", "is not a bool"),
                                        ("times=abc", "dimension 'abc' is not an integer")])
def test_bad_scalar_kwargs_are_named(workdir, capsys, text, says):
    code, out, err = cli(capsys, "count", "models.py:Scaled", "-i", "2x4", "--kwarg", text)
    assert code == 2 and out == "" and says in err and "--kwarg" in err


def test_kwarg_spec_is_still_a_tensor():
    from flopcount.cli.specs import InputSpec, ScalarArg, parse_kwarg

    assert parse_kwarg("n=4") == ("n", InputSpec((4,)))
    assert parse_kwarg("n=int:4") == ("n", ScalarArg(4))
    assert parse_kwarg("p=1e-3") == ("p", ScalarArg(1e-3))
    assert parse_kwarg("p=none") == ("p", ScalarArg(None))


def test_bench_csv_header_has_units(workdir, capsys):
    code, out, err = cli(capsys, "bench", "models.py:bn", "-i", "4x16", "--iters", "3", "--warmup", "0", "-f", "csv")
    assert code == 0, err
    rows = [line.split(",") for line in out.strip().splitlines()]
    assert rows[0] == ["metric", "value", "unit"]
    units = {row[0]: row[2] for row in rows[1:]}
    assert units["median"] == "ms" and units["p99"] == "ms" and units["throughput"] == "samples/s"
    assert units["flops"] == "FLOPs" and units["params"] == "parameters" and units["iterations"] == "calls"
    # FLOPs by hand: Linear(16, 8) on 4 x 16 plus eval BatchNorm1d(8) (normalise 2N + 2G, affine 2N; N = 32, G = 8)
    values = {row[0]: float(row[1]) for row in rows[1:]}
    assert values["flops"] == 2 * 4 * 16 * 8 + 4 * 32 + 2 * 8


# --------------------------------------------------------------------------- 21: the user's errors are exit 2


@pytest.mark.parametrize("args, says", [
    (("--seed", "99999999999999999999"), "--seed: must be at most 9223372036854775807"),
    (("--seed", "9223372036854775808"), "--seed: must be at most 9223372036854775807"),
    (("-i", "99999999999999999999x16"), "is beyond int64"),
    (("-i", "4611686018427387904x4"), "are beyond int64 bytes"),  # 2**62 x 4 float32: 2**66 bytes
])
def test_values_beyond_int64_are_usage_errors(workdir, capsys, args, says):
    full = ("count", "models.py:bn", *(args if args[0] == "-i" else ("-i", "4x16", *args)))
    code, out, err = cli(capsys, *full)
    assert code == 2 and out == ""
    assert says in err and "internal error" not in err and len(err.strip().splitlines()) == 1


def test_largest_int64_seed_runs(workdir, capsys):
    code, out, err = cli(capsys, "count", "models.py:bn", "-i", "4x16", "--seed", str(2**63 - 1), "-f", "json")
    assert code == 0, err


def test_plan_without_parameters_is_a_usage_error(workdir, capsys):
    code, out, err = cli(capsys, "plan", "models.py:NoParams", "-i", "2x4")
    assert code == 2 and out == ""
    assert "NoParams has no parameters" in err and "internal error" not in err


class _FailingStream:
    def __init__(self, errno_: int) -> None:
        self.errno = errno_

    def write(self, text: str) -> int:
        import os

        raise OSError(self.errno, os.strerror(self.errno))

    def flush(self) -> None:
        pass


@pytest.mark.parametrize("errno_name", ["ENOSPC", "EPIPE"])
def test_stdout_write_failure_is_a_usage_error(workdir, capsys, monkeypatch, errno_name):
    import errno
    import sys

    monkeypatch.setattr(sys, "stdout", _FailingStream(getattr(errno, errno_name)))
    code = main(["count", "models.py:bn", "-i", "4x16"])
    err = capsys.readouterr().err
    assert code == 2
    assert "writing the report to stdout failed" in err and "internal error" not in err


def test_stdout_on_a_full_device_exits_2_with_one_line(workdir, fresh_python):
    import os
    import subprocess
    import sys

    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    # python -m flopcount in a child forked from a process that imported torch (the flush at exit
    # as the interpreter does it: a failure there exits 120)
    with open("/dev/full", "w") as full:
        done = fresh_python.run([sys.executable, "-m", "flopcount", "count", "models.py:bn", "-i", "4x16", "-q"],
                              stdout=full, stderr=subprocess.PIPE, text=True, env=env, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == ["flopcount: error: writing the report to stdout failed: No space left on "
                                                "device; --output FILE writes it to a file"]


# --------------------------------------------------------------------------- 22: --timeout


def _process_state():
    import signal

    import torch
    from conftest import _global_hooks

    # (the RNG is not compared: the factories draw their initial weights from it)
    return (_global_hooks(), signal.getsignal(signal.SIGALRM), signal.getitimer(signal.ITIMER_REAL),
            torch.is_grad_enabled(), torch.is_inference_mode_enabled())


@pytest.mark.parametrize("command, entry, what", [
    ("count", "models.py:slow_factory", "the import and construction of the model (models.py:slow_factory"),
    ("count", "models.py:Sleeper", "the forward of models.py:Sleeper (counting, tracer auto)"),
    ("bench", "models.py:slow_factory", "the import and construction of the model"),
    ("check", "models.py:Sleeper", "the forward of models.py:Sleeper"),
    ("profile", "models.py:slow_factory", "the import and construction of the model"),
    ("plan", "models.py:slow_factory", "the plan of models.py:slow_factory (its factory on the meta device"),
])
def test_timeout_names_what_was_running(workdir, capsys, command, entry, what):
    import importlib
    import time

    # A timeout that lands inside a first import leaves that package half-imported in this
    # process (harmless for the CLI, whose process ends; not for the tests after this one):
    # import what the commands load lazily first, so the alarm lands in the model's sleep.
    for name in ("sympy", "torch._subclasses.fake_tensor", "torch.profiler", "torch.distributed.fsdp",
                 "torch.distributed.tensor.parallel", "flopcount.planning.plan", "flopcount.memory.estimate", "flopcount.counting.count",
                 "flopcount.profiling.run", "flopcount.bench.latency", "flopcount.report"):
        importlib.import_module(name)
    assert cli(capsys, "count", "models.py:bn", "-i", "4x16")[0] == 0
    before = _process_state()
    extra = ("--max-params", "1G") if command == "check" else ()
    started = time.monotonic()
    code, out, err = cli(capsys, command, entry, "-i", "2x4", "--timeout", "0.5", *extra)
    elapsed = time.monotonic() - started
    assert code == 2 and out == ""
    line = err.strip().splitlines()[-1]
    assert line.startswith(f"flopcount: error: --timeout 0.5: flopcount {command} stopped after 0.5 s while ")
    assert what in line and line.endswith("was still running")
    assert elapsed < 30  # the sleeps are 60 s
    assert _process_state() == before


def test_timeout_that_does_not_expire_changes_nothing(workdir, capsys):
    before = _process_state()
    code, out, err = cli(capsys, "count", "models.py:bn", "-i", "4x16", "--timeout", "120", "-f", "json")
    assert code == 0, err
    assert json.loads(out)["flops"] == 2 * 4 * 16 * 8 + 4 * 32 + 2 * 8  # as test_bench_csv_header_has_units
    after = _process_state()
    assert after[:2] == before[:2] and after[2] == (0.0, 0.0)


@pytest.mark.parametrize("value", ["0", "-1", "soon"])
def test_bad_timeout_is_refused(workdir, capsys, value):
    code, out, err = cli(capsys, "count", "models.py:bn", "-i", "4x16", "--timeout", value)
    assert code == 2 and "--timeout" in err


# --------------------------------------------------------------------------- 15: cli.md's examples


def test_cli_md_csv_example_is_a_real_run(capsys):
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "cli.md").read_text()
    block = re.search(r"```console\n\$ flopcount (count example:vit_tiny [^\n]*--format csv[^\n]*)\n(.*?)```", doc, re.S)
    assert block is not None
    command, shown = block.group(1).split(), block.group(2)
    code, out, err = cli(capsys, *command)
    assert code == 0, err
    assert out == shown  # the documented rows are the real output
    rows = list(csv.DictReader(io.StringIO(out)))
    root = next(r for r in rows if r["module"] == "")
    children = [r for r in rows if r["depth"] == "1"]
    assert sum(int(r["flops"]) for r in children) <= int(root["flops"])
    assert sum(int(r["macs"]) for r in children) <= int(root["macs"])


def test_cli_md_counts_its_commands():
    from pathlib import Path

    from flopcount.cli.parser import build_parser

    doc = (Path(__file__).resolve().parents[2] / "docs" / "cli.md").read_text()
    commands = next(a for a in build_parser()._actions if a.dest == "command").choices
    words = {3: "three", 4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight"}
    assert f"has {words[len(commands)]} commands" in doc
    for name in commands:
        assert f"| `flopcount {name} " in doc  # ENTRY, A B (diff) or [DEVICE] (roofs)
