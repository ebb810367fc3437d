"""One row type across readings (issue #27 item 6): ``FlopResult.operator_totals()`` and
``module_totals(name)`` give :class:`~flopcount.core.rows.CostRow` s, the rows of
``predict``'s (and ``profile``'s) ``by_operator()`` and ``by_module()``, made by the ledger's
one rule; ``flopcount.OpTotals``, the count's 0.2 row, is a deprecated name for it.

Oracles: ``torch.utils.flop_counter.FlopCounterMode`` run live on a copy of the model (the
contractions' FLOPs, per module), the hand formula 2 * batch * in * out per Linear call, and
``predict``'s rows (booked by the ledger from its own trace) for every field.
"""

from __future__ import annotations

import copy
import importlib
import warnings
from typing import Dict, Tuple

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

import flopcount
from flopcount.core.rows import CostRow

BATCH, IN, HIDDEN = 3, 8, 16


class SharedProj(nn.Module):
    """``proj`` is also ``a.0`` (one Linear under two names), called once inside ``a`` and
    once by the root; ``b`` is called twice by the root."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(IN, HIDDEN)
        self.a = nn.Sequential(self.proj, nn.ReLU())
        self.b = nn.Linear(HIDDEN, IN)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x)) + self.b(torch.relu(self.proj(x)))


def _model() -> Tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return SharedProj().eval(), torch.randn(BATCH, IN)


def _figures(row: CostRow) -> Tuple[object, ...]:
    return (row.name, row.module, row.phase, row.calls, row.flops, row.macs, row.bytes_read, row.bytes_written)


def _live_flops(model: nn.Module, x: torch.Tensor, backward: bool) -> Dict[str, int]:
    """FlopCounterMode's FLOPs by module on a copy of ``model`` (the caller's model keeps no
    ``.grad``): ``{"Global": total, "SharedProj.b": ..., ...}``."""
    twin = copy.deepcopy(model)
    with FlopCounterMode(display=False) as counter:
        out = twin(x)
        if backward:
            out.sum().backward()
    return {name: sum(by_op.values()) for name, by_op in counter.get_flop_counts().items()}


@pytest.mark.parametrize("backward", [False, True])
def test_count_rows_are_predicts_rows(backward: bool) -> None:
    model, x = _model()
    count = flopcount.count_flops(model, x, backward=backward)
    bound = flopcount.predict(model, x, on="h100", backward=backward)

    operators = count.operator_totals()
    assert all(type(row) is CostRow for row in operators.values())
    assert {op: _figures(row) for op, row in operators.items()} == {op: _figures(row) for op, row in bound.by_operator().items()}
    expected_phase = "all" if backward else "forward"
    assert {row.phase for row in operators.values()} == {expected_phase}
    assert list(operators) == sorted(operators, key=lambda op: (-operators[op].flops, -operators[op].calls, op))

    modules = bound.by_module()
    assert sorted(m.name for m in count.modules) == sorted(modules)
    for info in count.modules:
        row = count.module_totals(info.name)
        assert type(row) is CostRow and row.count == row.calls
        assert _figures(row) == _figures(modules[info.name]), info.name

    # the contractions' FLOPs against torch's counter, run live (it counts contractions only)
    live = _live_flops(model, x, backward)
    contractions = ("aten::linear", "aten::mm")
    assert sum(operators[op].flops for op in contractions if op in operators) == live["Global"]
    if not backward:
        linear = 2 * BATCH * IN * HIDDEN  # FLOPs of one Linear call, either layer
        assert count.module_totals("b").flops == 2 * linear == live["SharedProj.b"]  # called twice
        assert 2 * count.module_totals("a").macs == linear == live["SharedProj.a"]  # proj's call inside a
        assert count.module_totals("proj").flops == 2 * linear  # both calls of the shared Linear
        assert count.module_totals("").flops == operators["aten::linear"].flops + operators["aten::relu"].flops \
            + operators["aten::add"].flops


def test_module_totals_unknown_name_and_a_module_that_never_ran() -> None:
    class Idle(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.used = nn.Linear(IN, HIDDEN)
            self.unused = nn.Linear(IN, HIDDEN)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.used(x)

    count = flopcount.count_flops(Idle(), torch.randn(BATCH, IN))
    assert _figures(count.module_totals("unused")) == ("unused", "unused", "forward", 0, 0, 0, 0, 0)
    assert count.module_totals("used").flops == 2 * BATCH * IN * HIDDEN
    with pytest.raises(KeyError, match="no module named 'nope'"):
        count.module_totals("nope")


def test_op_totals_is_a_deprecated_name_for_cost_row() -> None:
    model, x = _model()
    row = flopcount.count_flops(model, x).operator_totals()["aten::linear"]
    results = importlib.import_module("flopcount.core.results")
    for use in (lambda: flopcount.OpTotals, lambda: results.OpTotals):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            alias = use()
        assert alias is CostRow and isinstance(row, alias)
        assert len(caught) == 1 and caught[0].category is DeprecationWarning
        assert caught[0].filename == __file__ and caught[0].lineno == use.__code__.co_firstlineno
        assert "use flopcount.core.rows.CostRow" in str(caught[0].message)
    assert "OpTotals" not in flopcount.__all__ and "OpTotals" not in results.__all__
    with pytest.warns(DeprecationWarning, match=r"CostRow\.get\(metric\)"):
        assert row.get("flops") == row.flops == 4 * 2 * BATCH * IN * HIDDEN  # four Linear calls


def test_a_count_row_says_its_dtype_was_not_recorded() -> None:
    # a count books no dtype: its rows say so ("") rather than CostRow's default "float32",
    # which a bfloat16 model's rows would have claimed; predict's rows carry the dtype its calls
    # computed in
    model, x = _model()
    model, x = model.to(torch.bfloat16), x.to(torch.bfloat16)
    count = flopcount.count_flops(model, x)
    bound = flopcount.predict(model, x, on="h100")
    assert {row.dtype for row in count.operator_totals().values()} == {""}
    assert count.module_totals("b").dtype == ""
    assert bound.by_operator()["aten::linear"].dtype == "bfloat16"
