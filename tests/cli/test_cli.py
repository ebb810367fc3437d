"""The flopcount command, end to end: main([...]) in-process (exit code, stdout, stderr), and
one console-script subprocess smoke for what a user runs. Numbers are checked against hand-derived formulas."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from _cli_run import cli

# Linear(16, 32) -> ReLU -> Linear(32, 8) on a 4x16 input
B, D_IN, D_HID, D_OUT = 4, 16, 32, 8
MACS_FC1 = B * D_IN * D_HID
MACS_FC2 = B * D_HID * D_OUT
PARAMS = D_IN * D_HID + D_HID + D_HID * D_OUT + D_OUT

MODELS = textwrap.dedent(
    """
    import torch
    from torch import nn

    class MLP(nn.Module):
        def __init__(self, d_in=16, d_hidden=32, d_out=8):
            super().__init__()
            self.fc1 = nn.Linear(d_in, d_hidden)
            self.act = nn.ReLU()
            self.fc2 = nn.Linear(d_hidden, d_out)

        def forward(self, x):
            return self.fc2(self.act(self.fc1(x)))

    class Broken(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.Sequential(nn.Linear(4, 4), nn.Linear(5, 5))

        def forward(self, x):
            return self.blocks(x)

    class Tokens(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(50, 8)
            self.proj = nn.Linear(8, 3)

        def forward(self, ids, mask=None):
            out = self.proj(self.emb(ids))
            if mask is not None:
                assert bool((mask == 1).all()), "masks are ones"
                out = out * mask.unsqueeze(-1)
            return out

    model = MLP()
    not_a_module = 42

    def mlp(d_hidden=32):
        return MLP(d_hidden=d_hidden)

    def mlp_with_inputs():
        return MLP(), (torch.randn(4, 16),)

    def tokens_with_kwargs():
        return Tokens(), (torch.randint(0, 50, (2, 5)),), {"mask": torch.ones(2, 5)}

    def tokens():
        return Tokens()

    def raises():
        raise RuntimeError("weights are missing")

    def returns_text():
        return "not a model"

    def broken():
        return Broken()
    """
)


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    (tmp_path / "models.py").write_text(MODELS)
    (tmp_path / "syntax_error.py").write_text("def f(:\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path




# --------------------------------------------------------------------------- end to end


def test_count_json_end_to_end(workdir, capsys):
    code, out, err = cli(capsys, "count", "models.py:mlp", "--input", "4x16", "--format", "json")
    assert code == 0, err
    data = json.loads(out)
    assert data["macs"] == MACS_FC1 + MACS_FC2
    assert data["params"] == PARAMS
    assert data["flops"] == 2 * data["macs"] + B * D_HID  # + the ReLU on (4, 32); fused biases are free
    assert data["entry"] == "models.py:mlp"
    modules = data["by_module"]
    assert modules["fc1"]["macs"] == MACS_FC1 and modules["fc2"]["macs"] == MACS_FC2
    # invariant: the model's FLOPs are its children's (nothing runs outside them)
    assert data["flops"] == sum(modules[name]["flops"] for name in ("fc1", "act", "fc2"))
    assert data["by_operator"] and "unsupported_ops" in data
    assert data["size_bytes"] == PARAMS * 4


def test_count_table_is_the_default_and_the_console_script_works(workdir):
    script = Path(sys.executable).with_name("flopcount")
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "flopcount"]
    proc = subprocess.run([*cmd, "count", "models.py:model", "--input", "4x16", "--depth", "1"],
                          cwd=workdir, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split() == ["Module", "Type", "Params", "MACs", "FLOPs", "FLOPs", "%"]
    fc1 = next(line for line in lines if line.startswith("fc1"))
    assert f"{MACS_FC1 / 1000:.3f} K" in fc1  # 2.048 K MACs
    assert "1 MAC = 2 FLOPs" in proc.stdout


def test_check_exits_1_naming_the_budget_and_reads_pyproject(workdir, capsys):
    (workdir / "pyproject.toml").write_text(f'[tool.flopcount]\nmax-params = "{PARAMS}"\nmax-macs = "1K"\n')
    code, out, err = cli(capsys, "check", "models.py:mlp", "--input", "4x16")
    assert code == 1, err
    assert "FAIL" in out and "PASS" in out  # params == limit passes
    assert "budget exceeded" in err and "macs" in err and "params" not in err
    # a flag wins over the file
    code, out, err = cli(capsys, "check", "models.py:mlp", "--input", "4x16", "--max-macs", "3.1K", "--format", "json")
    assert code == 0, err
    budget = json.loads(out)["budget"]
    assert budget["passed"] is True
    assert {line["name"]: line["limit"] for line in budget["lines"]} == {"params": PARAMS, "macs": 3100}


def test_bench_json_has_figures_and_progress_stays_on_stderr(workdir, capsys):
    code, out, err = cli(capsys, "bench", "models.py:mlp", "--input", "4x16", "--warmup", "2", "--iters", "7", "--format", "json")
    assert code == 0, err
    data = json.loads(out)  # nothing but the JSON object on stdout
    assert data["macs"] == MACS_FC1 + MACS_FC2
    bench = data["benchmark"]
    assert bench["iters"] == 7 and bench["warmup"] == 2
    assert bench["min_s"] <= bench["median_s"] <= bench["max_s"]
    assert "benchmarking" in err


def test_error_is_one_line_without_traceback_and_debug_shows_it(workdir, capsys):
    code, out, err = cli(capsys, "count", "models.py:broken", "--input", "2x4")
    assert code == 2
    assert err.strip().count("\n") == 0
    assert "blocks.1" in err and "Traceback" not in err
    code, out, err = cli(capsys, "count", "models.py:broken", "--input", "2x4", "--debug")
    assert code == 2 and "Traceback" in err


@pytest.mark.parametrize("command", [None, "count", "bench", "check"])
def test_help_is_complete_with_examples(capsys, command):
    code, out, _ = cli(capsys, *([command] if command else []), "--help")
    assert code == 0
    assert "examples:" in out
    if command:
        for flag in ("--input", "--kwarg", "--config", "--device", "--format", "--output", "--depth", "--plot", "--debug"):
            assert flag in out
        assert "hf:" in out and "Exit codes" in out
    if command == "check":
        assert "[tool.flopcount]" in out and "--max-latency-ms" in out
    if command == "bench":
        assert "--warmup" in out and "--iters" in out and "--dtype" in out


# --------------------------------------------------------------------------- in-process


def test_formats(workdir, capsys):
    code, out, _ = cli(capsys, "count", "models.py:mlp", "-i", "4x16", "--format", "csv")
    assert code == 0
    rows = {line.split(",")[0]: line.split(",") for line in out.splitlines()[1:]}
    assert int(rows["fc1"][5]) == MACS_FC1 and int(rows[""][4]) == PARAMS
    code, out, _ = cli(capsys, "count", "models.py:mlp", "-i", "4x16", "--format", "markdown", "--operators")
    assert code == 0 and out.startswith("| Module") and "| aten::" in out
    code, out, _ = cli(capsys, "count", "models.py:mlp", "-i", "4x16", "--format", "tree")
    assert code == 0 and out.startswith("MLP") and "(fc1): Linear" in out
    code, out, _ = cli(capsys, "count", "models.py:mlp", "-i", "4x16", "--operators")
    assert code == 0 and "Operator" in out and out.count("Total:") == 1


def test_output_file(workdir, capsys):
    code, out, _ = cli(capsys, "count", "models.py:mlp", "-i", "4x16", "-f", "json", "-o", "models.py/r.json")
    assert code == 2  # models.py is a file, not a folder (a missing folder is made: branch papercuts5)
    code, out, err = cli(capsys, "count", "models.py:mlp", "-i", "4x16", "-f", "json", "-o", "r.json")
    assert code == 0 and out == "" and "wrote r.json" in err
    assert json.loads((workdir / "r.json").read_text())["macs"] == MACS_FC1 + MACS_FC2


def test_factory_inputs_kwargs_config_and_token_ids(workdir, capsys):
    code, out, _ = cli(capsys, "count", "models.py:mlp_with_inputs", "-f", "json")
    assert code == 0 and json.loads(out)["macs"] == MACS_FC1 + MACS_FC2
    code, out, _ = cli(capsys, "count", "models.py:tokens_with_kwargs", "-f", "json")
    assert code == 0 and json.loads(out)["macs"] == 2 * 5 * 8 * 3
    # integer SPEC inputs are valid token ids; integer masks are ones
    code, out, err = cli(capsys, "count", "models.py:tokens", "-i", "3x40:int64", "--kwarg", "mask=3x40:int64", "-f", "json")
    assert code == 0, err
    assert json.loads(out)["macs"] == 3 * 40 * 8 * 3
    # --config becomes the factory's keyword arguments
    code, out, _ = cli(capsys, "count", "models.py:mlp", "-i", "4x16", "--config", "d_hidden=10", "-f", "json")
    assert code == 0 and json.loads(out)["macs"] == B * D_IN * 10 + B * 10 * D_OUT


def test_module_path_entry(workdir, capsys):
    code, out, _ = cli(capsys, "count", "models:MLP", "-i", "4x16", "-f", "json")
    assert code == 0 and json.loads(out)["params"] == PARAMS


def test_meta_device_counts_without_data(workdir, capsys):
    code, out, err = cli(capsys, "count", "models.py:mlp", "-i", "4x16", "--device", "meta", "-f", "json")
    assert code == 0, err
    data = json.loads(out)
    assert data["macs"] == MACS_FC1 + MACS_FC2 and data["tracer"] == "dispatch"


def test_check_on_size_and_latency(workdir, capsys):
    code, out, err = cli(capsys, "check", "models.py:mlp", "-i", "4x16", "--max-size-mb", "0.001",
                         "--max-latency-ms", "10000", "--iters", "3", "--warmup", "1")
    assert code == 1
    exceeded = next(line for line in err.splitlines() if "budget exceeded" in line)
    assert "size_mb" in exceeded and "latency" not in exceeded
    size_line = next(line for line in out.splitlines() if line.startswith("size_mb"))
    assert f"{PARAMS * 4 / 1e3:.2f} kB" in size_line and "FAIL" in size_line  # 1 kB = 10^3 bytes


def test_hf_shortcut_builds_from_config_without_download(workdir, capsys):
    pytest.importorskip("transformers")
    code, out, err = cli(capsys, "count", "hf:gpt2", "--config", "n_layer=1", "--config", "n_embd=64", "--config", "n_head=2",
                         "--config", "vocab_size=100", "--config", "n_positions=64", "--device", "meta", "-f", "json")
    assert code == 0, err
    data = json.loads(out)
    assert "Tensor[1, 64] int64" in data["inputs"]  # default 1x128 token ids, clipped to n_positions
    # the LM head alone: tokens x n_embd x vocab
    assert data["by_module"]["lm_head"]["macs"] == 64 * 64 * 100


def test_plot(workdir, capsys):
    pytest.importorskip("matplotlib")
    code, _, err = cli(capsys, "bench", "models.py:mlp", "-i", "4x16", "--iters", "20", "--warmup", "1", "--plot", "p.png", "-q")
    assert code == 0, err
    assert (workdir / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_without_matplotlib(workdir, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    code, _, err = cli(capsys, "count", "models.py:mlp", "-i", "4x16", "--plot", "p.png")
    assert code == 2 and "install flopcount[plot]" in err
    assert not (workdir / "p.png").exists()


def test_top_modules_add_up_to_the_total(workdir):
    from flopcount import count_flops
    from flopcount.report.plot import top_modules

    model = torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(5)])
    result = count_flops(model, torch.randn(2, 8))
    bars = top_modules(result, top=3)
    assert len(bars) == 4 and bars[-1][0].startswith("other (2 modules)")
    assert sum(value for _, value in bars) == result.flops


BAD_INPUTS = [
    # (argv, fragment of the one-line message)
    (["count", "no_such_module_xyz:model", "-i", "4x16"], "no module named 'no_such_module_xyz'"),
    (["count", "missing.py:model", "-i", "4x16"], "file not found: missing.py"),
    (["count", "models.py:nope", "-i", "4x16"], "has no attribute 'nope'"),
    (["count", "models.py", "-i", "4x16"], "no ':attr' part"),
    (["count", "models.py:not_a_module", "-i", "4x16"], "not an nn.Module"),
    (["count", "models.py:raises"], "model construction failed"),
    (["count", "models.py:returns_text"], "returned an object of type str"),
    (["count", "syntax_error.py:f"], "SyntaxError"),
    (["count", "models.py:mlp", "-i", "4x"], "bad input SPEC '4x'"),
    (["count", "models.py:mlp", "-i", "4xa"], "dimension 'a' is not an integer"),
    (["count", "models.py:mlp", "-i", "4x16:float8"], "unknown dtype 'float8'"),
    (["count", "models.py:mlp", "-i", "0x16"], "dimension 0 must be >= 1"),
    (["count", "models.py:mlp", "--input=-1x16"], "dimension -1 must be >= 1"),
    (["count", "models.py:mlp", "--input="], "empty"),
    (["count", "models.py:mlp", "-i", "4x16", "-i", "4x16"], "too many positional arguments"),
    (["count", "models.py:mlp"], "missing a required argument: 'x'"),
    (["count", "models.py:mlp", "-i", "4x16", "--format", "yaml"], "invalid choice: 'yaml'"),
    (["count", "models.py:mlp", "-i", "4x16", "-o", "models.py/out.json"], "models.py is a file, not a folder"),
    (["count", "models.py:mlp", "-i", "4x16", "-o", "."], "is a directory"),
    (["count", "models.py:mlp", "-i", "4x16", "--device", "tpu"], "not a device"),
    (["count", "models.py:mlp", "-i", "4x16", "--device", "meta", "--tracer", "jit"], "needs the dispatch tracer"),
    (["count", "models.py:broken", "-i", "2x4"], "blocks.1"),
    (["count", "models.py:mlp", "-i", "4x16", "--kwarg", "3d=4x16"], "expected NAME=SPEC"),
    (["count", "models.py:mlp", "-i", "4x16", "--config", "d_hidden"], "expected KEY=VALUE"),
    (["count", "models.py:mlp", "-i", "4x16", "--config", "width=3"], "unexpected keyword argument 'width'"),
    (["count", "models.py:model", "-i", "4x16", "--config", "d_hidden=3"], "--config needs a factory"),
    (["count", "models.py:mlp", "-i", "4x16", "--depth", "-1"], "--depth"),
    (["count", "models.py:mlp", "-i", "4x16", "--tracer", "fast"], "invalid choice: 'fast'"),
    (["count", "models.py:mlp", "-i", "4x16", "--plot", "p.txt"], "unsupported image type 'txt'"),
    (["bench", "models.py:mlp", "-i", "4x16", "--device", "meta"], "meta device"),
    (["bench", "models.py:mlp", "-i", "4x16", "--iters", "0"], "--iters"),
    (["check", "models.py:mlp", "-i", "4x16"], "no budgets"),
    (["check", "models.py:mlp", "-i", "4x16", "--max-flops", "5Q"], "'5Q' is not a number"),
    (["check", "models.py:mlp", "-i", "4x16", "--max-flops", "1", "--config-file", "nope.toml"], "config file not found"),
    (["count", "hf:gtp2"], "did you mean gpt2"),
    ([], "COMMAND"),
]


@pytest.mark.parametrize("argv, fragment", BAD_INPUTS, ids=[" ".join(a[0][1:3]) + f"#{i}" for i, a in enumerate(BAD_INPUTS)])
def test_bad_input_exits_2_with_one_line(workdir, capsys, argv, fragment):
    if argv[:2] == ["count", "hf:gtp2"]:
        pytest.importorskip("transformers")
    code, out, err = cli(capsys, *argv)
    assert code == 2
    assert fragment in err
    assert "Traceback" not in err
    if argv:
        assert err.strip().count("\n") == 0, err
        assert out == ""


@pytest.mark.parametrize(
    "body, fragment",
    [
        ('[tool.flopcount]\nmax-parms = "1K"\n', "unknown key 'max-parms'"),
        ("[tool.flopcount]\nmax-params = [1]\n", "max-params must be a number"),
        ("[tool.flopcount\n", "not valid TOML"),
    ],
)
def test_malformed_pyproject_exits_2(workdir, capsys, body, fragment):
    (workdir / "pyproject.toml").write_text(body)
    code, _, err = cli(capsys, "check", "models.py:mlp", "-i", "4x16")
    assert code == 2 and fragment in err and "pyproject.toml" in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_gpu(workdir, capsys):
    code, _, err = cli(capsys, "count", "models.py:mlp", "-i", "4x16", "--device", "cuda")
    assert code == 2 and "CUDA is not available" in err


def test_torchvision_shortcut_names_the_missing_package_or_model(workdir, capsys):
    code, _, err = cli(capsys, "count", "tv:not_a_real_net")
    assert code == 2
    assert "torchvision" in err
