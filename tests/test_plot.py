"""Plots: the depth the FLOP plot picks when none is given, and the budget panel of
``check --plot`` (PASS / FAIL / INCOMPLETE). Counts are hand-derived Linear MACs."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from flopcount import count_flops
from flopcount.budget.check import Budget, check_budget, check_result
from flopcount.report.plot import choose_depth, draw_figure, draw_sunburst, plot_result, top_modules

pytest.importorskip("matplotlib")


def _blocks(n_blocks: int, per_block: int, width: int = 8) -> nn.Module:
    return nn.Sequential(*(nn.Sequential(*(nn.Linear(width, width, bias=False) for _ in range(per_block))) for _ in range(n_blocks)))


@pytest.mark.parametrize("tracer", ["jit", "dispatch"])
def test_depth_is_the_deepest_where_the_top_bars_explain_most(tracer):
    # 3 blocks x 20 equal Linear(8, 8): each Linear is 1/60 of the FLOPs (batch 4: 4*8*8 MACs each).
    # depth 1: 3 bars explain 100 %; depth 2: the top 15 of 60 explain 25 % < 80 %  -> depth 1
    result = count_flops(_blocks(3, 20), torch.randn(4, 8), tracer=tracer)
    assert result.macs == 60 * 4 * 8 * 8
    assert choose_depth(result, top=15) == 1
    # 2 blocks x 6: depth 2 has 12 leaves, all shown (100 %)  -> the finer depth 2
    assert choose_depth(count_flops(_blocks(2, 6), torch.randn(4, 8), tracer=tracer), top=15) == 2
    # no bar under 80 % anywhere with top=1 of 3 x 20: the depth explaining most (1 block = 1/3) wins
    assert choose_depth(result, top=1) == 1


def test_resnet50_plot_has_no_dominant_other_bar():
    from flopcount.examples.resnet import resnet50

    with torch.device("meta"):
        model = resnet50()
    result = count_flops(model, torch.empty(1, 3, 224, 224, device="meta"))
    leaf_bars = top_modules(result, 15, None)
    auto = choose_depth(result, 15)
    auto_bars = top_modules(result, 15, auto)
    for bars in (leaf_bars, auto_bars):  # invariant: the bars add up to the total
        assert sum(f for _, f in bars) == result.flops
    leaf_other = leaf_bars[-1][1] / result.flops
    auto_other = auto_bars[-1][1] / result.flops if auto_bars[-1][0].startswith("other") else 0.0
    assert leaf_bars[-1][0] == "other (111 modules)" and leaf_other > 0.5  # the plot issue #14 saw
    assert auto == 2 and auto_other < 0.2  # 16 bottlenecks + stem/head: the top 15 explain > 80 %


def test_budget_panel_shows_the_tables_status():
    # the panel had its own rule (plot.budget_status): a FLOPs budget over its limit on an incomplete
    # count was FAIL there and INCOMPLETE in the table, a latency lower bound within its limit PASS
    # there and UNDECIDED in the table; the panel now shows each line's own status
    report = check_budget(Budget(max_params=1000, max_flops=100, max_latency_s=0.005), params=256, flops=500, latency_s=0.001,
                          incomplete_reasons=("aten::foo ran without a handler",), latency_bound="lower")
    assert [str(line.status) for line in report.lines] == ["PASS", "INCOMPLETE", "UNDECIDED"]
    result = count_flops(_blocks(2, 2), torch.randn(4, 8))
    panel = draw_figure(result, budget=report).axes[1]
    shown = {tick.get_text(): text.get_text().split()[0] for tick, text in zip(panel.get_yticklabels(), panel.texts[1:])}
    assert shown == {"params": "PASS", "flops": "INCOMPLETE", "latency": "UNDECIDED"}
    assert panel.get_title(loc="left").startswith("Budgets: INCOMPLETE")


def test_check_plot_draws_a_budget_panel(tmp_path):
    from matplotlib.image import imread

    result = count_flops(_blocks(2, 2), torch.randn(4, 8))
    report = check_result(result, Budget(max_params=1000, max_macs=100))  # 256 params pass; 1024 MACs fail
    assert [line.passed for line in report.lines] == [True, False]
    plain, with_budget = tmp_path / "plain.png", tmp_path / "budget.png"
    plot_result(result, plain)
    plot_result(result, with_budget, budget=report)
    assert imread(str(with_budget)).shape[0] > imread(str(plain)).shape[0]  # one more panel below


def test_sunburst_wedges_are_shares_of_the_total():
    from matplotlib.patches import Wedge

    # 2 blocks x 6 equal Linear layers: ring 1 = two 180-degree wedges, ring 2 = twelve of 30 degrees
    result = count_flops(_blocks(2, 6), torch.randn(4, 8))
    figure = draw_sunburst(result, max_depth=2)
    wedges = [p for p in figure.axes[0].patches if isinstance(p, Wedge)]
    spans = sorted(round(w.theta2 - w.theta1, 6) for w in wedges)
    assert spans == [30.0] * 12 + [180.0] * 2 + [360.0]  # the centre disc is the whole model


def test_cli_sunburst(tmp_path, monkeypatch, capsys):
    from flopcount.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["count", "example:vit_tiny", "--plot", "sun.png", "--plot-kind", "sunburst", "--quiet"]) == 0
    assert (tmp_path / "sun.png").read_bytes().startswith(b"\x89PNG")
