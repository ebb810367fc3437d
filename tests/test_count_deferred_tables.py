"""The default count's tables booked on first read (issue #32, branch deferbook): the totals at
once, summed once per distinct replayed record; the tables when one is first read, once, whatever
the threads; the same figures as booking at once, checked against hand-derived ones."""

from __future__ import annotations

import threading
from typing import Any, Dict, List

import pytest
import torch
from _layer_stacks import LayerList
from torch import nn

from flopcount import count_flops
from flopcount.core import ledger as ledger_module
from flopcount.core.results import ModuleInfo, aggregate
from flopcount.types import Cost, OpCall, OpEvent, ParamSummary, ReplayedCall

LAYERS, WIDTH, BATCH = 6, 32, 4


class _Counted(Cost):
    """A cost that counts how often its MACs are read (once per time it is summed)."""

    reads: List[int] = [0]

    def __getattribute__(self, name: str) -> Any:
        if name == "macs":
            _Counted.reads[0] += 1
        return super().__getattribute__(name)


def _replayed(layers: int, floats: bool) -> List[Any]:
    """A first layer's two events, then ``layers - 1`` replays of it sharing one ops tuple and one
    costs tuple (as cost_records makes them), one op of which has no handler and one an estimate."""
    mm = OpCall("aten::mm", {}, ())
    unknown = OpCall("custom::op", {}, ())
    estimated = OpCall("aten::nonzero", {}, ())
    matmul = _Counted(macs=WIDTH * WIDTH, flops=2 * WIDTH * WIDTH, bytes_read=12, bytes_written=4)
    note = _Counted(macs=0, flops=2.5 if floats else 3, note="depends on the data")
    ops = ((mm, 1, "forward"), (unknown, 0, "forward"), (estimated, 1, "forward"))
    costs = (matmul, None, note)
    first = ("model", "model.layers.0")
    costed: List[Any] = [
        (OpEvent(mm, (*first, "model.layers.0.fc")), matmul),
        (OpEvent(unknown, first), None),
        (OpEvent(estimated, (*first, "model.layers.0.fc")), note),
    ]
    for i in range(1, layers):
        root = ("model", f"model.layers.{i}")
        costed.append((ReplayedCall(ops, (root, (*root, f"model.layers.{i}.fc")), root), costs))
    return costed


def _options(layers: int) -> Dict[str, Any]:
    names = ["", "model", "model.layers"]
    for i in range(layers):
        names += [f"model.layers.{i}", f"model.layers.{i}.fc"]
    modules = [ModuleInfo(name, "Module", name.count(".") + bool(name), 1, 0) for name in names]
    return dict(tracer="dispatch", modules=modules, parameters=ParamSummary(total=0, trainable=0, frozen=0),
                input_description="x")


@pytest.mark.parametrize("floats", [False, True], ids=["integers", "a-float"])
def test_the_deferred_totals_sum_a_replayed_records_costs_once(floats: bool) -> None:
    """80 replays of one layer cost one layer's sums, not 80 layers' events (the 70B count was 12 %
    slower deferred while its totals were summed event by event). Before: 80 reads per cost."""
    reads: Dict[int, int] = {}
    for layers in (3, 80):
        _Counted.reads[0] = 0
        aggregate(_replayed(layers, floats), deferred=True, **_options(layers))
        reads[layers] = _Counted.reads[0]
    if not floats:  # a float figure is booked at once (as before): every event's cost read again
        assert reads[80] == reads[3], reads
    costed = _replayed(layers, floats)
    deferred = aggregate(costed, deferred=True, **_options(layers))
    booked = aggregate(costed, **_options(layers))
    # by hand: each layer one WIDTH x WIDTH product and an estimate of 3 (or 2.5) FLOPs
    assert deferred.macs == layers * WIDTH * WIDTH
    assert deferred.flops == layers * (2 * WIDTH * WIDTH + (2.5 if floats else 3))
    assert (deferred.bytes_read, deferred.bytes_written) == (layers * 12, layers * 4)
    assert deferred.unsupported_ops() == {"custom::op": layers}
    assert deferred.warnings == booked.warnings == ("aten::nonzero (80 calls) is an estimate: depends on the data",)
    assert deferred == booked
    assert deferred.to_dict() == booked.to_dict()
    if not floats:  # (a table's figures are read as integers)
        assert deferred.by_module("flops")["model.layers.79.fc"] == 2 * WIDTH * WIDTH + 3


def _stack() -> nn.Module:
    torch.manual_seed(0)
    return LayerList([nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU()) for _ in range(LAYERS)], width=WIDTH).eval()


def test_a_count_books_its_tables_when_first_read_once_whatever_the_threads(monkeypatch) -> None:
    """The totals are there when the count returns, the tables are booked by the first reader:
    once, two threads reading a fresh result at once get the same rows (the same objects)."""
    monkeypatch.setenv("FLOPCOUNT_REUSE", "1")
    booked: List[int] = []
    tree = ledger_module.Ledger._book_tree
    gate = threading.Event()

    def book_tree(self: Any, costed: Any) -> Any:
        if costed:  # (the records with an op without a handler or a note: none here)
            booked.append(1)
        gate.wait(5)  # the second reader arrives while the first books
        return tree(self, costed)

    monkeypatch.setattr(ledger_module.Ledger, "_book_tree", book_tree)
    gate.set()
    model, x = _stack(), torch.randn(BATCH, WIDTH)
    result = count_flops(model, x)
    # by hand: per layer one (BATCH x WIDTH) @ (WIDTH x WIDTH) product and its bias, the head's likewise
    layer_macs = BATCH * WIDTH * WIDTH
    assert result.macs == LAYERS * layer_macs + BATCH * WIDTH * 10
    assert result.reused_calls == LAYERS - 1
    assert booked == []  # nothing booked for the totals (no op without a handler, no note)
    gate.clear()
    barrier = threading.Barrier(2)
    seen: List[Any] = []

    def read() -> None:
        barrier.wait()
        seen.append((result._modules, result._module_ops, result.by_module("macs")))

    threads = [threading.Thread(target=read) for _ in range(2)]
    for thread in threads:
        thread.start()
    gate.set()
    for thread in threads:
        thread.join()
    assert booked == [1]
    (modules, module_ops, by_module), (other_modules, other_ops, other_by_module) = seen
    assert dict(modules) == dict(other_modules) and by_module == other_by_module
    assert all(modules[name] is other_modules[name] for name in modules)
    assert all(module_ops[name] is other_ops[name] for name in module_ops)
    assert by_module["layers.3"] == by_module["layers.3.0"] == layer_macs
    assert by_module[""] == result.macs
    assert result.by_operator("macs") == {"aten::linear": result.macs, "aten::relu": 0}
