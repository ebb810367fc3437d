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


class _Convs(nn.Module):
    """Two convolutions of one shape and a transpose between: a non-contiguous activation."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Conv2d(4, 4, 3, padding=1)
        self.b = nn.Conv2d(4, 4, 3, padding=1)
        self.norm = nn.BatchNorm2d(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.norm(self.a(x)).transpose(2, 3)
        return torch.relu(self.b(y)) + torch.relu(self.b(y.contiguous()))


@pytest.mark.parametrize("layout", ["contiguous", "channels_last", "transposed"])
@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_shared_calls_count_as_a_real_run_whatever_the_layout(layout: str, train: bool) -> None:
    torch.manual_seed(0)
    model = _Convs().train(train)
    x = torch.randn(2, 4, 6, 6)
    if layout == "channels_last":
        x = x.to(memory_format=torch.channels_last)
    elif layout == "transposed":
        x = x.transpose(2, 3)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    fake = count_flops(model, x)  # twice: the second count reads the kept calls
    fake = count_flops(model, x)
    real = count_flops(model, x, tracer="dispatch")
    for metric in ("flops", "macs", "count", "bytes_read", "bytes_written"):
        assert fake.by_operator(metric) == real.by_operator(metric), metric
        assert fake.by_module(metric) == real.by_module(metric), metric
    # by hand: three 3x3 convolutions of 4 -> 4 channels on 2 x 6 x 6 outputs, 2*6*6*4*4*9 MACs each
    assert fake.by_operator("macs")["aten::convolution"] == 3 * 2 * 6 * 6 * 4 * 4 * 9
    assert model.training is train and all(torch.equal(state[k], v) for k, v in model.state_dict().items())


def test_shared_calls_with_backward_count_as_a_real_run() -> None:
    torch.manual_seed(0)
    model, x = _Convs(), torch.randn(2, 4, 6, 6)
    fake = count_flops(model, x, backward=True)
    real = count_flops(model, x, backward=True, tracer="dispatch")
    assert fake.by_operator("flops") == real.by_operator("flops")
    assert fake.by_phase("flops") == real.by_phase("flops")
