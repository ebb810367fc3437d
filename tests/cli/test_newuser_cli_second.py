"""A new user's mistakes with the CLI, second audit (docs/performance.md, branch newuser of
2026-11-28's evening): a TorchScript model from a factory, flags named once, every budget flag
named. Each is one line on stderr and exit 2, never the internal-error exit 4."""

from __future__ import annotations

import textwrap

import pytest
from _cli_run import MLP_SOURCE, cli, one_error_line

MODELS = MLP_SOURCE + textwrap.dedent(
    """
    import warnings

    def on_meta():
        with torch.device("meta"):
            return Mlp()

    def scripted():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            return torch.jit.script(Mlp())
    """
)

# Mlp on 4x16: Linear(16, 32) then Linear(32, 8)
MLP_MACS = 4 * 16 * 32 + 4 * 32 * 8


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    (tmp_path / "models.py").write_text(MODELS)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_jit_on_a_scripted_factory_reads_its_graph(workdir, capsys):
    """Before: exit 4, "internal error in flopcount ... get_submodule is not supported on ScriptModules"
    (the dtype hint looked the failing module up with get_submodule); then a refusal ("cannot trace a
    TorchScript module again"); since branch jitrows the program's graph, each Linear on its row."""
    code, out, err = cli(capsys, "count", "models.py:scripted", "--input", "4x16", "--tracer", "jit", "--format", "csv")
    assert code == 0, err
    rows = {line.split(",")[0]: line.split(",") for line in out.splitlines()[1:]}
    assert int(rows[""][5]) == MLP_MACS and int(rows["l1"][5]) == 4 * 16 * 32 and int(rows["l2"][5]) == 4 * 32 * 8


@pytest.mark.parametrize("tracer", ["auto", "jit"])
def test_a_scripted_model_given_the_wrong_shape_fails_under_either_tracer(workdir, capsys, tracer):
    """The graph's shape analysis does not check a Linear's width: the program still runs first."""
    code, out, err = cli(capsys, "count", "models.py:scripted", "--input", "4x15", "--tracer", tracer)
    line = one_error_line(code, out, err)
    assert "forward failed in the root module (model)" in line


def test_a_scripted_model_given_the_wrong_shape_names_the_failing_call(workdir, capsys):
    code, out, err = cli(capsys, "count", "models.py:scripted", "--input", "4x15")
    line = one_error_line(code, out, err)
    assert "forward failed in the root module (model)" in line
    assert "(in TorchScript, File " in line and "F.linear(input, self.weight, self.bias)" in line


def test_a_scripted_model_counts_each_layer_on_its_row(workdir, capsys):
    """Before branch jitrows: the root row held every MAC, the layers' rows 0, and a warning said so."""
    code, out, err = cli(capsys, "count", "models.py:scripted", "--input", "4x16", "--format", "csv")
    assert code == 0, err
    rows = {line.split(",")[0]: line.split(",") for line in out.splitlines()[1:]}
    assert int(rows[""][5]) == MLP_MACS and int(rows["l1"][5]) == 4 * 16 * 32 and int(rows["l2"][5]) == 4 * 32 * 8
    assert "TorchScript runs the submodules" not in err


@pytest.mark.parametrize(
    "argv, says",
    [
        (["bench", "models.py:Mlp", "-i", "4x16", "--duration", "-1"], "argument --duration: must be > 0, got '-1'"),
        (["count", "models.py:Mlp", "-i", "4x16", "--timeout", "0"], "argument --timeout: must be > 0, got '0'"),
        (["bench", "models.py:Mlp", "-i", "4x16", "--duration", "soon"], "argument --duration: must be a number, got 'soon'"),
    ],
)
def test_a_bad_number_names_its_flag_once(workdir, capsys, argv, says):
    code, out, err = cli(capsys, *argv)
    line = one_error_line(code, out, err)
    assert says in line
    assert line.count(argv[-2]) == 1, line


