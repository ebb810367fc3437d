"""A new user's mistakes with the CLI, each answered by one line that names what is wrong and how
to say it instead (the audit of branch newuser, docs/performance.md). The counts where a run
succeeds are checked against hand-derived formulas."""

from __future__ import annotations

import json
import textwrap

import pytest
from _cli_run import MLP_SOURCE, cli, one_error_line

MODELS = MLP_SOURCE + textwrap.dedent(
    """
    class KwOnly(nn.Module):
        def __init__(self):
            super().__init__()
            self.l = nn.Linear(16, 8)

        def forward(self, *, x, scale=1.0):
            return self.l(x) * scale

    class DictIn(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(16, 32)

        def forward(self, batch):
            return self.a(batch["x"])

    def dict_in():
        return DictIn(), ({"x": torch.randn(4, 16)},)
    """
)

# KwOnly on x = 4x16: Linear(16, 8) then one multiply per output element
KW_MACS = 4 * 16 * 8
KW_FLOPS = 2 * KW_MACS + 4 * 8


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    (tmp_path / "models.py").write_text(MODELS)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_input_dtype_other_than_the_models_names_dtype_flag(workdir, capsys):
    """``--input 4x16:bf16`` on a float32 model fails in torch; the line says --dtype casts the model."""
    code, out, err = cli(capsys, "count", "models.py:Mlp", "--input", "4x16:bf16")
    line = one_error_line(code, out, err)
    assert "forward failed in module 'l1'" in line
    assert "the floating inputs are bfloat16 but the model's parameters are float32: --dtype bfloat16" in line


def test_input_dtype_with_dtype_flag_counts_the_same(workdir, capsys):
    code, out, err = cli(capsys, "count", "models.py:Mlp", "--input", "4x16:bf16", "--dtype", "bfloat16", "--format", "csv")
    assert code == 0, err
    root = out.splitlines()[1].split(",")
    assert root[5] == str(4 * 16 * 32 + 4 * 32 * 8)


def test_keyword_only_forward_is_shown_with_its_star(workdir, capsys):
    """A positional --input to ``forward(self, *, x, scale=1.0)``: the signature shown has the ``*``."""
    code, out, err = cli(capsys, "count", "models.py:KwOnly", "--input", "4x16")
    line = one_error_line(code, out, err)
    assert "KwOnly.forward(*, x, scale) of models.py:KwOnly: too many positional arguments" in line


def test_keyword_only_forward_counts_with_kwarg(workdir, capsys):
    code, out, err = cli(capsys, "count", "models.py:KwOnly", "--kwarg", "x=4x16", "--kwarg", "scale=float:2", "--format", "csv")
    assert code == 0, err
    root = out.splitlines()[1].split(",")
    assert (root[5], root[6]) == (str(KW_MACS), str(KW_FLOPS))


def test_bare_integer_kwarg_for_a_number_default_says_how_to_pass_the_number(workdir, capsys):
    """``--kwarg scale=2`` is a tensor of shape (2,): the forward's failure says to write int:2 or float:2."""
    code, out, err = cli(capsys, "count", "models.py:KwOnly", "--kwarg", "x=4x16", "--kwarg", "scale=2")
    line = one_error_line(code, out, err)
    assert "--kwarg scale=2 is a tensor of shape (2,), but forward's scale defaults to the number 1.0" in line
    assert "--kwarg scale=int:2 or scale=float:2" in line


def test_bare_integer_kwarg_that_runs_is_warned_about(workdir, capsys):
    """``scale=1`` broadcasts, so the forward runs: the count is printed and stderr says what was passed."""
    code, out, err = cli(capsys, "count", "models.py:KwOnly", "--kwarg", "x=4x16", "--kwarg", "scale=1", "--format", "csv")
    assert code == 0, err
    assert out.splitlines()[1].split(",")[5] == str(KW_MACS)
    assert err == ("flopcount: warning: --kwarg scale=1 is a tensor of shape (1,), but forward's scale defaults to the "
                   "number 1.0: for the number write --kwarg scale=int:1 or scale=float:1\n")
    code, out, err = cli(capsys, "count", "models.py:KwOnly", "--kwarg", "x=4x16", "--kwarg", "scale=1", "--quiet")
    assert code == 0 and err == ""


