"""A new user's rough edges, fifth pass (docs/performance.md, branch papercuts5): every path the CLI
writes makes its missing folders (``--tensorboard DIR`` always did; ``--output``/``--plot``/``--trace``
refused them) and a path that cannot be written is refused before the count; a negative budget is
called negative; serve builds its estimate sentence once. Each CLI error is one line, exit 2."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from _cli_run import MLP_SOURCE, cli, one_error_line

# the MLP of MLP_SOURCE on a 4 x 16 input: Linear 16 -> 32 and 32 -> 8, one MAC per weight and row
MACS = 4 * (16 * 32 + 32 * 8)


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    (tmp_path / "models.py").write_text(MLP_SOURCE + "\ndef mlp():\n    return Mlp()\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


# -- 1. output paths: one rule for --output, --plot, --trace and --tensorboard -------------------


def test_output_makes_its_missing_folders_as_tensorboard_does(workdir, capsys):
    """Before: '--output reports/run1/r.json: folder reports/run1 does not exist' (exit 2), while
    --tensorboard runs/x made its folders; docs/cli.md's own example writes docs/img/... ."""
    code, out, err = cli(capsys, "count", "models.py:mlp", "-i", "4x16", "-f", "json", "-o", "reports/run1/r.json")
    assert code == 0 and out == ""
    assert "wrote reports/run1/r.json (made the folder reports/run1)" in err
    assert json.loads((workdir / "reports" / "run1" / "r.json").read_text())["macs"] == MACS


