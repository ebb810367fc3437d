"""Issue #27 item 5: nothing of the caller's is touched while a count runs, as another thread
(or a hook of the caller's) sees it: torch's fake-tensor logger keeps passing other threads'
records, and a backward count leaves the ``.grad`` and post-accumulate-grad hooks of the
caller's real parameters as they are, during the count as well as after it."""

from __future__ import annotations

import logging
import threading
from typing import Any, List, Tuple

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from flopcount import count_flops

FAKE_LOGGER = "torch._subclasses.fake_tensor"


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: List[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


# kept outside the module, so that the fake copy of the model (tracer="auto") can be made
SIGNALS = {"other may log": threading.Event(), "other logged": threading.Event()}


class _LogsMidForward(nn.Module):
    """Its forward logs to torch's fake-tensor logger from the counting thread, then lets
    another thread log to it and waits for that, so both happen while the count runs."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logging.getLogger(FAKE_LOGGER).error("from the counting thread")
        SIGNALS["other may log"].set()
        assert SIGNALS["other logged"].wait(30)
        return self.lin(x)


@pytest.mark.parametrize("tracer", ["auto", "dispatch"])
def test_fake_logger_mutes_only_the_counting_thread(tracer: str) -> None:
    logger = logging.getLogger(FAKE_LOGGER)
    filters_before = list(logger.filters)
    capture = _Capture()
    logger.addHandler(capture)
    model = _LogsMidForward()
    for event in SIGNALS.values():
        event.clear()

    def other() -> None:
        assert SIGNALS["other may log"].wait(30)
        logger.error("from another thread")
        SIGNALS["other logged"].set()

    thread = threading.Thread(target=other)
    thread.start()
    try:
        result = count_flops(model, torch.randn(2, 4), tracer=tracer)
    finally:
        thread.join(30)
        logger.removeHandler(capture)
    # Linear(4, 3) on a (2, 4) batch is one addmm: 2*B*in*out = 2*2*4*3 = 48 FLOPs (the bias
    # add is not counted, as in torch.utils.flop_counter)
    assert result.flops == 48 and not result.warnings  # auto: counted on fake copies, no real-run fallback
    # before: the filter dropped every thread's records while the count ran
    assert "from another thread" in capture.messages
    if tracer == "auto":  # the fake run: its own thread's log lines are muted (the library never prints)
        assert "from the counting thread" not in capture.messages
    assert logger.filters == filters_before


# ----------------------------------------------------------------- a backward count's parameters

B = 3
# each Linear's forward MACs at batch B: stem 8->8, block.fc1 8->16, block.fc2 16->8, head 8->4
STEM, FC1, FC2, HEAD = B * 8 * 8, B * 8 * 16, B * 16 * 8, B * 8 * 4


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class Checkpointed(nn.Module):
    """A reentrant checkpoint: its backward needs a plain ``.backward()``, which writes ``.grad``."""

    def __init__(self) -> None:
        super().__init__()
        self.stem, self.block, self.head = nn.Linear(8, 8), Block(), nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(checkpoint(self.block, self.stem(x), use_reentrant=True))


def _seen(model: Checkpointed, old: torch.Tensor) -> Tuple[bool, int, int]:
    """What anyone looking at the caller's parameters sees: fc1's .grad still the caller's
    tensor, and how many post-accumulate-grad hooks fc1 and head hold (the caller set one each)."""
    fc1, head = model.block.fc1.weight, model.head.weight
    return fc1.grad is old, len(fc1._post_accumulate_grad_hooks or {}), len(head._post_accumulate_grad_hooks or {})


@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("tracer", ["auto", "dispatch"])
def test_a_backward_count_leaves_the_callers_grads_and_hooks_alone_while_it_runs(tracer: str, train: bool) -> None:
    torch.manual_seed(0)
    model = Checkpointed().train(train)
    x = torch.randn(B, 8)
    old = torch.full_like(model.block.fc1.weight, 7.0)
    model.block.fc1.weight.grad = old
    fired: List[Any] = []
    model.block.fc1.weight.register_post_accumulate_grad_hook(fired.append)
    model.head.weight.register_post_accumulate_grad_hook(fired.append)
    as_found = (True, 1, 1)
    assert _seen(model, old) == as_found

    # mid-count, from a hook of the caller's: fc2 runs in forward and again in the checkpoint's
    # recompute, inside the backward (where the plain backward used to run with them emptied)
    mid: List[Tuple[bool, int, int]] = []
    model.block.fc2.register_forward_hook(lambda *_: mid.append(_seen(model, old)))
    # and from another thread, looking all the while the count runs
    watching = threading.Event()
    watching.set()
    watched: List[Tuple[bool, int, int]] = []

    def watch() -> None:
        while watching.is_set():
            watched.append(_seen(model, old))

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        result = count_flops(model, x, backward=True, tracer=tracer)
    finally:
        watching.clear()
        watcher.join(30)
    assert mid and set(mid) == {as_found}
    assert watched and set(watched) == {as_found}
    assert _seen(model, old) == as_found and fired == []
    assert bool(torch.all(model.block.fc1.weight.grad == 7.0))
    # the count itself, by hand: grad_input + grad_weight of every Linear except the stem's
    # grad_input (x needs none), plus the reentrant recompute of the whole block
    forward = STEM + FC1 + FC2 + HEAD
    assert result.by_phase("macs") == {"forward": forward, "backward": 2 * (FC1 + FC2 + HEAD) + STEM + FC1 + FC2}


@pytest.mark.parametrize("tracer", ["auto", "dispatch"])
def test_an_input_that_requires_grad_keeps_its_grad_during_a_backward_count(tracer: str) -> None:
    torch.manual_seed(0)
    model = Checkpointed()
    x = torch.randn(B, 8, requires_grad=True)
    mine = torch.ones(B, 8)
    x.grad = mine
    mid: List[bool] = []
    model.block.fc2.register_forward_hook(lambda *_: mid.append(x.grad is mine))
    result = count_flops(model, x, backward=True, tracer=tracer)
    assert mid and all(mid) and x.grad is mine and bool(torch.all(x.grad == 1.0))
    # x requires grad: the stem's grad_input is computed too
    assert result.by_phase("macs")["backward"] == 2 * (STEM + FC1 + FC2 + HEAD) + FC1 + FC2