@pytest.mark.parametrize(
    "body, fragment",
    [
        ('[tool.flopcount]\nmax_params = "1k"\nmax-params = "2k"\n',
         "pyproject.toml [tool.flopcount]: 'max_params' and 'max-params' are the same key; keep one"),
        ('[tool.flopcount]\nmax-flop = "10G"\n', "unknown key 'max-flop'; did you mean max-flops?"),
        ('[tool.flopcounts]\nmax-params = "1k"\n', "pyproject.toml: [tool.flopcounts] is not read: flopcount's table is [tool.flopcount]"),
    ],
)
def test_budget_file_mistakes_exit_2_naming_them(workdir, capsys, body, fragment):
    (workdir / "pyproject.toml").write_text(body)
    code, out, err = cli(capsys, "check", "models.py:Mlp", "--input", "4x16", "--max-macs", "1G")
    line = one_error_line(code, out, err)
    assert fragment in line


def test_other_tool_tables_are_left_alone(workdir, capsys):
    (workdir / "pyproject.toml").write_text('[tool.ruff]\nline-length = 100\n[tool.flake8]\nx = 1\n')
    code, out, err = cli(capsys, "check", "models.py:Mlp", "--input", "4x16", "--max-params", "1k")
    assert code == 0, err
    assert "params    1.000 K       808  PASS" in out  # 16*32 + 32 + 32*8 + 8 = 808


def test_memory_budget_without_unit_names_the_flag_once(workdir, capsys):
    code, out, err = cli(capsys, "check", "models.py:Mlp", "--input", "4x16", "--max-memory", "16G")
    line = one_error_line(code, out, err)
    assert line.count("--max-memory") == 1
    assert "argument --max-memory: budget: '16G' is not a size" in line


def test_growth_allowance_typo_names_the_flag_once(workdir, capsys):
    code, out, err = cli(capsys, "check", "models.py:Mlp", "--input", "4x16", "--baseline", "a.json", "--max-growth", "flop=2%")
    line = one_error_line(code, out, err)
    assert line.count("--max-growth") == 1
    assert "argument --max-growth: allowance: unknown metric 'flop'; did you mean flops?" in line


def test_diff_of_two_different_models_says_so(workdir, capsys):
    for entry, name in (("models.py:Mlp", "a.json"), ("models.py:dict_in", "b.json")):
        args = ["count", entry, "--format", "json", "--output", name] + (["--input", "4x16"] if entry.endswith("Mlp") else [])
        code, _, err = cli(capsys, *args)
        assert code == 0, err
    code, out, err = cli(capsys, "diff", "a.json", "b.json")
    assert code == 0, err
    assert ("A and B are different models (Mlp -> DictIn): modules match by path and type, so each of A's modules "
            "reads removed and each of B's added") in out
    code, out, err = cli(capsys, "diff", "a.json", "a.json")
    assert code == 0 and "different models" not in out


def test_float_token_ids_name_the_embedding_and_the_int64_spec(workdir, capsys):
    """Token ids written without ``:int64`` reach an nn.Embedding as floats: the line says how to write them."""
    (workdir / "tokens.py").write_text(textwrap.dedent(
        """
        from torch import nn

        class Tokens(nn.Module):
            def __init__(self):
                super().__init__()
                self.emb = nn.Embedding(50, 8)
                self.proj = nn.Linear(8, 3)

            def forward(self, ids):
                return self.proj(self.emb(ids))
        """
    ))
    code, out, err = cli(capsys, "count", "tokens.py:Tokens", "--input", "2x5")
    line = one_error_line(code, out, err)
    assert "forward failed in module 'emb'" in line
    assert "'emb' is an Embedding: token ids are integers, give them as SPEC:int64 (--input 2x5:int64)" in line
    code, out, err = cli(capsys, "count", "tokens.py:Tokens", "--input", "2x5:int64", "--format", "csv")
    assert code == 0, err
    assert out.splitlines()[1].split(",")[5] == str(2 * 5 * 8 * 3)


