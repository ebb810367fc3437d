"""A new user's mistakes, fourth audit (docs/performance.md, branch papercuts4): a generation
past the model's table of positions names the forward that failed and the caller's prompt, flags
that nothing reads are refused, a latency budget of 0 is refused wherever it is given, a Hugging
Face Hub name given to ``hf:`` says that nothing is downloaded, and a diff's failing side is named.
Each CLI error is one line on stderr and exit 2."""

from __future__ import annotations

import math
import textwrap

import pytest
import torch
from _cli_run import MLP_SOURCE, cli, one_error_line

import flopcount
from flopcount.errors import TraceError, UsageError

MODELS = MLP_SOURCE + textwrap.dedent(
    """
    class Boom(nn.Module):
        def __init__(self):
            super().__init__()
            self.l1 = nn.Linear(16, 32)

        def forward(self, x):
            self.l1(x)
            raise ValueError("boom in forward")
    """
)

# a GPT-2 whose learned table of positions holds ROWS rows
ROWS, VOCAB = 16, 50
SMALL_GPT2 = ("--config", "n_layer=1", "--config", "n_embd=32", "--config", "n_head=2", "--config", f"n_positions={ROWS}")


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    (tmp_path / "models.py").write_text(MODELS)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _gpt2():
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_positions=ROWS, n_embd=32, n_layer=1, n_head=2, vocab_size=VOCAB)
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config).eval()


def _prompt(tokens: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (1, tokens), generator=torch.Generator().manual_seed(tokens))


# -- count_generation: the forward that failed, and the caller's prompt ------------------------


def test_a_decode_step_past_the_table_is_named_with_its_position_and_the_prompt():
    """Before: "(dispatch tracer) with inputs () with kwargs {input_ids=Tensor[1, 1] int64,
    cache=DynamicCache(...), position_ids=..., use_cache=True, logits_to_keep=1}": a tracer the
    caller did not choose and a call the loop made. The oracle is generate() itself: with a
    P-token prompt, decode step s (from 0) feeds the token at position P + s (docs/llm.md), so 8
    new tokens after 10 feed position 16 at step 6, past 16 rows, where the real generate() raises."""
    model, prompt = _gpt2(), _prompt(10)
    with pytest.raises(IndexError), torch.no_grad():
        model.generate(prompt, max_new_tokens=8, min_new_tokens=8, do_sample=False)
    with pytest.raises(TraceError) as caught:
        flopcount.count_generation(model, prompt, new_tokens=8)
    text = str(caught.value)
    assert text.startswith(
        "forward failed in module 'transformer.wpe' (count_generation, decode step 6 counted from 0, feeding the token "
        "at position 16) with inputs (Tensor[1, 10] int64,): IndexError: aten::embedding reads index 16"
    ), text
    assert caught.value.decode_step == 6
    assert "cache=" not in text and "dispatch tracer" not in text


def test_a_prompt_past_the_table_is_named_as_the_prefill():
    model = _gpt2()
    with pytest.raises(TraceError) as caught:
        flopcount.count_generation(model, _prompt(ROWS + 1), new_tokens=2)
    text = str(caught.value)
    assert text.startswith(
        f"forward failed in module 'transformer.wpe' (count_generation, prefill) with inputs (Tensor[1, {ROWS + 1}] int64,): "
        f"IndexError: aten::embedding reads index {ROWS}"
    ), text
    assert caught.value.decode_step is None


def test_the_cli_gives_no_entry_input_hint_when_a_decode_step_failed(capsys):
    """The prompt ran; before, the line ended "hf:gpt2's own input is --input 1x16:int64 (leave --input
    out for it)", a prompt that fails sooner (16 + 8 - 1 positions)."""
    pytest.importorskip("transformers")
    code, out, err = cli(capsys, "count", "hf:gpt2", *SMALL_GPT2, "--input", "1x10:int64", "--generate", "8", "-q")
    line = one_error_line(code, out, err)
    assert "(count_generation, decode step 6 counted from 0, feeding the token at position 16) with inputs (Tensor[1, 10] int64,)" in line
    assert "own input" not in line
    # a prompt that fails in the prefill keeps the hint (the guard: it was right there)
    code, out, err = cli(capsys, "count", "hf:gpt2", *SMALL_GPT2, "--input", f"1x{ROWS + 1}:int64", "--generate", "2", "-q")
    line = one_error_line(code, out, err)
    assert "(count_generation, prefill)" in line and f"hf:gpt2's own input is --input 1x{ROWS}:int64" in line


# -- flags nothing reads -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "flags, named",
    [(("--plot-kind", "sunburst"), "--plot-kind shapes"), (("--plot-top", "3"), "--plot-top shapes"),
     (("--plot-kind", "bars", "--plot-top", "3"), "--plot-kind and --plot-top shape")],
    ids=["kind", "top", "both"],
)
def test_plot_options_without_plot_are_refused(workdir, capsys, flags, named):
    """Before: exit 0, the flag silently unread (as --matmul-tf32 without --on is refused)."""
    code, out, err = cli(capsys, "count", "models.py:Mlp", "-i", "4x16", *flags)
    line = one_error_line(code, out, err)
    assert named in line and "add --plot" in line