def test_plot_makes_its_missing_folders(workdir, capsys):
    pytest.importorskip("matplotlib")
    code, _, err = cli(capsys, "count", "models.py:mlp", "-i", "4x16", "--plot", "docs/img/mlp.png")
    assert code == 0, err
    assert (workdir / "docs" / "img" / "mlp.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_tensorboard_dir_that_is_a_file_is_refused_before_the_count(workdir, capsys):
    """Before: the count printed its table on stdout, then '--tensorboard models.py: File exists'."""
    pytest.importorskip("tensorboard")
    line = one_error_line(*cli(capsys, "count", "models.py:mlp", "-i", "4x16", "--tensorboard", "models.py"))
    assert "--tensorboard models.py: is a file; --tensorboard takes a folder" in line


@pytest.mark.parametrize("flag, path", [("-o", "models.py/r.json"), ("--tensorboard", "models.py/tb")])
def test_a_path_through_a_file_names_the_file(workdir, capsys, flag, path):
    """Before: '--output models.py/r.json: folder models.py does not exist' (it exists: a file);
    --tensorboard said 'Not a directory' after the count."""
    if flag == "--tensorboard":
        pytest.importorskip("tensorboard")
    line = one_error_line(*cli(capsys, "count", "models.py:mlp", "-i", "4x16", flag, path))
    assert f"{path}: models.py is a file, not a folder" in line


def test_profile_trace_makes_its_folder(workdir, capsys):
    code, _, err = cli(capsys, "profile", "models.py:mlp", "-i", "4x16", "--steps", "1", "--warmup", "0",
                       "--trace", "traces/mlp.json")
    assert code == 0, err
    events = json.loads((workdir / "traces" / "mlp.json").read_text())["traceEvents"]
    assert any(e.get("name") == "aten::addmm" for e in events)


# -- 4. budgets: negative, zero, garbage --------------------------------------------------------


@pytest.mark.parametrize("flag, value, fragment", [
    ("--max-memory", "-1GB", "'-1GB' is negative: a size below 0 is not allowed"),
    ("--max-memory", "-512MiB", "'-512MiB' is negative: a size below 0 is not allowed"),
    ("--max-flops", "-5G", "'-5G' is negative: a number below 0 is not allowed"),
    ("--max-params", "-1", "'-1' is negative"),
    ("--max-size-mb", "-1", "'-1' is negative"),
    ("--max-latency-ms", "-5", "'-5': a latency budget must be > 0"),
    ("--max-latency-ms", "abc", "'abc' is not a number (examples: 10, 2.5, 0.8)"),
    ("--max-size-mb", "120MB", "'120MB' is not a number (examples: 120, 0.5, 2K)"),
])
def test_a_bad_budget_says_what_is_wrong_with_it(workdir, capsys, flag, value, fragment):
    """Before: '-1GB' 'is not a size'; -5 'must be a finite number >= 0' for a latency in ms (0
    was 'a latency budget must be > 0'); a latency in ms and a size in MB offered '25M, 5G, 1.5T'."""
    line = one_error_line(*cli(capsys, "check", "models.py:mlp", "-i", "4x16", flag, value))
    assert f"argument {flag}" in line and fragment in line


def test_a_negative_memory_budget_in_pyproject_is_called_negative(workdir, capsys):
    (workdir / "pyproject.toml").write_text('[tool.flopcount]\nmax-memory = "-2GB"\n')
    line = one_error_line(*cli(capsys, "check", "models.py:mlp", "-i", "4x16"))
    assert "max-memory: '-2GB' is negative: a size below 0 is not allowed" in line


@pytest.mark.parametrize("flag, value", [("--max-memory", "0B"), ("--max-flops", "0")])
def test_a_budget_of_zero_is_a_budget_every_model_exceeds(workdir, capsys, flag, value):
    code, out, _ = cli(capsys, "check", "models.py:mlp", "-i", "4x16", flag, value)
    assert code == 1 and "FAIL" in out


# -- 6. serve's estimate sentence: built once ------------------------------------------------------


def test_serve_builds_its_estimate_sentence_once(monkeypatch):
    """Before: serve_on built it for the result's warnings and serve() built it again to warn it."""
    transformers = pytest.importorskip("transformers")
    import flopcount
    from flopcount.devices import Roofs, roofline
    from flopcount.errors import EstimatedBoundWarning

    made = []
    real = roofline.doubts_text

    def counted(doubts):
        made.append(tuple(doubts))
        return real(doubts)

    monkeypatch.setattr(roofline, "doubts_text", counted)
    config = transformers.LlamaConfig(num_hidden_layers=1, hidden_size=32, intermediate_size=64, num_attention_heads=2,
                                      num_key_value_heads=2, vocab_size=64)
    model = transformers.LlamaForCausalLM(config)
    roofs = Roofs({"float32": 1e12}, 1e11, "toy", "measured", doubts=("load average 7.04 above the 2 cores",))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = flopcount.serve(model, torch.zeros(1, 8, dtype=torch.int64), 2, on=roofs)
    sentence = ("serve: each time bound (TTFT, inter-token latency) and tokens/s ceiling is an estimate, not a bound: "
                "roofs measured under load (load average 7.04 above the 2 cores)")
    assert made == [("load average 7.04 above the 2 cores",)]
    assert [str(w.message) for w in caught if issubclass(w.category, EstimatedBoundWarning)] == [sentence]
    assert sentence in result.warnings


# -- 2. check --format tree: the count's module tree under the verdict (already so; a guard) -----


def test_check_tree_is_the_module_tree_under_the_verdict(workdir, capsys):
    """papercuts4 listed 'check --format tree prints the budget table, as table does': it prints the
    budget table and the verdict, then the module tree count --format tree prints (table does not)."""
    code, tree, _ = cli(capsys, "check", "models.py:mlp", "-i", "4x16", "--max-flops", "1G", "-f", "tree")
    assert code == 0
    _, table, _ = cli(capsys, "check", "models.py:mlp", "-i", "4x16", "--max-flops", "1G", "-f", "table")
    _, count_tree, _ = cli(capsys, "count", "models.py:mlp", "-i", "4x16", "-f", "tree")
    verdict = "PASS: all 1 budget(s) met"
    assert verdict in table and "(l1): Linear" not in table
    # l1: 16 x 32 + 32 weights and biases, 4 x 16 x 32 MACs
    assert tree.index(verdict) < tree.index(f"(l1): Linear  [{16 * 32 + 32} params, {4 * 16 * 32 / 1000:.3f} KMACs")
    assert tree.endswith(count_tree)


# -- 3. times side by side share one unit; no non-zero figure reads 0 ---------------------------


def test_a_tiny_models_bounds_share_one_unit_and_none_reads_zero(workdir, capsys):
    """Before: the relu's bound read '0.0 ns' (128 FLOPs / 67 TFLOP/s = 1.9e-12 s) and the eager line
    'compute 0.1 ns, memory 0.0 us': 0 spelled in microseconds beside nanoseconds."""
    code, out, _ = cli(capsys, "count", "models.py:mlp", "-i", "4x16", "--on", "h100")
    assert code == 0
    # each operator row ends "lower bound, its unit, share"
    rows = {line.split()[0]: line.split()[-3:-1] for line in out.splitlines() if line.startswith("aten::")}
    # the H100 SXM datasheet's float32 peak, 67 TFLOP/s; compute binds (the bytes sit in the L2,
    # whose bandwidth is unpublished): relu 4 x 32 FLOPs, the linears 2 x 4 x (16 x 32 + 32 x 8) FLOPs
    assert rows["aten::relu"] == [f"{4 * 32 / 67e12 * 1e9:.4f}", "ns"]  # 0.0019 ns
    assert rows["aten::linear"] == [f"{2 * MACS / 67e12 * 1e9:.1f}", "ns"]  # 0.1 ns
    eager = next(line for line in out.splitlines() if line.startswith("Eager lower bound"))
    assert "memory 0.0 ns if each ran alone" in eager and " us" not in eager


@pytest.mark.parametrize("seconds, like, text", [
    (2e-12, None, "0.0020 ns"),  # 2e-12 s = 0.002 ns: two significant digits, not "0.0 ns"
    (0.0, 9e-11, "0.0 ns"),  # a 0 beside 0.09 ns takes its unit, not "0.0 us"
    (2e-7, 1.2e-2, "0.0002000 ms"),  # 200.0 ns in a column of milliseconds: 2e-7 s x 1e3, 4 significant digits
    (517.8e-9, 13.8e-6, "0.5178 us"),  # 517.8 ns beside 13.8 us, as precise as in nanoseconds
    (3e-6, 5e-3, "0.0030 ms"),  # 3.0 us: its own resolution, 0.1 us = 0.0001 ms
    (1.23e-3, None, "1.230 ms"),
    (200.0, None, "3 min 20 s"),
])
def test_format_seconds_takes_a_neighbours_unit_and_never_reads_zero(seconds, like, text):
    from flopcount.units import format_seconds

    assert format_seconds(seconds, like=like) == text


# -- 5. multimodal position rules (Qwen2-VL's M-RoPE): nothing to check on meta; the model as found --


def _qwen2_vl(device: str = "cpu"):
    transformers = pytest.importorskip("transformers")
    text = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                vocab_size=64, max_position_embeddings=16, rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]})
    config = transformers.Qwen2VLConfig(text_config=text, vision_config=dict(depth=1, embed_dim=32, hidden_size=32, num_heads=2))
    torch.manual_seed(0)
    with torch.device(device):
        return transformers.Qwen2VLForConditionalGeneration(config).eval()