def test_check_without_budgets_names_the_latency_flag_with_its_unit(workdir, capsys):
    """README's latency gate is ``--max-latency 10ms``; the list named only ``--max-latency-ms``."""
    code, out, err = cli(capsys, "check", "models.py:Mlp", "-i", "4x16")
    line = one_error_line(code, out, err)
    assert "--max-latency (or --max-latency-ms)" in line


def test_an_unknown_part_on_the_command_line_is_called_a_part(workdir, capsys):
    code, out, err = cli(capsys, "count", "models.py:Mlp", "-i", "4x16", "--on", "h1000")
    line = one_error_line(code, out, err)
    assert "unknown part 'h1000'; known parts: H100 SXM" in line


@pytest.mark.parametrize(
    "flag, value, bare",
    [("--max-flops", "10 GFLOPs", "10G"), ("--max-macs", "4.000 GMACs", "4.000G"), ("--max-params", "25M params", "25M")],
)
def test_a_budget_with_the_unit_the_table_prints_says_to_leave_it_out(workdir, capsys, flag, value, bare):
    """The budget table prints "4.000 GMACs"; written back as a limit it was only "is not a number"."""
    code, out, err = cli(capsys, "check", "models.py:Mlp", "-i", "4x16", flag, value)
    line = one_error_line(code, out, err)
    assert f"{value!r} is not a number: give it without the unit" in line and f"e.g. {bare}" in line


def test_a_budget_file_with_a_unit_says_to_leave_it_out(workdir, capsys):
    (workdir / "budget.toml").write_text('[tool.flopcount]\nmax-flops = "10 GFLOPs"\n')
    code, out, err = cli(capsys, "check", "models.py:Mlp", "-i", "4x16", "--config-file", "budget.toml")
    line = one_error_line(code, out, err)
    assert "budget.toml [tool.flopcount]: max-flops: '10 GFLOPs' is not a number: give it without the unit" in line


def test_the_bare_budget_still_counts(workdir, capsys):
    code, out, err = cli(capsys, "check", "models.py:Mlp", "-i", "4x16", "--max-macs", f"{MLP_MACS - 1}")
    assert code == 1 and "macs" in err  # one MAC under the hand count: a certain FAIL


def test_a_model_built_on_meta_given_cpu_inputs_names_the_device_flag(workdir, capsys):
    """The real run of --tracer dispatch meets torch's device check; the line adds the flag that fixes it."""
    code, out, err = cli(capsys, "count", "models.py:on_meta", "-i", "4x16", "--tracer", "dispatch")
    line = one_error_line(code, out, err)
    assert "the inputs are on cpu but the model's parameters are on meta: --device meta makes the inputs there" in line
    code, out, err = cli(capsys, "count", "models.py:on_meta", "-i", "4x16", "--tracer", "dispatch", "--device", "meta", "-f", "csv")
    assert code == 0, err
    assert int(out.splitlines()[1].split(",")[5]) == MLP_MACS


def test_an_example_given_another_input_says_its_own(workdir, capsys):
    """example:vit_tiny takes 32x32 images; at 224x224 its position embedding does not fit (torch's
    "size of tensor a (785) must match ... (17)": 1 + (224/8)^2 patches vs 1 + (32/8)^2)."""
    code, out, err = cli(capsys, "count", "example:vit_tiny", "--input", "2x3x224x224")
    line = one_error_line(code, out, err)
    assert "(785) must match the size of tensor b (17)" in line
    assert "example:vit_tiny's own input is --input 2x3x32x32 (leave --input out for it)" in line


def test_a_more_specific_hint_is_said_alone(workdir, capsys):
    """bfloat16 images on a float32 example: the --dtype hint, not the ENTRY's own input too."""
    code, out, err = cli(capsys, "count", "example:vit_tiny", "--input", "2x3x32x32:bf16")
    line = one_error_line(code, out, err)
    assert "--dtype bfloat16 casts the model" in line and "own input is" not in line
