"""Branch gatewalk: a team's walk through the deployment gate (``flopcount check``, ``check
--baseline``, ``flopcount diff``) as docs/ci.md and docs/cli.md tell it, each finding a test
that failed on the parent. Expected numbers are derived by hand from the layer shapes (the
contractions also by ``torch.utils.flop_counter.FlopCounterMode``); the pull-request comment is
read through a CommonMark renderer (markdown-it-py), as GitHub shows it."""

from __future__ import annotations

import json
import re
import textwrap
import zipfile

import pytest
import torch
from _cli_run import cli, one_error_line
from conftest import torch_contraction_flops

# Net(h): Linear(16, h) -> ReLU -> Linear(h, 8) on a 4x16 batch
N, IN, OUT = 4, 16, 8


def params(h: int) -> int:
    return IN * h + h + h * OUT + OUT


def flops(h: int) -> int:
    """2 FLOPs per MAC of each Linear, 1 per ReLU element (biases are not counted: docs/conventions.md)."""
    return 2 * N * IN * h + N * h + 2 * N * h * OUT


def moved(h: int) -> int:
    """Bytes read + written, float32: each Linear reads its input, weight and bias and writes its
    output; the ReLU reads and writes N x h."""
    l1 = (N * IN + IN * h + h) + N * h
    l2 = (N * h + h * OUT + OUT) + N * OUT
    return 4 * (l1 + 2 * N * h + l2)


MODELS = textwrap.dedent(
    """
    import torch
    from torch import nn

    if not hasattr(torch.ops.flopcount_gatewalk, "mystery"):
        torch.library.define("flopcount_gatewalk::mystery", "(Tensor x) -> Tensor")
        torch.library.impl("flopcount_gatewalk::mystery", "CompositeExplicitAutograd")(lambda x: x * 2)
        torch.library.register_fake("flopcount_gatewalk::mystery")(lambda x: torch.empty_like(x))

    class Net(nn.Module):
        def __init__(self, h=32, mystery=False):
            super().__init__()
            self.l1 = nn.Linear(16, h)
            self.act = nn.ReLU()
            self.l2 = nn.Linear(h, 8)
            self.mystery = mystery

        def forward(self, x):
            y = self.act(self.l1(x))
            if self.mystery:  # a custom op without a handler: the count is a lower bound
                y = torch.ops.flopcount_gatewalk.mystery(y)
            return self.l2(y)

    def build(h=32, mystery=False):
        return Net(h, mystery)

    class Expert(nn.Module):
        def __init__(self, h):
            super().__init__()
            self.w = nn.Linear(h, h)

        def forward(self, x):
            return self.w(x)

    class Layer(nn.Module):
        def __init__(self, h):
            super().__init__()
            self.experts = nn.ModuleList([Expert(h) for _ in range(2)])

        def forward(self, x):
            return sum(e(x) for e in self.experts)

    class Moe(nn.Module):
        def __init__(self, h=8):
            super().__init__()
            self.layers = nn.ModuleList([Layer(h) for _ in range(2)])
            self.add_module("__gate__", nn.Linear(h, h))

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return getattr(self, "__gate__")(x)

    def moe(h=8):
        return Moe(h)

    class Wide(nn.Module):
        def __init__(self, n=1500):
            super().__init__()
            self.blocks = nn.ModuleList([nn.Linear(4, 4) for _ in range(n)])

        def forward(self, x):
            return sum(block(x) for block in self.blocks)

    def wide(n=1500):
        return Wide(n)
    """
)


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    (tmp_path / "gw_models.py").write_text(MODELS)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def base(workdir, capsys):
    """The baseline report of Net(32), as docs/ci.md writes it (count --format json --output)."""
    code, _, err = cli(capsys, "count", "gw_models.py:build", "-i", "4x16", "--format", "json", "-o", "base.json")
    assert code == 0, err
    return "base.json"