def test_a_multimodal_position_rule_leaves_the_model_as_found_and_runs_past_max_positions():
    """Qwen2-VL's own _prepare_position_ids_for_generation (M-RoPE) sets model.model.rope_deltas;
    count_generation and serve called it on the caller's model and left it set (None before).
    Its positions feed rotary embeddings, no table of positions: 12 + 8 = 20 positions past
    max_position_embeddings = 16 are counted (generate() runs them too) on meta as with real weights."""
    import flopcount

    real, meta = _qwen2_vl(), _qwen2_vl("meta")
    assert real.model.rope_deltas is None and meta.model.rope_deltas is None
    found = {name: dict(vars(module)) for name, module in real.named_modules()}
    on_cpu = flopcount.count_generation(real, torch.randint(0, 50, (1, 12)), new_tokens=8)
    on_meta = flopcount.count_generation(meta, torch.zeros(1, 12, dtype=torch.int64, device="meta"), new_tokens=8)
    flopcount.serve(meta, torch.zeros(1, 12, dtype=torch.int64, device="meta"), 8)
    assert real.model.rope_deltas is None and meta.model.rope_deltas is None
    assert {name: dict(vars(module)) for name, module in real.named_modules()} == found
    assert on_meta.flops == on_cpu.flops and on_cpu.steps and len(on_cpu.steps) == 7


# -- a new user's walk: a wrong shape, a misspelt part ---------------------------------------------

CONV_SOURCE = """
from torch import nn

def net():
    return nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU())
"""


def test_a_wrong_input_shape_says_what_the_layer_takes(workdir, capsys):
    """Before: "mat1 and mat2 shapes cannot be multiplied (4x17 and 16x32)" and nothing more: which of
    the two is the input, and what should it be? l1 is Linear(16, 32) (MLP_SOURCE)."""
    line = one_error_line(*cli(capsys, "count", "models.py:mlp", "-i", "4x17"))
    assert "forward failed in module 'l1'" in line
    assert line.rstrip().endswith("'l1' is a Linear(16 -> 32): the last dimension of its input must be 16")


def test_a_wrong_channel_count_says_what_the_conv_takes(workdir, capsys):
    (workdir / "convs.py").write_text(CONV_SOURCE)
    line = one_error_line(*cli(capsys, "count", "convs.py:net", "-i", "1x4x32x32"))
    assert line.rstrip().endswith("'0' is a Conv2d with 3 input channels: its input is Nx3xHxW (or 3xHxW unbatched)")


@pytest.mark.parametrize("argv", [("count", "models.py:mlp", "-i", "4x16", "--on", "h1000"), ("roofs", "h1000")])
def test_a_misspelt_part_offers_the_close_names(workdir, capsys, argv):
    """Before: the 18 parts listed, none offered; 'h1000' is one key away from the alias 'h100'."""
    line = one_error_line(*cli(capsys, *argv))
    assert "unknown part 'h1000'; known parts: H100 SXM" in line and line.rstrip().endswith("; did you mean h100, v100, h200?")


def test_generation_of_a_model_without_a_head_says_so():
    """serve hf:qwen2_vl builds Qwen2VLModel (count's class for the type): before, 'the model returned
    no (batch, positions, vocab) logits', not why. A LlamaModel returns hidden states only."""
    transformers = pytest.importorskip("transformers")
    import flopcount
    from flopcount.errors import UsageError

    config = transformers.LlamaConfig(num_hidden_layers=1, hidden_size=32, intermediate_size=64, num_attention_heads=2,
                                      num_key_value_heads=2, vocab_size=64)
    with pytest.raises(UsageError, match=r"returned hidden states \(last_hidden_state\) and no logits, a model without a "
                                         r"language-model head"):
        flopcount.count_generation(transformers.LlamaModel(config), torch.zeros(1, 8, dtype=torch.int64), new_tokens=2)
