"""The ledger's roll-up of a count's module tables up the call tree (``Ledger._book_tree``, the
path of a plain count) on the events structural reuse books (issue #32 review): a module called
under two names, and a module shared by two parents whose call under the second is booked from
its call under the first (a subtree reused from another position of the model). Oracle: the
ledger's per-group booking of the same events (``rows=True`` takes it: each (stack, op, phase)
credited to each of its owners, ``owners_of``), table by table and in the same key order; and
hand-derived MACs."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from flopcount.core.analysis import cost_events
from flopcount.core.inputs import prepare_call
from flopcount.core.ledger import Ledger
from flopcount.core.model_facts import model_facts
from flopcount.handlers import default_registry
from flopcount.tracers import trace

B, D, H = 3, 8, 16


class Block(nn.Module):
    """Linear(D, H) -> ReLU -> Linear(H, D): 2 * D * H MACs per row."""

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(D, H)
        self.act = nn.ReLU()
        self.down = nn.Linear(H, D)

    def forward(self, x):
        return self.down(self.act(self.up(x)))


class Aliased(nn.Module):
    """One block under two names (``first``, ``again``), called through both, and a twin block."""

    def __init__(self) -> None:
        super().__init__()
        self.first = Block()
        self.again = self.first
        self.other = Block()

    def forward(self, x):
        return self.other(self.again(self.first(x)))


class Holder(nn.Module):
    def __init__(self, block: Block) -> None:
        super().__init__()
        self.m = block
        self.norm = nn.LayerNorm(D)

    def forward(self, x):
        return self.norm(self.m(x))


class TwoParents(nn.Module):
    """One block held by two parents (``a.m``, canonical, and ``b.m``), each calling it: its call
    inside ``b`` is booked from its call inside ``a`` (and ``b`` from ``a``: equal holders)."""

    def __init__(self) -> None:
        super().__init__()
        shared = Block()
        self.a = Holder(shared)
        self.b = Holder(shared)

    def forward(self, x):
        return self.b(self.a(x))


def _tables(ledger: Ledger):
    return (
        list(ledger.operators.items()),
        list(ledger.phases.items()),
        list(ledger.modules.items()),
        [(owner, list(ops.items())) for owner, ops in ledger.module_ops.items()],
    )


@pytest.mark.parametrize("reuse", ["1", "0"], ids=["reuse-on", "reuse-off"])
@pytest.mark.parametrize("make", [Aliased, TwoParents], ids=["aliased", "two-parents"])
def test_the_tree_roll_up_books_what_the_per_group_booking_books(monkeypatch, make, reuse):
    monkeypatch.setenv("FLOPCOUNT_REUSE", reuse)
    torch.manual_seed(0)
    model, inputs = make(), (torch.randn(B, D),)
    facts = model_facts(model)
    run = trace(model, prepare_call(inputs), facts=facts)
    costed = cost_events(run.events, default_registry())
    tree = Ledger(facts.aliases).book_all(costed)
    assert tree.rows == {}  # the tree roll-up ran (no rows kept)
    groups = Ledger(facts.aliases, rows=True).book_all(costed)
    assert groups.rows  # the per-group booking ran
    assert _tables(tree) == _tables(groups)
    # block calls of 2 * D * H MACs per row each, B rows: three (first, again, other) or two
    # (a.m, b.m); ReLU, the LayerNorms' affine parts and the adds are not MACs (their FLOPs are)
    assert tree.modules[""][1] == (3 if make is Aliased else 2) * B * 2 * D * H
    if make is TwoParents:
        # the shared block under its canonical name: both calls; each holder: its own call
        assert tree.modules["a.m"][1] == 2 * B * 2 * D * H
        assert tree.modules["a"][1] == tree.modules["b"][1] == B * 2 * D * H
        assert int(run.shape_cache["reused_calls"]) == (1 if reuse == "1" else 0)
