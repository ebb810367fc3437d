"""Ledger.rebook_group books a change shared by many events once per key (the same attention
call one decode step later in each of 80 layers): it must leave exactly the tables that
rebooking each event does (the oracle: Ledger.rebook per event), for plain costs, split
(fused) costs whose parts change, several phases, and non-integer figures (booked per event)."""

from __future__ import annotations

from typing import List

import pytest

from flopcount.core.ledger import Ledger
from flopcount.types import Cost, OpCall, OpEvent


def _events(layers: int, phase: str = "forward") -> List[OpEvent]:
    call = OpCall("aten::_scaled_dot_product_flash_attention", {}, ())
    return [OpEvent(call, ("model", f"model.layers.{i}", f"model.layers.{i}.self_attn"), phase) for i in range(layers)]


def _tables(ledger: Ledger):
    return (ledger.operators, ledger.phases, ledger.modules, {k: dict(v) for k, v in ledger.module_ops.items()})


CASES = {
    "plain": (Cost(macs=100, flops=200, bytes_read=64, bytes_written=32), Cost(macs=110, flops=220, bytes_read=68, bytes_written=32)),
    "split": (Cost.split(("aten::bmm", Cost(macs=50, flops=100)), ("aten::_softmax", Cost(flops=30))),
              Cost.split(("aten::bmm", Cost(macs=55, flops=110)), ("aten::_softmax", Cost(flops=33)))),
    "float": (Cost(macs=100, flops=200.5), Cost(macs=110, flops=220.25)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_group_books_what_each_event_would(case: str) -> None:
    old, new = CASES[case]
    events = _events(80) + _events(3, phase="backward")
    one_by_one, grouped = Ledger(), Ledger()
    for event in events:
        one_by_one.rebook(event, old, new)
    grouped.rebook_group(events, old, new)
    assert _tables(grouped) == _tables(one_by_one)
    # by hand, the plain case: the root owns all 83 events, each 10 MACs more
    if case == "plain":
        assert grouped.modules[""] == [0, 83 * 10, 83 * 20, 83 * 4, 0]
        assert grouped.modules["model.layers.7.self_attn"] == [0, 10, 20, 4, 0]
