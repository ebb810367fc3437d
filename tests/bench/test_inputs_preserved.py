"""benchmark() and module_latency() give the caller's input tensors back bit for bit, even
when the forward writes to them in place, and also when the forward raises."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from flopcount import benchmark, module_latency


class InPlace(nn.Module):
    def __init__(self, fail: bool) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.fail = fail

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.add_(1.0)  # writes to the caller's tensor
        y = self.fc(x)
        if self.fail:
            raise RuntimeError("boom")
        return y


@pytest.mark.parametrize("fail", [False, True])
@pytest.mark.parametrize("entry", ["benchmark", "module_latency"])
def test_inputs_come_back_as_found(entry: str, fail: bool) -> None:
    model = InPlace(fail)
    x = torch.randn(3, 4)
    expected = x.clone()
    version = x._version
    run = benchmark if entry == "benchmark" else module_latency
    if fail:
        with pytest.raises(Exception, match="boom"):
            run(model, x, iters=3, warmup=1)
    else:
        run(model, x, iters=3, warmup=1)
    assert torch.equal(x, expected)
    assert x._version > version  # the forward did write to it: restored, not untouched
