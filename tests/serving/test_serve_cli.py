"""`flopcount serve` (issue #31 item 2): figures from hand formulas, one-line errors (exit 2),
the plot of tokens/s against batch with the memory wall."""

from __future__ import annotations

import json

import pytest

from flopcount.cli import main

transformers = pytest.importorskip("transformers")

LLAMA = ["hf:llama", "--config", "num_hidden_layers=2", "--config", "hidden_size=64", "--config", "intermediate_size=128",
         "--config", "num_attention_heads=4", "--config", "num_key_value_heads=2", "--config", "vocab_size=100",
         "--config", "tie_word_embeddings=false"]


def cli(capsys, *args: str):
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def _params() -> int:
    # per layer: q, o 64 x 64; k, v 64 x 32 (2 KV heads of 16); gate, up, down 64 x 128; 2 norms;
    # embedding and LM head 100 x 64 each (untied); final norm
    return 2 * (2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 128 + 2 * 64) + 2 * 100 * 64 + 64


def test_serve_json_on_two_parts(capsys):
    code, out, err = cli(capsys, "serve", *LLAMA, "--dtype", "bfloat16", "--on", "h100,l4", "--prompt", "16",
                         "--new", "4", "--batch", "1,8", "-f", "json")
    assert code == 0, err
    data = json.loads(out)
    assert [p["part"] for p in data["parts"]] == ["H100 SXM", "L4"]
    for part in data["parts"]:
        assert part["kv_bytes_per_token"] == 2 * 2 * 32 * 2  # K and V x 2 layers x 2 KV heads x 16 x bf16
        assert part["weight_bytes"] == _params() * 2
        assert [b["batch"] for b in part["batches"]] == [1, 8]
        # decode step 0 reads the weights (the embedding at B rows) and the 16 cached positions, writes one
        first = part["batches"][1]["first_step"]
        assert first["bytes"] == (_params() - 100 * 64) * 2 + 8 * 64 * 2 + 8 * 17 * 256
    assert data["parts"][0]["capacity_bytes"] == 80e9 and data["parts"][1]["capacity_bytes"] == 24e9


def test_serve_table_says_what_the_bound_leaves_out(capsys):
    code, out, err = cli(capsys, "serve", *LLAMA, "--on", "a100", "--prompt", "8", "--new", "3", "--tp", "2")
    assert code == 0, err
    assert "speculative decoding" in out and "per rank of tp=2 over nvlink3" in out and "10% reserve" in out


@pytest.mark.parametrize("args, message", [
    (["--on", "h1000"], "unknown part 'h1000'"),
    (["--batch", "1,x"], "--batch: 'x' is not an integer"),
    (["--batch", "0"], "--batch: batch sizes must be >= 1"),
    (["--weight-dtype", "int3"], "serve: weight_dtype (int8, int4 and fp8 are weight-only formats; any other) must be"),
    (["--tp", "2", "--on", "this machine"], "tp > 1 on this machine"),
    (["--reserve", "1.5"], "--reserve must be a fraction"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, args, message):
    code, out, err = cli(capsys, "serve", *LLAMA, "--prompt", "4", "--new", "2", *args)
    assert code == 2
    assert message in err and "Traceback" not in err
    assert len([line for line in err.splitlines() if "error" in line]) == 1


def test_serve_plot_draws_the_memory_wall(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "serve.png"
    code, out, err = cli(capsys, "serve", *LLAMA, "--on", "h100,l4", "--prompt", "8", "--new", "3",
                         "--batch", "1,8,64", "--plot", str(path), "-q")
    assert code == 0, err
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_serve_plot_write_failure_is_one_line(capsys, tmp_path, monkeypatch):
    # A write that fails after the early path check (a full disk: errno 28) is the user's, not a
    # bug of ours. serve let the OSError through to the internal-error handler (exit 4); like
    # count's and profile's --plot it is now one line naming the flag, exit 2. (matplotlib's PNG
    # writer does not report /dev/full's ENOSPC, so the failure is raised where the plot is drawn.)
    pytest.importorskip("matplotlib")
    import errno

    import flopcount.report.serving as serving_report

    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(serving_report, "plot_serving", full_disk)
    path = tmp_path / "serve.png"
    code, out, err = cli(capsys, "serve", *LLAMA, "--on", "h100", "--prompt", "8", "--new", "3",
                         "--batch", "1,8", "--plot", str(path), "-q")
    assert code == 2, err
    assert err.strip().splitlines()[-1] == f"flopcount: error: --plot {path}: No space left on device"
    assert "internal error" not in err


def test_serve_plot_leaves_matplotlib_as_found(capsys, tmp_path):
    # the serve plot switched the process's backend to Agg (matplotlib.use) and drew through pyplot;
    # it now draws on its own Agg canvas like every other plot: the backend stays the caller's
    matplotlib = pytest.importorskip("matplotlib")
    before = matplotlib.get_backend()
    matplotlib.use("svg")
    try:
        code, _, err = cli(capsys, "serve", *LLAMA, "--on", "h100", "--prompt", "8", "--new", "3",
                           "--batch", "1,8", "--plot", str(tmp_path / "serve.png"), "-q")
        assert code == 0, err
        assert matplotlib.get_backend() == "svg"
    finally:
        matplotlib.use(before)


def test_serve_help_lists_its_flags_and_what_the_bound_leaves_out(capsys):
    code, out, _ = cli(capsys, "serve", "--help")
    assert code == 0 and "examples:" in out
    for flag in ("--on", "--prompt", "--new", "--batch", "--dtype", "--weight-dtype", "--tp", "--reserve", "--format",
                 "--output", "--plot", "--config", "--timeout"):
        assert flag in out
    assert "speculative decoding" in out