def test_the_hand_formulas_are_torchs():
    """The oracle of this file, checked once: the contractions as FlopCounterMode counts them."""
    from torch import nn

    for h in (32, 48):
        net = nn.Sequential(nn.Linear(IN, h), nn.ReLU(), nn.Linear(h, OUT))
        assert torch_contraction_flops(net, (torch.randn(N, IN),)) == flops(h) - N * h
        assert sum(p.numel() for p in net.parameters()) == params(h)


# -- findings 1 and 1b (docs/performance.md, branch gatewalk): a limit and an actual that read alike

def test_a_budget_a_hair_under_the_count_reads_apart_from_it(workdir, capsys):
    limit = flops(32) - 0.1  # 6271.9
    code, out, err = cli(capsys, "check", "gw_models.py:build", "-i", "4x16", "--max-flops", str(limit))
    assert code == 1, err
    assert f"budget exceeded: flops {flops(32) / 1e3:.4f} KFLOPs > {limit / 1e3:.4f} KFLOPs" in err
    row = next(line for line in out.splitlines() if line.startswith("flops"))
    assert row.split()[1:] == [f"{limit / 1e3:.4f}", "KFLOPs", f"{flops(32) / 1e3:.4f}", "KFLOPs", "FAIL"]
    # the boundary: a budget equal to the count passes, and reads as usual
    code, out, err = cli(capsys, "check", "gw_models.py:build", "-i", "4x16", "--max-flops", str(flops(32)))
    assert code == 0, err
    assert "6.272 KFLOPs  6.272 KFLOPs  PASS" in out


def test_a_latency_bound_below_a_nanosecond_does_not_read_zero(workdir, capsys):
    """T4: 8.1 TFLOP/s FP32 and a 4 MB L2 that holds the whole working set, so the any-implementation
    bound is the FLOPs over the peak: 6,272 / 8.1e12 = 0.774 ns; it read '>= 0.000 ms > 0.000 ms'."""
    bound_ns = flops(32) / 8.1e12 * 1e9
    code, out, err = cli(capsys, "check", "gw_models.py:build", "-i", "4x16", "--max-latency", "0.5ns", "--on", "t4")
    assert code == 1, err
    assert f"budget exceeded: latency >= {bound_ns:.3f} ns > 0.500 ns (any-implementation lower bound on T4)" in err
    code, out, err = cli(capsys, "check", "gw_models.py:build", "-i", "4x16", "--max-latency", "1ms", "--on", "t4")
    assert code == 3, err
    row = next(line for line in out.splitlines() if line.startswith("latency"))
    assert row.split()[1:] == ["1.000", "ms", ">=", f"{bound_ns * 1e-6:.6f}", "ms", "UNDECIDED"]


# -- findings 2, 3 and 5: growth read "x > x", compared a percentage with an amount; bytes= in bytes

def test_growth_past_a_percentage_reads_apart_from_it(workdir, capsys, base):
    growth = 100 * (params(48) - params(32)) / params(32)  # 49.505 %
    code, out, err = cli(capsys, "check", "gw_models.py:build", "-i", "4x16", "--config", "h=48",
                         "--baseline", base, "--max-growth", "params=49.5%")
    assert code == 1, err
    assert f"params +{growth:.3f}% > +49.5% (most in l1 (Linear) +{IN * 16 + 16}, l2 (Linear) +{16 * OUT})" in out
    assert f"params +{growth:.2f}% >" not in out  # what it read before: +49.50% > +49.5%


def test_growth_past_an_amount_is_said_as_an_amount(workdir, capsys, base):
    grew = flops(48) - flops(32)  # 3,136
    code, out, err = cli(capsys, "check", "gw_models.py:build", "-i", "4x16", "--config", "h=48",
                         "--baseline", base, "--max-growth", f"flops={grew - 1}")
    assert code == 1, err
    assert f"flops +{grew:,} (+{100 * grew / flops(32):.2f}%) > +{grew - 1:,} (most in" in out
    row = next(line for line in out.splitlines() if line.startswith("flops"))
    assert f"+{grew:,} (+{100 * grew / flops(32):.2f}%)" in row
    code, out, err = cli(capsys, "check", "gw_models.py:build", "-i", "4x16", "--config", "h=48",
                         "--baseline", base, "--max-growth", f"flops={grew}")
    assert code == 0, err  # the boundary: growth equal to the amount passes


