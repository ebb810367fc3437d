"""Two threads planning at once (issue #27 item 5): plan's fake world is the process's default
process group while it lasts, so the plans run one after the other and each gets the numbers it
gets alone; a plan started inside a plan on the same thread is refused with a clear error."""

from __future__ import annotations

import threading
import time
from typing import Any, Dict, List

import pytest
import torch
import torch.distributed as dist
from torch import nn

import flopcount
from flopcount.errors import UsageError

# Forward FLOPs of one rank, by hand: each rank runs the given (2, 8) batch through
# Linear(8, 8) -> ReLU -> Linear(8, 4), then plan's default loss (the sum of the output).
# Linear is addmm: 2*B*in*out = 2*2*8*8 + 2*2*8*4 = 256 + 128 = 384; ReLU one FLOP per element:
# 2*8 = 16; the sum one per input element: 2*4 = 8 (docs/conventions.md). 384 + 16 + 8 = 408.
FORWARD_FLOPS = 408


def _build() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4))


def test_two_threads_plan_at_once_and_both_get_the_hand_count() -> None:
    inside = threading.Event()  # the first plan is inside its fake world (building the model)

    def slow_build() -> nn.Module:
        inside.set()
        time.sleep(0.3)  # the second thread starts its plan meanwhile
        return _build()

    results: Dict[str, Any] = {}
    errors: List[BaseException] = []

    def work(name: str, build: Any) -> None:
        try:
            results[name] = flopcount.plan(build, (torch.randn(2, 8),), fsdp=2, device=None)
        except BaseException as exc:  # reported below, with its message
            errors.append(exc)

    first = threading.Thread(target=work, args=("first", slow_build))
    second = threading.Thread(target=work, args=("second", _build))
    first.start()
    assert inside.wait(60)
    second.start()
    for thread in (first, second):
        thread.join(120)
    # before: the second plan raised "a default process group is already initialised (backend fake ...)"
    assert not errors, f"a concurrent plan failed: {errors[0]!r}"
    assert results["first"].flops["forward"] == results["second"].flops["forward"] == FORWARD_FLOPS
    assert not dist.is_initialized()


def test_a_plan_inside_a_plan_is_refused_clearly() -> None:
    def build() -> nn.Module:
        flopcount.plan(_build, (torch.randn(2, 8),), fsdp=2, device=None)
        return _build()

    # build() runs inside plan's fake world; its failure comes back as plan's TraceError, chained
    with pytest.raises(flopcount.FlopcountError, match="already inside plan") as caught:
        flopcount.plan(build, (torch.randn(2, 8),), fsdp=2, device=None)
    assert isinstance(caught.value.__cause__, UsageError)
    assert not dist.is_initialized()
    # and the process can plan again afterwards
    assert flopcount.plan(_build, (torch.randn(2, 8),), fsdp=2, device=None).flops["forward"] == FORWARD_FLOPS
