"""Branch auditrest: work without a compute roof (bool masks, int64 indices) priced by its bytes
only, with one note; the whole model named ``(model)`` in sentences as in the tables; ``dir()``
of the package is its public API. Each test failed on the parent of its fix."""

from __future__ import annotations

import ast
from pathlib import Path

import torch
from torch import nn

import flopcount
from flopcount import count_flops, predict
from flopcount.report.notes import note_lines
from flopcount.units import ROOT_LABEL


class _All(nn.Module):
    def forward(self, mask):
        return mask.all()


def test_bool_work_has_no_compute_term_and_one_note():
    """``mask.all()`` over 10^8 booleans on an H100: 10^8 FLOPs in bool, which no datasheet
    peak prices. They were priced at int8's tensor-core peak (50.5 ns of compute that no
    published rate supports); now bytes only. Memory, by hand from the datasheet: 10^8 + 1
    bytes, the 50 MB the L2 holds taken off, over 3.35 TB/s."""
    mask = torch.empty(10**8, dtype=torch.bool, device="meta")
    result = predict(_All(), (mask,), on="h100")
    memory_s = (10**8 + 1 - 50e6) / 3.35e12
    assert result.compute_s == 0.0 and result.any_bound is not None and result.any_bound.compute_s == 0.0
    assert result.latency_s == memory_s
    assert result.unpriced == ("bool",)
    notes = [w for w in result.warnings if "no peak" in w]
    assert notes == ["H100 SXM has no peak for bool: 1 call(s) doing 100.000 M FLOPs in them are priced by their "
                     "bytes only (no compute term), so the bound stays a lower bound"]


def test_a_floating_dtype_without_a_peak_keeps_its_stand_in():
    """bfloat16 on a T4 (no bf16 column) is still priced at fp16's 65 TFLOP/s (T4 datasheet)."""
    linear = nn.Linear(512, 512, bias=False)
    result = predict(linear, (torch.randn(64, 512),), on="t4", dtype="bfloat16")
    assert result.compute_s == 2 * 64 * 512 * 512 / 65e12
    assert any("priced at the highest of its kind (bfloat16 at float16)" in w for w in result.warnings)


class _Mystery(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return torch.special.bessel_j0(self.fc(x))  # no handler, in the root module


def test_a_note_names_the_whole_model_as_the_tables_do():
    """The INCOMPLETE note said 'in <root>' where every per-module table says '(model)'."""
    result = count_flops(_Mystery(), torch.randn(2, 4))
    lines = note_lines(result)
    assert f"  - aten::special_bessel_j0 ran 1x without a handler and is NOT counted (in {ROOT_LABEL})" in lines
    assert not any("<root>" in line for line in lines)


def _typed_reexports() -> set:
    """The names ``flopcount/__init__.py`` re-exports for type checkers (``import X as X``
    under ``TYPE_CHECKING``): read from the source, not from the module's tables."""
    tree = ast.parse(Path(flopcount.__file__).read_text())
    block = next(node for node in tree.body if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING")
    return {alias.asname for node in block.body if isinstance(node, ast.ImportFrom) for alias in node.names}


def test_dir_lists_the_public_api():
    """dir(flopcount) listed Any, Dict, Callable, importlib, TYPE_CHECKING... beside the API."""
    listed = dir(flopcount)
    assert listed == sorted(_typed_reexports() | {"__version__"})
    assert listed == sorted(set(flopcount.__all__) | {"__version__"})
    for name in listed:
        getattr(flopcount, name)  # each one loads