def test_a_bytes_allowance_takes_byte_units(workdir, capsys, base):
    """bytes=2KiB was 'not a number' although bytes moved are bytes, as memory=2KiB is."""
    grew = moved(48) - moved(32)  # 2,624 B
    assert grew > 2048
    code, out, err = cli(capsys, "check", "gw_models.py:build", "-i", "4x16", "--config", "h=48",
                         "--baseline", base, "--max-growth", "bytes=2KiB")
    assert code == 1, err
    l1 = 4 * (IN * 16 + 16 + N * 16)  # the weight, bias and output of the 16 more units
    assert f"bytes +{grew:,} (+{100 * grew / moved(32):.2f}%) > +2,048 (most in l1 (Linear) +{l1 / 1e3:.2f} kB," in out
    code, out, err = cli(capsys, "check", "gw_models.py:build", "-i", "4x16", "--config", "h=48",
                         "--baseline", base, "--max-growth", "bytes=3kB")
    assert code == 0, err


# -- findings 4, 12 and 13: a lower bound over the allowance; --allow-incomplete said; semicolons

def test_a_lower_bound_over_the_allowance_is_a_certain_fail(workdir, capsys, base):
    """Net(64) with a custom op: its count (12,288 + 256 FLOPs, the op not counted) can only be
    higher, and is already over the complete baseline's 6,272 + 2%: FAIL (exit 1), as a budget's
    lower bound over its limit is; it said INCOMPLETE (exit 3)."""
    code, out, err = cli(capsys, "check", "gw_models.py:build", "-i", "4x16", "--config", "h=64", "--config", "mystery=true",
                         "--baseline", base, "--max-growth", "flops=2%,params=200%")
    assert code == 1, err
    row = next(line for line in out.splitlines() if line.startswith("flops"))
    assert f">= {flops(64) / 1e3:.3f} K" in row and row.endswith("FAIL")
    assert "grew past the allowance (on an incomplete count): flops >= +" in out
    assert "flopcount_gatewalk::mystery ran 1x without a handler" in err
    # one that did not grow past it as counted is still undecided: never a silent PASS
    code, out, err = cli(capsys, "check", "gw_models.py:build", "-i", "4x16", "--config", "mystery=true",
                         "--baseline", base, "--max-growth", "flops=2%")
    assert code == 3, err
    assert "INCOMPLETE" in out


def test_a_growth_passed_on_an_incomplete_count_says_so(workdir, capsys):
    """--allow-incomplete lets the counts decide, and the verdict says "on an incomplete count", as a
    budget's does (docs/cli.md); the growth verdict said a plain PASS. Params alone never depend on
    the count: no remark."""
    code, _, err = cli(capsys, "count", "gw_models.py:build", "-i", "4x16", "--config", "mystery=true", "--format", "json",
                       "-o", "short.json")
    assert code == 0, err
    code, out, err = cli(capsys, "check", "gw_models.py:build", "-i", "4x16", "--config", "mystery=true",
                         "--baseline", "short.json", "--allow-incomplete")
    assert code == 0, err
    assert "PASS: all 3 metric(s) within the allowed growth (on an incomplete count, allowed)" in out
    code, out, err = cli(capsys, "check", "gw_models.py:build", "-i", "4x16", "--config", "mystery=true",
                         "--baseline", "short.json", "--max-growth", "params=0")
    assert code == 0, err
    assert "PASS: all 1 metric(s) within the allowed growth\n" in out


def test_allowances_written_with_semicolons_are_told_the_separator(workdir, capsys, base):
    """'flops=2%;params=0' read as flops = '2%;params=0', "is not a number"."""
    code, out, err = cli(capsys, "check", "gw_models.py:build", "-i", "4x16", "--baseline", base,
                         "--max-growth", "flops=2%;params=0")
    assert code == 2 and out == ""
    assert "allowances are separated by commas (e.g. flops=2%,params=0)" in err


