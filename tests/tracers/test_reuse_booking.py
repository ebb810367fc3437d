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

from flopcount import count_flops
from flopcount.core.analysis import cost_events, cost_records
from flopcount.core.inputs import prepare_call
from flopcount.core.ledger import Ledger
from flopcount.core.model_facts import model_facts
from flopcount.handlers import default_registry
from flopcount.tracers import trace

# the reuse key on stacks of 2 or 3 small blocks: every twin group keyed (the default policy would trace
# them: tests/conftest.py, ``reuse_always``)
pytestmark = pytest.mark.usefixtures("reuse_always")

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


@pytest.mark.parametrize("reuse", ["always", "0"], ids=["reuse-on", "reuse-off"])
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
        assert int(run.shape_cache["reused_calls"]) == (1 if reuse == "always" else 0)


class Wrapped(nn.Module):
    """A block one level down (``inner``)."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = Block()

    def forward(self, x):
        return self.inner(x)


class TwoDepths(nn.Module):
    """Three equal blocks: ``first`` traced, ``shallow`` (depth 1) and ``deep.inner`` (depth 2)
    booked from it: two replays of one group called at different depths, as timm's LeViT calls
    its ``LinearNorm`` as ``stages.1.downsample.mlp.ln2`` and ``stages.1.blocks.0.mlp.ln2``."""

    def __init__(self) -> None:
        super().__init__()
        self.first = Block()
        self.shallow = Block()
        self.deep = Wrapped()

    def forward(self, x):
        return self.deep(self.shallow(self.first(x)))


def test_replays_of_one_block_at_two_depths_are_credited_to_their_own_modules(monkeypatch):
    """The tree roll-up grafts each replay's subtree onto the call tree; the nodes of a group's
    subtree were located by absolute stack length, made from the deepest replay, so the shallower
    replay credited its block's whole table to ``shallow.up`` and nothing to ``shallow`` (its
    ``act``, ``down`` nothing either)."""
    torch.manual_seed(0)
    model, x = TwoDepths(), torch.randn(B, D)
    facts = model_facts(model)
    monkeypatch.setenv("FLOPCOUNT_REUSE", "always")
    run = trace(model, prepare_call((x,)), facts=facts)
    assert int(run.shape_cache["reused_calls"]) == 2  # shallow and deep.inner booked from first
    costed = cost_records(run.records, default_registry())
    tree = Ledger(facts.aliases).book_all(costed)
    groups = Ledger(facts.aliases, rows=True).book_all(cost_events(run.events, default_registry()))
    assert _tables(tree) == _tables(groups)
    # hand-derived: a block is B * D * H MACs per linear; each linear is its own module's
    block_macs, linear_macs = B * 2 * D * H, B * D * H
    for name in ("first", "shallow", "deep", "deep.inner"):
        assert tree.modules[name][1] == block_macs, name
    for name in ("first.up", "first.down", "shallow.up", "shallow.down", "deep.inner.up", "deep.inner.down"):
        assert tree.modules[name][1] == linear_macs, name
    # every table a user reads is the reuse-off count's
    on = count_flops(model, x)
    monkeypatch.setenv("FLOPCOUNT_REUSE", "0")
    off = count_flops(model, x)
    assert on.reused_calls == 2 and off.reused_calls == 0
    assert on.to_dict() == off.to_dict()
    for metric in ("flops", "macs", "count", "bytes_read", "bytes_written"):
        assert on.by_module(metric) == off.by_module(metric), metric
        assert on.by_module_and_operator(metric) == off.by_module_and_operator(metric), metric
