"""``--format html``: one self-contained page (nothing fetched from the network) with the
summary, the command's sections, the plot inline, the module table and the tree."""

from __future__ import annotations

import base64
import re

import pytest
import torch
from torch import nn

from flopcount import count_flops
from flopcount.budget.check import Budget, check_result
from flopcount.cli import main
from flopcount.report.html import html_report


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


MACS = 4 * (16 * 32 + 32 * 8)  # batch 4, hand-derived


def _no_network(page: str) -> None:
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)
    assert "<script" not in page and "@import" not in page


@pytest.mark.parametrize("tracer", ["jit", "dispatch"])
def test_page_is_self_contained_with_tables_tree_and_plot(tracer):
    pytest.importorskip("matplotlib")
    result = count_flops(Net(), torch.randn(4, 16), tracer=tracer)
    assert result.macs == MACS
    report = check_result(result, Budget(max_macs=MACS - 1))
    page = html_report(result, entry="models.py:Net", sections=[("Budgets", report.table())], budget=report)
    _no_network(page)
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert 'class="FAIL"' in page and "<h2>Budgets</h2>" in page
    for heading in ("FLOPs by module", "By operator", "Module tree"):
        assert f"<h2>{heading}</h2>" in page
    assert "fc1" in page and "fc2" in page
    png = re.search(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert png and base64.b64decode(png.group(1)).startswith(b"\x89PNG\r\n\x1a\n")


def test_page_escapes_names_and_stands_without_matplotlib(monkeypatch):
    import flopcount.report.plot as plot

    def missing() -> None:
        raise plot.UsageError(plot.INSTALL_HINT)

    monkeypatch.setattr(plot, "require_matplotlib", missing)
    result = count_flops(Net(), torch.randn(4, 16))
    page = html_report(result, entry="<evil>.py:Net")
    assert "<evil>" not in page and "&lt;evil&gt;" in page
    assert "flopcount[plot]" in page and "<img" not in page
    assert "fc1" in page


def test_cli_format_html(tmp_path, monkeypatch, capsys):
    pytest.importorskip("matplotlib")
    monkeypatch.chdir(tmp_path)
    out_file = tmp_path / "report.html"
    assert main(["count", "example:vit_tiny", "--format", "html", "-o", str(out_file), "--quiet"]) == 0
    page = out_file.read_text()
    _no_network(page)
    assert "example:vit_tiny" in page and "conv_proj" in page and "data:image/png;base64," in page