def test_plot_options_with_plot_still_draw(workdir, capsys):
    pytest.importorskip("matplotlib")
    code, _, err = cli(capsys, "count", "models.py:Mlp", "-i", "4x16", "--plot", "p.png", "--plot-kind", "sunburst", "-q")
    assert code == 0, err
    assert (workdir / "p.png").stat().st_size > 0


# -- budgets: one rule for a latency of 0 ------------------------------------------------------


def test_a_zero_latency_budget_is_refused_as_max_latency_0ms_is(workdir, capsys):
    """Before: --max-latency 0ms was refused, --max-latency-ms 0 benchmarked the model and failed
    (no run takes 0 s); ``max-latency-s = 0`` likewise."""
    code, out, err = cli(capsys, "check", "models.py:Mlp", "-i", "4x16", "--max-latency", "0ms")
    assert "a latency budget must be > 0" in one_error_line(code, out, err)
    code, out, err = cli(capsys, "check", "models.py:Mlp", "-i", "4x16", "--max-latency-ms", "0")
    line = one_error_line(code, out, err)
    assert "--max-latency-ms" in line and "a latency budget must be > 0" in line
    (workdir / "pyproject.toml").write_text("[tool.flopcount]\nmax-latency-s = 0\n")
    code, out, err = cli(capsys, "check", "models.py:Mlp", "-i", "4x16")
    line = one_error_line(code, out, err)
    assert "pyproject.toml [tool.flopcount]: max-latency-s = 0: a budget's limit must be finite and > 0" in line


def test_a_zero_flops_budget_still_decides(workdir, capsys):
    """The guard: 0 FLOPs is a limit a model without arithmetic meets. Mlp's, by hand: 2 x 4 x (16 x 32
    + 32 x 8) for the two linears (bias in addmm) + 4 x 32 for the ReLU = 6,272 FLOPs, over it."""
    code, out, err = cli(capsys, "check", "models.py:Mlp", "-i", "4x16", "--max-flops", "0", "-q")
    assert code == 1, err
    flops = 2 * 4 * (16 * 32 + 32 * 8) + 4 * 32
    assert f"budget exceeded: flops {flops / 1e3:.3f} KFLOPs > 0 FLOPs" in err


@pytest.mark.parametrize(
    "kwargs, says",
    [({"max_latency_s": 0}, "max_latency_s=0: a budget's limit must be finite and > 0 (a latency budget of 0 is met by no run)"),
     ({"max_latency_s": -0.5}, "max_latency_s=-0.5: a budget's limit must be finite and > 0"),
     ({"max_flops": -1}, "max_flops=-1: a budget's limit must be finite and >= 0"),
     ({"max_params": math.nan}, "max_params=nan: a budget's limit must be finite and >= 0"),
     ({"max_macs": "4G"}, "max_macs='4G': a budget's limit is a number, got str")],
    ids=["latency-0", "latency-negative", "flops-negative", "params-nan", "macs-string"],
)
def test_budget_refuses_limits_no_count_can_be_held_to(kwargs, says):
    """Before: each was accepted and every check FAILed (``latency 1.000 ms > -500.000 ms``)."""
    with pytest.raises(UsageError) as caught:
        flopcount.Budget(**kwargs)
    assert str(caught.value) == f"Budget: {says}"


def test_budget_keeps_limits_that_can_hold():
    budget = flopcount.Budget(max_flops=0, max_params=10, max_latency_s=0.005, max_size_mb=1.5, max_memory=0)
    assert flopcount.check_budget(budget, flops=0, params=10, latency_s=0.004, size_bytes=1_500_000, memory_bytes=0).passed


def test_the_clis_latency_flag_as_a_file_key_names_the_files_key(workdir, capsys):
    """Before: "unknown key 'max-latency'; did you mean max-latency-s, max-macs?", and
    ``max-latency-s = "10ms"`` is no number either: the file's key carries its unit in its name."""
    (workdir / "pyproject.toml").write_text('[tool.flopcount]\nmax-latency = "10ms"\n')
    code, out, err = cli(capsys, "check", "models.py:Mlp", "-i", "4x16")
    line = one_error_line(code, out, err)
    assert "max-latency-s = 0.01 for --max-latency 10ms" in line


# -- hf: given a Hugging Face Hub name ---------------------------------------------------------