def test_text_and_image_model_gets_images_by_default(workdir, capsys):
    """``hf:clip`` (a local tiny config here) is given pixel_values beside its token ids, and its
    token ids are clipped to the text model's positions: the count is the hand formula's."""
    transformers = pytest.importorskip("transformers")
    hidden, ffn, positions, image, patch, projection = 32, 64, 16, 32, 16, 8
    config = transformers.CLIPConfig(
        text_config={"hidden_size": hidden, "intermediate_size": ffn, "num_hidden_layers": 1, "num_attention_heads": 2,
                     "max_position_embeddings": positions, "vocab_size": 99, "bos_token_id": 0, "eos_token_id": 2},
        vision_config={"hidden_size": hidden, "intermediate_size": ffn, "num_hidden_layers": 1, "num_attention_heads": 2,
                       "image_size": image, "patch_size": patch},
        projection_dim=projection,
    )
    config.save_pretrained(workdir / "clip")
    code, out, err = cli(capsys, "count", "hf:./clip", "--format", "json")
    assert code == 0, err
    data = json.loads(out)
    assert data["inputs"] == f"(Tensor[1, {positions}] int64,) with kwargs {{pixel_values=Tensor[1, 3, {image}, {image}] float32}}"
    layer_per_token = 4 * hidden * hidden + 2 * hidden * ffn  # q, k, v, out projections and the MLP
    patches = (image // patch) ** 2
    vision_tokens = patches + 1  # + the class token
    vision = patches * 3 * patch * patch * hidden + vision_tokens * layer_per_token + 2 * vision_tokens**2 * hidden
    text = positions * layer_per_token + 2 * positions**2 * hidden
    projections = 2 * hidden * projection  # one pooled token per side
    logits = projection  # (1 x projection) @ (projection x 1)
    assert data["by_module"]["vision_model"]["macs"] == vision
    assert data["by_module"]["text_model"]["macs"] == text
    assert data["macs"] == vision + text + projections + logits


def test_check_against_the_baseline_of_another_model_warns(workdir, capsys):
    """A baseline written from another model and inputs still gates (params 544 -> 808 grew: exit 1),
    but stderr says the two are unlike; the same model's baseline says nothing."""
    for entry, name in (("models.py:Mlp", "a.json"), ("models.py:dict_in", "b.json")):
        args = ["count", entry, "--format", "json", "--output", name] + (["--input", "4x16"] if entry.endswith("Mlp") else [])
        code, _, err = cli(capsys, *args)
        assert code == 0, err
    code, out, err = cli(capsys, "check", "models.py:Mlp", "--input", "4x16", "--baseline", "b.json")
    assert code == 1, err
    rows = [" ".join(line.split()) for line in out.splitlines()]
    assert "params 544 808 +264 (+48.53%) +0 FAIL" in rows  # DictIn 16*32+32 = 544; Mlp 544 + 32*8+8 = 808
    assert err.splitlines()[:2] == [
        "flopcount: warning: --baseline b.json (A) and this count (B): A and B are different models (DictIn -> Mlp): "
        "modules match by path and type, so each of A's modules reads removed and each of B's added",
        "flopcount: warning: --baseline b.json (A) and this count (B): inputs differ: "
        "A ({'x': Tensor[4, 16] float32},), B (Tensor[4, 16] float32,)",
    ]
    code, out, err = cli(capsys, "check", "models.py:Mlp", "--input", "4x16", "--baseline", "a.json")
    assert code == 0 and err == ""


def test_top_level_help_names_every_kind_of_check(capsys):
    """``flopcount --help`` says what check compares: memory and --baseline too, as check --help does."""
    code, out, _ = cli(capsys, "--help")
    assert code == 0
    summary = " ".join(out.split())
    assert "check check budgets (params, FLOPs, MACs, size, latency, memory) or growth against a --baseline report" in summary


def test_nested_config_key_says_where_to_set_it(workdir, capsys):
    """``--config text_config.num_hidden_layers=1`` is KEY=VALUE in form: the line says nested
    fields are not set here, rather than 'expected KEY=VALUE'."""
    code, out, err = cli(capsys, "count", "models.py:Mlp", "--input", "4x16", "--config", "text_config.num_hidden_layers=1")
    line = one_error_line(code, out, err)
    assert "expected KEY=VALUE" not in line
    assert "a nested field such as text_config.num_hidden_layers is set in a config.json counted as hf:./folder" in line
