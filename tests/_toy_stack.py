"""The toy stack of identical blocks the reuse and fake-copy tests count: ``Stack(n)`` runs ``n``
``Block``s in a ``ModuleList``, one after another. Each block is Linear(D, h) -> ReLU ->
Linear(h, D) + x: ``2 * D * h`` MACs per row (bias adds and the residual are not MACs), so a
stack of ``n`` blocks on a (B, D) input is ``n * B * 2 * D * h`` MACs."""

from __future__ import annotations

import os

from conftest import assert_same_state, snapshot
from torch import nn

from flopcount import count_flops

B, D, H = 3, 8, 16  # batch (rows, > 1), width, inner width


class Block(nn.Module):
    def __init__(self, hidden: int = H) -> None:
        super().__init__()
        self.up = nn.Linear(D, hidden)
        self.act = nn.ReLU()
        self.down = nn.Linear(hidden, D)

    def forward(self, x):
        return self.down(self.act(self.up(x))) + x


class Stack(nn.Module):
    def __init__(self, n: int = 8, hidden: int = H) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(hidden) for _ in range(n))

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


def rows(result):
    """Every reading's rows of a count: totals, module calls, and per operator, module, module and
    operator, and phase, for MACs and FLOPs (what reuse on and off must give alike)."""
    return (
        result.to_dict(),
        [(m.name, m.calls) for m in result.modules],
        *((result.by_operator(m), result.by_module(m), result.by_module_and_operator(m), result.by_phase(m))
          for m in ("macs", "flops")),
    )


def off_and_on(monkeypatch, model, inputs, **options):
    """The count with reuse off (``FLOPCOUNT_REUSE=0``: every call traced) and on (under the policy
    the test set, ``always`` with the ``reuse_always`` fixture, else the default); the model checked
    to be left as found by both."""
    before = snapshot(model)
    on_as = "always" if os.environ.get("FLOPCOUNT_REUSE") == "always" else "1"
    monkeypatch.setenv("FLOPCOUNT_REUSE", "0")
    off = count_flops(model, inputs, **options)
    monkeypatch.setenv("FLOPCOUNT_REUSE", on_as)
    on = count_flops(model, inputs, **options)
    assert_same_state(model, before)
    return off, on