@pytest.mark.parametrize(
    "name, family",
    [("bert-base-uncased", "bert"), ("t5-small", "t5"), ("meta-llama/Llama-2-7b-hf", "llama"),
     ("mistralai/Mistral-7B-v0.1", "mistral"), ("distilbert-base-uncased", "distilbert")],
)
def test_a_hub_name_says_nothing_is_downloaded_and_what_to_give(workdir, capsys, name, family):
    """Before: "'bert-base-uncased' is not a transformers model_type" with no suggestion, and for an
    ``org/name`` id "no such folder or file". The family is transformers' own model_type (the
    longest one the name begins with, before a separator)."""
    pytest.importorskip("transformers")
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    assert family in CONFIG_MAPPING_NAMES
    code, out, err = cli(capsys, "count", f"hf:{name}")
    line = one_error_line(code, out, err)
    assert "flopcount downloads nothing" in line
    assert f"hf:{family} counts transformers' default {family} config" in line
    assert f"hf download {name} config.json --local-dir DIR) and give hf:./DIR" in line


def test_did_you_mean_offers_model_types_only(workdir, capsys):
    """transformers 5.24's table of model types also holds a class name (EvollaModel), which was
    offered for any word near "model". The guard: gpt-2 is still offered gpt2."""
    pytest.importorskip("transformers")
    code, out, err = cli(capsys, "count", "hf:notamodel")
    line = one_error_line(code, out, err)
    assert "EvollaModel" not in line and "downloads nothing" not in line
    code, out, err = cli(capsys, "count", "hf:gpt-2")
    assert "did you mean gpt2" in one_error_line(code, out, err)


# -- diff: which side failed -------------------------------------------------------------------


@pytest.mark.parametrize(
    "a, b, begins",
    [("models.py:Mlp", "models.py:Boom", "B = models.py:Boom: forward failed in the root module (model)"),
     ("models.py:Boom", "models.py:Mlp", "A = models.py:Boom: forward failed in the root module (model)"),
     ("models.py:Mlp", "models.py:Nothing", "B = models.py:Nothing: bad ENTRY 'models.py:Nothing'")],
    ids=["B-forward", "A-forward", "B-entry"],
)
def test_a_diffs_failing_side_is_named(workdir, capsys, a, b, begins):
    """Before: the line did not say which side failed; under --quiet no progress line did either."""
    code, out, err = cli(capsys, "diff", a, b, "-i", "4x16", "-q")
    line = one_error_line(code, out, err)
    assert line.startswith(f"flopcount: error: {begins}"), line


# -- count_generation and serve on meta: the table of positions is checked there too -------------


def _meta_gpt2():
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_positions=ROWS, n_embd=32, n_layer=1, n_head=2, vocab_size=VOCAB)
    with torch.device("meta"):
        return transformers.GPT2LMHeadModel(config).eval()


def test_meta_generation_past_the_table_is_refused_as_generate_refuses_it():
    """Before: counted without a word (a 1,000-token GPT-2 prompt and 128 new tokens: 1,126 positions
    of 1,024), though docs/conventions.md said count_generation is refused at the step that passes the
    table on every path: generate() passes position ids, which count_generation made on meta without
    values, so no index check could read them. The oracle is the real generate() (a 10-token prompt
    takes 7 new tokens in 16 positions, not 8) and the count of the same model on real weights."""
    real, prompt = _gpt2(), _prompt(10)
    with pytest.raises(IndexError), torch.no_grad():
        real.generate(prompt, max_new_tokens=8, min_new_tokens=8, do_sample=False)
    meta, meta_prompt = _meta_gpt2(), torch.zeros(1, 10, dtype=torch.int64, device="meta")
    with pytest.raises(TraceError) as caught:
        flopcount.count_generation(meta, meta_prompt, new_tokens=8)
    assert ("(count_generation, decode step 6 counted from 0, feeding the token at position 16) with inputs "
            "(Tensor[1, 10] int64 meta,): IndexError: aten::embedding reads index 16, but its table has 16 rows") in str(caught.value)
    assert caught.value.decode_step == 6
    with pytest.raises(TraceError, match=r"\(count_generation, prefill\) .* reads index 16"):
        flopcount.count_generation(meta, torch.zeros(1, ROWS + 1, dtype=torch.int64, device="meta"), new_tokens=2)
    # at the table's edge it counts, the same FLOPs as on real weights (a dense model: the ids change nothing)
    on_meta = flopcount.count_generation(meta, meta_prompt, new_tokens=7)
    on_cpu = flopcount.count_generation(real, prompt, new_tokens=7)
    assert on_meta.flops == on_cpu.flops and [s.flops for s in on_meta.steps] == [s.flops for s in on_cpu.steps]


def test_serve_on_meta_past_the_table_is_refused():
    """Before: serve priced contexts past GPT-2's table without a word (docs/performance.md, papercuts3's
    'left' list: serve hf:gpt2 --prompt 1000 --new 100)."""
    meta, prompt = _meta_gpt2(), torch.zeros(1, 10, dtype=torch.int64, device="meta")
    with pytest.raises(TraceError, match=r"\(serve, decode step 6 counted from 0, feeding the token at position 16\)"):
        flopcount.serve(meta, prompt, 8, on="h100")
    # at the edge it is priced; by hand, each token keeps K and V of 32 float32 numbers in its one layer
    assert flopcount.serve(meta, prompt, 7, on="h100").kv_bytes_per_token == 2 * 32 * 4