# -- findings 6 and 14: the pull-request comment: * and __names__ became emphasis; over GitHub's limit

def _rendered(markdown: str) -> str:
    markdown_it = pytest.importorskip("markdown_it")
    return markdown_it.MarkdownIt("commonmark").enable("table").render(markdown)


def test_the_pr_comment_shows_module_names_as_written(workdir, capsys):
    code, _, err = cli(capsys, "count", "gw_models.py:moe", "-i", "4x8", "--format", "json", "-o", "moe8.json")
    assert code == 0, err
    code, out, err = cli(capsys, "diff", "moe8.json", "gw_models.py:moe", "--input", "4x16", "--config", "h=16",
                         "--format", "markdown")
    assert code == 0, err
    cells = re.findall(r"<td[^>]*>(.*?)</td>", _rendered(out))
    assert not [cell for cell in cells if "<" in cell]  # no emphasis, no HTML in any cell
    # four experts, each Linear(8, 8) -> Linear(16, 16): +(16 x 16 + 16) - (8 x 8 + 8) = 200 params each
    assert "layers.*.experts.*.w (x4)" in cells
    assert "__gate__" in cells


def test_the_pr_comment_stays_within_githubs_limit(workdir, capsys):
    """GitHub refuses a comment longer than 65,536 characters ("Body is too long"); a model whose
    1,500 layers all changed (a 70B model's hidden size: ~1,000 rows) made a 110 kB comment. The
    folded module table keeps its first rows and says how many more; the operators' stays whole."""
    code, out, err = cli(capsys, "diff", "gw_models.py:wide", "gw_models.py:wide", "--a-input", "2x4", "--b-input", "3x4",
                         "--format", "markdown")
    assert code == 0, err
    assert len(out) <= 65_536
    changed = 1 + 1 + 1500  # the model, the ModuleList, each Linear: a batch of 3 for 2 costs 3/2
    assert f"<summary>All changed modules ({changed})</summary>" in out
    details = out.split("<summary>All changed modules", 1)[1].split("</details>", 1)
    shown = details[0].count("\n| ") - 1  # the rows, less the header
    left = int(re.search(r"_([\d,]+) more rows not shown", details[1]).group(1).replace(",", ""))
    assert shown + left == changed and shown > 500
    assert "| aten::linear | changed | 0 | +24.000 K |" in out  # 1,500 x (3 - 2) x 4 x 4 MACs, in the whole operators' table
    code, small, err = cli(capsys, "diff", "gw_models.py:wide", "gw_models.py:wide", "--a-input", "2x4", "--b-input", "3x4",
                           "--config", "n=10", "--format", "markdown")
    # every row, and the ten alike as one in the top changes
    assert "more rows not shown" not in small and small.count("\n| blocks.") == 10 + 1 and "| blocks.\\* (x10) |" in small


def test_the_pr_comment_heading_shows_a_windows_path_as_written(workdir, capsys, base):
    (workdir / "reports\\base.json").write_text((workdir / base).read_text())
    code, out, err = cli(capsys, "diff", "reports\\base.json", base, "--format", "markdown")
    assert code == 0, err
    heading = re.search(r"<h3>(.*?)</h3>", _rendered(out)).group(1)
    assert "<code>reports\\base.json (gw_models.py:build)</code>" in heading


# -- finding 7: the eager model against the .pt2 it ships read as two different models

def _export(workdir, h: int, name: str) -> str:
    import gw_models  # the file the fixture wrote, on sys.path as the CLI put it there

    program = torch.export.export(gw_models.build(h).eval(), (torch.randn(N, IN),))
    torch.export.save(program, str(workdir / name))
    return name


