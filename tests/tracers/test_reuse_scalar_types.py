"""Structural reuse keys a plain attribute a forward reads by its type as well as its value (issue
#32's contract: a reuse that cannot be proven exact is not taken). ``True == 1 == 1.0`` in Python,
and they hash alike, but a forward can do different work with each: ``torch.full(shape, fill)``
makes a bool, an int64 or a float32 tensor, and the bytes written and read differ (1, 8 and 4 bytes
an element). Before the fix, blocks that differed only in such a value were booked from the first
one's trace."""

from __future__ import annotations

import pytest
import torch
from _toy_stack import B, D
from _toy_stack import off_and_on as _both
from _toy_stack import rows as _rows
from torch import nn

# the reuse key on stacks of 2 or 3 small blocks: every twin group keyed (the default policy would trace
# them: tests/conftest.py, ``reuse_always``)
pytestmark = pytest.mark.usefixtures("reuse_always")

# not jit: torch.jit.trace cannot trace torch.full with a bool fill (an internal assert in its alias
# analysis, torch 2.13), and the jit tracer does no structural reuse
TRACERS = ["auto", "dispatch"]


class _Fill(nn.Module):
    """Linear(D, D), then a (B, D) tensor filled with ``fill`` made and, cast to the output's dtype, added."""

    def __init__(self, fill) -> None:
        super().__init__()
        self.lin = nn.Linear(D, D)
        self.fill = fill

    def forward(self, x):
        y = self.lin(x)
        return y + torch.full(y.shape, self.fill).to(y.dtype)


class _Fills(nn.Module):
    def __init__(self, fills) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(_Fill(f) for f in fills)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


def _full_bytes(result, name: str) -> int:
    """Bytes written by ``aten::full`` booked to module ``name``."""
    return int(result.by_module_and_operator("bytes_written").get(name, {}).get("aten::full", 0))


@pytest.mark.parametrize("tracer", TRACERS)
@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_layers_differing_only_in_a_bool_int_or_float_they_read_count_each_their_own(monkeypatch, tracer, train):
    fills = [True, 1, 1.0, True, 1]
    model = _Fills(fills).train(train)
    off, on = _both(monkeypatch, model, (torch.randn(B, D),), tracer=tracer)
    assert _rows(on) == _rows(off)
    assert on.bytes_written == off.bytes_written
    # the filled tensor: B * D elements of torch.full's dtype for the fill's type
    size = {bool: 1, int: 8, float: 4}
    for i, fill in enumerate(fills):
        assert _full_bytes(on, f"blocks.{i}") == B * D * size[type(fill)], (i, fill)
    if tracer == "auto":
        assert on.reused_calls == 2  # blocks 3 and 4 booked from 0 and 1; 1 and 2 read another type


class _Pair(nn.Module):
    """Linear(D, D) then ``torch.full`` of the pair's first value, as above: a tuple attribute."""

    def __init__(self, pair) -> None:
        super().__init__()
        self.lin = nn.Linear(D, D)
        self.pair = pair

    def forward(self, x):
        y = self.lin(x)
        return y + torch.full(y.shape, self.pair[0]).to(y.dtype)


def test_tuples_of_bools_and_of_ints_are_keyed_apart(monkeypatch):
    pairs = [(True, False), (1, 0), (True, False), (1, 0)]
    model = nn.Sequential(*(_Pair(p) for p in pairs))
    off, on = _both(monkeypatch, model, (torch.randn(B, D),))
    assert _rows(on) == _rows(off)
    for i, pair in enumerate(pairs):
        assert _full_bytes(on, str(i)) == B * D * (1 if type(pair[0]) is bool else 8), i
    assert on.reused_calls == 2  # 2 from 0, 3 from 1
