"""Events of one shape-cache key share one call (issue #32, the per-op path): a call the shape
cache knows is bound once per key and every event of that key holds it, read-only, so pricing
runs once per distinct call. Oracles: hand-derived costs (a custom handler's own formula, counted
per event), the same count on every tracer, and a handler that writes its arguments failing
loudly instead of changing other events."""

from __future__ import annotations

from typing import Any, List

import pytest
import torch
from torch import nn

from flopcount import Cost, count_flops
from flopcount.errors import HandlerError


class _Relus(nn.Module):
    """Three relus of one shape (one key), then one of another shape: batch 2."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(5, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(torch.relu(torch.relu(x)))
        return torch.relu(self.fc(x))


def _handler(priced: List[Any]) -> Any:
    def relu(call: Any) -> Cost:
        priced.append(call)
        return Cost.from_flops(7 * call.out().numel)  # 7 per element: this test's own figure

    return relu


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("tracer", ["auto", "dispatch", "jit"])
def test_one_pricing_per_distinct_call_and_the_same_totals_on_every_tracer(tracer: str, train: bool) -> None:
    torch.manual_seed(0)
    model, x = _Relus().train(train), torch.randn(2, 4, 5)
    priced: List[Any] = []
    result = count_flops(model, x, tracer=tracer, handlers={"aten::relu": _handler(priced)})
    # by hand: three relus of 2*4*5 = 40 elements and one of 2*4*3 = 24, 7 FLOPs each
    relu = result.by_operator("flops")["aten::relu"]
    assert relu == 7 * (3 * 40 + 24)
    assert result.by_operator("count")["aten::relu"] == 4
    assert model.training is train
    if tracer == "auto":  # the fake path: the three relus of one shape are one call, priced once
        assert len(priced) == 2


def test_a_handler_writing_its_arguments_fails_naming_the_op() -> None:
    def writes(call: Any) -> Cost:
        call.args["self"] = None  # a handler must be a pure function of the call
        return Cost()

    with pytest.raises(HandlerError, match=r"aten::relu.*TypeError"):
        count_flops(_Relus(), torch.randn(2, 4, 5), handlers={"aten::relu": writes})