def test_the_shipped_program_matches_its_eager_model(workdir, capsys, base, monkeypatch):
    monkeypatch.syspath_prepend(str(workdir))
    same, grown = _export(workdir, 32, "model.pt2"), _export(workdir, 48, "model48.pt2")
    code, out, err = cli(capsys, "diff", base, same)
    assert code == 0, err
    assert "no cost change (modules: 0 changed, 0 added, 0 removed)" in out
    assert "different models" not in out
    code, out, err = cli(capsys, "check", grown, "--baseline", base, "--max-growth", "params=0")
    assert code == 1, err
    assert "different models" not in err
    assert f"params +{params(48) - params(32)} (+" in out
    assert f"(most in l1 (Linear) +{IN * 16 + 16}, l2 (Linear) +{16 * OUT})" in out


# -- finding 8: a .pt2 calling a custom op this process lacks: a message cut mid-node

def test_a_program_calling_an_unregistered_op_names_it(workdir, capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(workdir))
    import gw_models

    program = torch.export.export(gw_models.build(32, True).eval(), (torch.randn(N, IN),))
    torch.export.save(program, str(workdir / "custom.pt2"))
    # the same program as a process without the op's library sees it: the op renamed in the archive
    with zipfile.ZipFile(workdir / "custom.pt2") as src, zipfile.ZipFile(workdir / "ghost.pt2", "w") as dst:
        for item in src.infolist():
            data = src.read(item.filename)
            if item.filename.endswith(".json"):
                data = data.replace(b"flopcount_gatewalk.mystery", b"flopcount_gatewalk_ghost.mystery")
            dst.writestr(item, data)
    err = one_error_line(*cli(capsys, "check", "ghost.pt2", "--max-flops", "1M"))
    assert "ghost.pt2 calls the operator flopcount_gatewalk_ghost::mystery, which is not registered in this process" in err
    assert "module:attr" in err


# -- findings 9 and 10: Windows paths on Linux; a diff's report as the baseline

def test_a_windows_path_says_what_it_would_be_here(workdir, capsys, base):
    (workdir / "models").mkdir()
    (workdir / "models" / "gw_models.py").write_text(MODELS)
    err = one_error_line(*cli(capsys, "check", "models\\gw_models.py:build", "-i", "4x16", "--max-flops", "1M"))
    assert "file not found: models\\gw_models.py (written with \\, as on Windows: folders are separated by / here, " \
           "models/gw_models.py exists)" in err
    err = one_error_line(*cli(capsys, "check", "gw_models.py:build", "-i", "4x16", "--baseline", "reports\\base.json"))
    assert "folders are separated by / here, reports/base.json) (write it with: flopcount count ENTRY --format json " \
           "--output reports/base.json)" in err


def test_a_diffs_report_as_the_baseline_is_named_as_such(workdir, capsys, base):
    code, _, err = cli(capsys, "diff", base, base, "--format", "json", "-o", "diff.json")
    assert code == 0, err
    assert json.loads((workdir / "diff.json").read_text())["kind"] == "diff"
    err = one_error_line(*cli(capsys, "check", "gw_models.py:build", "-i", "4x16", "--baseline", "diff.json"))
    assert "--baseline diff.json is a diff's report (flopcount diff --format json), not a count's" in err


# -- finding 11: the pre-commit hook did not run when the .pt2 a team gates was committed

def test_the_pre_commit_hook_runs_when_a_saved_program_is_staged():
    """pre-commit runs a hook only for staged files its ``files`` pattern matches (re.search on
    each path); it matched .py, .toml and .json, so committing a new model.pt2, the ENTRY of a
    team that gates the artifact it ships, ran no check."""
    from pathlib import Path

    from flopcount.cli.artifacts import ARTIFACT_SUFFIXES

    yaml = pytest.importorskip("yaml")
    (hook,) = yaml.safe_load((Path(__file__).parents[2] / ".pre-commit-hooks.yaml").read_text())
    pattern = re.compile(hook["files"])
    for suffix in set(ARTIFACT_SUFFIXES) - {".ts", ".zip"}:  # left out: TypeScript, archives of anything
        assert pattern.search(f"models/model{suffix}"), suffix
    for name in ("my_model.py", "pyproject.toml", "flopcount-baseline.json"):
        assert pattern.search(name)
    assert not pattern.search("README.md") and not pattern.search("src/app.ts")
