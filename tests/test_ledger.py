"""The one ledger: a count and a re-pricing book the same way (split costs included), and
every metric of the cost vector (bytes too) is booked by operator, module and phase."""

from __future__ import annotations

import pytest

from flopcount.core.ledger import Ledger
from flopcount.core.results import aggregate, reprice_deferred
from flopcount.types import Cost, OpCall, OpEvent, ParamSummary

PARAMS = ParamSummary(total=0, trainable=0, frozen=0)


def _event(op: str, stack=(), phase="forward") -> OpEvent:
    return OpEvent(OpCall(op, {}), tuple(stack), phase)


def _split(scale: int) -> Cost:
    """A fused attention-like op reported as the ops it performs (the shape of
    ``flopcount::multi_head_attention_forward``'s cost)."""
    return Cost.split(
        ("aten::linear", Cost(macs=10 * scale, flops=20 * scale, bytes_read=100 * scale, bytes_written=40 * scale)),
        ("aten::bmm", Cost.from_macs(3 * scale)),
        ("aten::softmax", Cost.from_flops(5 * scale)),
    )


def _count(costed, aliases=None):
    return aggregate(costed, tracer="dispatch", modules=(), parameters=PARAMS, aliases=aliases)


def test_reprice_books_split_costs_like_aggregate():
    """The #19 bug: reprice ignored Cost.parts and raised KeyError on the fused op's name
    (count_generation on any decoder built on nn.MultiheadAttention). Each event its own
    group of the re-pricing a continued decode step runs (reprice_deferred)."""
    mha = _event("flopcount::multi_head_attention_forward", ("layers", "layers.0", "layers.0.attn"))
    mm = _event("aten::mm", ("layers", "layers.0", "layers.0.mlp"))
    step0 = [(mha, _split(1)), (mm, Cost(macs=7, flops=14, bytes_read=8, bytes_written=4))]
    step1 = [(mha, _split(3)), (mm, Cost(macs=7, flops=14, bytes_read=8, bytes_written=4))]
    repriced = reprice_deferred(_count(step0), [([e], old, new) for (e, old), (_, new) in zip(step0, step1)])
    truth = _count(step1)
    for metric in ("flops", "macs", "count", "bytes", "bytes_read", "bytes_written"):
        assert repriced.by_operator(metric) == truth.by_operator(metric), metric
        assert repriced.by_phase(metric) == truth.by_phase(metric), metric
        assert repriced.by_module_and_operator(metric) == truth.by_module_and_operator(metric), metric
    # by hand: linear 30 MACs + bmm 9 MACs + mm 7 MACs
    assert (repriced.macs, repriced.flops) == (46, 2 * 46 + 15)
    assert repriced.bytes == 300 + 120 + 12
    assert repriced.by_operator("count") == {"aten::bmm": 1, "aten::linear": 1, "aten::mm": 1, "aten::softmax": 1}


def test_reprice_credits_aliases_like_aggregate():
    """A module reachable under two names is credited the same way by both bookings."""
    aliases = {"a.m": ("a.m", "b.m")}
    event = _event("aten::mm", ("b", "a.m"))
    before, after = Cost(macs=2, flops=4, bytes_read=6), Cost(macs=5, flops=10, bytes_read=9)
    repriced = reprice_deferred(_count([(event, before)], aliases), [([event], before, after)])
    truth = _count([(event, after)], aliases)
    assert repriced._modules == truth._modules
    assert truth.module_totals("b").macs == 5 and truth.module_totals("a.m").bytes_read == 9


@pytest.mark.parametrize("phase", ["forward", "backward", "optimizer"])
def test_every_metric_booked_by_phase(phase):
    event = _event("aten::add_", ("m",), phase)
    result = _count([(event, Cost(flops=3, bytes_read=24, bytes_written=12))] * 2)
    totals = result.operator_totals()["aten::add_"]
    assert (totals.count, totals.flops, totals.bytes_read, totals.bytes_written) == (2, 6, 48, 24)
    assert totals.intensity == pytest.approx(6 / 72)
    assert result.by_phase("bytes") == {phase: 72}
    assert result.module_totals("m").bytes == 72 and result.module_totals("").bytes == 72


def test_unsupported_and_notes_are_booked_once():
    ledger = Ledger().book_all([(_event("x::y", ("m",)), None), (_event("x::y"), None),
                                (_event("aten::nms"), Cost(flops=1).with_note("bound"))])
    assert ledger.unsupported["x::y"][0] == 2 and list(ledger.unsupported["x::y"][1]) == ["m", ""]
    assert ledger.notes == {("aten::nms", "bound"): 1}


def test_cost_vector_adds_and_splits_every_metric():
    a = Cost(macs=1, flops=2, bytes_read=3, bytes_written=4)
    b = Cost(macs=10, flops=20, bytes_read=30, bytes_written=40)
    assert a + b == Cost(macs=11, flops=22, bytes_read=33, bytes_written=44)
    fused = Cost.split(("aten::mm", a), ("aten::add", b))
    assert (fused.bytes_read, fused.bytes_written, fused.bytes) == (33, 44, 77)
    moved = fused.with_traffic(5, 6)
    assert moved.parts[0][1].bytes == 11 and moved.parts[1][1].bytes == 0 and moved.bytes == 11
    with pytest.raises(ValueError):
        _ = fused + Cost(bytes_read=1)
