"""A new user's mistakes with the CLI, third audit (docs/performance.md, branch papercuts3):
``profile`` says what ``count`` says of a failing forward, a failure line names the tracer chosen,
and a memory budget without its unit is said to need one, as a latency budget is. Each error is
one line on stderr and exit 2."""

from __future__ import annotations

import textwrap

import pytest
from _cli_run import MLP_SOURCE, cli, one_error_line

MODELS = MLP_SOURCE + textwrap.dedent(
    """
    class Tokens(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(10, 8)

        def forward(self, ids):
            return self.emb(ids)
    """
)

# Mlp's weights, float32: Linear(16, 32) and Linear(32, 8) with biases
MLP_WEIGHT_BYTES = 4 * (16 * 32 + 32 + 32 * 8 + 8)


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    (tmp_path / "models.py").write_text(MODELS)
    monkeypatch.chdir(tmp_path)
    return tmp_path


PROFILE = ("profile", "--warmup", "1", "--steps", "1", "--roofs", "1e11,1e10", "-q")  # given roofs: nothing measured


@pytest.mark.parametrize(
    "argv, says",
    [
        (["models.py:Mlp", "-i", "4x16:bf16"],
         "forward failed in module 'l1' (profile) with inputs (Tensor[4, 16] bfloat16,): RuntimeError: "),
        (["models.py:Tokens", "-i", "4x8"], "forward failed in module 'emb' (profile) with inputs (Tensor[4, 8] float32,): "),
        (["models.py:Mlp", "-i", "4x15"], "forward failed in module 'l1' (profile) with inputs (Tensor[4, 15] float32,): "
         "RuntimeError: mat1 and mat2 shapes cannot be multiplied (4x15 and 16x32)"),
    ],
    ids=["dtype", "float-ids", "shape"],
)
def test_profile_names_the_module_as_count_does(workdir, capsys, argv, says):
    """Before: "RuntimeError: ..." alone, without the module or the inputs."""
    code, out, err = cli(capsys, *PROFILE, *argv)
    line = one_error_line(code, out, err)
    assert says in line


@pytest.mark.parametrize(
    "argv, hint",
    [
        (["models.py:Mlp", "-i", "4x16:bf16"], "the floating inputs are bfloat16 but the model's parameters are float32: --dtype bfloat16"),
        (["models.py:Tokens", "-i", "4x8"], "'emb' is an Embedding: token ids are integers, give them as SPEC:int64 (--input 4x8:int64)"),
    ],
    ids=["dtype", "float-ids"],
)
def test_profile_gives_counts_hints(workdir, capsys, argv, hint):
    code, out, err = cli(capsys, *PROFILE, *argv)
    assert hint in one_error_line(code, out, err)


def test_a_default_count_names_its_tracer_auto(workdir, capsys):
    """Before: "(dispatch tracer)" for the default count's failing real run; --tracer auto is the default's name."""
    code, out, err = cli(capsys, "count", "models.py:Mlp", "-i", "4x15")
    assert "forward failed in module 'l1' (auto tracer) with inputs" in one_error_line(code, out, err)
    code, out, err = cli(capsys, "count", "models.py:Mlp", "-i", "4x15", "--tracer", "dispatch")
    assert "forward failed in module 'l1' (dispatch tracer) with inputs" in one_error_line(code, out, err)


def test_a_bare_memory_budget_is_said_to_need_its_unit(workdir, capsys):
    """``--max-memory 16`` is 16 bytes (documented, kept until 0.4): the line says so and what to write,
    as ``--max-latency 10`` is refused for want of its unit. The weights alone are over 16 bytes: FAIL."""
    code, out, err = cli(capsys, "check", "models.py:Mlp", "-i", "4x16", "--max-memory", "16")
    assert code == 1, err
    assert ("--max-memory: a bare 16 (read as 16 bytes) is deprecated and will be removed in flopcount 0.4; use the "
            "unit in the value, as a latency budget has it (10ms): 16B for bytes, or e.g. 16GB") in err
    code, out, err = cli(capsys, "check", "models.py:Mlp", "-i", "4x16", "--max-memory", "16B")
    assert code == 1 and "bare" not in err


def test_a_bare_memory_budget_in_a_file_is_said_to_need_its_unit(workdir, capsys):
    (workdir / "budget.toml").write_text(f"[tool.flopcount]\nmax-memory = {MLP_WEIGHT_BYTES - 1}\n")
    code, out, err = cli(capsys, "check", "models.py:Mlp", "-i", "4x16", "--config-file", "budget.toml")
    assert code == 1, err  # one byte under the weights alone: a certain FAIL
    assert (f"budget.toml [tool.flopcount]: max-memory: a bare {MLP_WEIGHT_BYTES - 1} (read as {MLP_WEIGHT_BYTES - 1:,} bytes) "
            "is deprecated") in err
    (workdir / "budget.toml").write_text('[tool.flopcount]\nmax-memory = "16GiB"\n')
    code, out, err = cli(capsys, "check", "models.py:Mlp", "-i", "4x16", "--config-file", "budget.toml")
    assert code == 0 and "bare" not in err


# the fresh-eyes pass over predict, plan, serve, diff, profile, bench, memory and --generate

TINY_GPT2 = ("hf:gpt2", "--config", "n_layer=1", "--config", "n_embd=64", "--config", "n_head=4", "-q")


def test_plan_calls_an_unknown_part_a_part(workdir, capsys):
    """Before: "on: unknown GPU 'h100x' (...; or None for no step times)", Python's None on the command line."""
    code, out, err = cli(capsys, "plan", "models.py:Mlp", "-i", "4x16", "--fsdp", "2", "--on", "h100x")
    line = one_error_line(code, out, err)
    assert "unknown part 'h100x'; known parts: H100 SXM" in line and "GPU" not in line and "None" not in line


def test_a_list_of_parts_where_one_goes_says_so(workdir, capsys):
    """Before: "unknown part 'h100,t4'", though both are known parts (serve's --on takes the list)."""
    code, out, err = cli(capsys, "count", "models.py:Mlp", "-i", "4x16", "--on", "h100,t4")
    line = one_error_line(code, out, err)
    assert "'h100,t4' names 2 parts; one part goes here (serve compares several: serve --on h100,t4)" in line


@pytest.mark.parametrize("alias", ["bf16", "BF16"])
def test_dtype_takes_the_short_names_a_spec_takes(workdir, capsys, alias):
    """``--input 4x16:bf16`` is a SPEC; ``--dtype bf16`` was "invalid choice". bfloat16 weights:
    808 parameters x 2 bytes (Linear(16, 32) and Linear(32, 8) with biases)."""
    code, out, err = cli(capsys, "count", "models.py:Mlp", "-i", "4x16", "--dtype", alias, "-f", "json", "-q")
    assert code == 0, err
    import json

    report = json.loads(out)
    assert report["params"] == 16 * 32 + 32 + 32 * 8 + 8 and report["size_bytes"] == 2 * report["params"]
    assert report["inputs"] == "(Tensor[4, 16] bfloat16,)"


def test_generate_refuses_a_tracer_it_does_not_use(workdir, capsys):
    """Before: ``--generate 2 --tracer jit`` counted with the dispatch tracer, the flag unread."""
    code, out, err = cli(capsys, "count", *TINY_GPT2, "--input", "1x8:int64", "--generate", "2", "--tracer", "jit")
    assert "--generate counts every forward with the dispatch tracer" in one_error_line(code, out, err)


def test_generate_with_float_token_ids_gives_counts_hint(workdir, capsys):
    code, out, err = cli(capsys, "count", *TINY_GPT2, "--input", "1x8", "--generate", "2")
    line = one_error_line(code, out, err)
    assert "forward failed in module 'transformer.wte'" in line
    assert "'transformer.wte' is an Embedding: token ids are integers, give them as SPEC:int64 (--input 1x8:int64)" in line


@pytest.mark.parametrize("suffix, kind", [("csv", "CSV"), ("md", "markdown")])
def test_diff_of_a_report_in_another_format_names_json(workdir, capsys, suffix, kind):
    """Before: "bad ENTRY: mlp.csv is not a model file (not a zip archive); flopcount reads torch.export programs ..."."""
    code, out, err = cli(capsys, "count", "models.py:Mlp", "-i", "4x16", "-o", f"mlp.{suffix}", "-q")
    assert code == 0, err
    code, out, err = cli(capsys, "diff", f"mlp.{suffix}", "models.py:Mlp", "-i", "4x16")
    line = one_error_line(code, out, err)
    assert f"A = mlp.{suffix} is a {kind} report: diff reads reports saved as JSON" in line
