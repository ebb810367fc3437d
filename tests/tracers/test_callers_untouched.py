"""Issue #27 item 5: nothing of the caller's is touched while a count runs, as another thread
(or a hook of the caller's) sees it: torch's fake-tensor logger keeps passing other threads'
records, and a backward count leaves the ``.grad`` and post-accumulate-grad hooks of the
caller's real parameters as they are, during the count as well as after it."""

from __future__ import annotations

import logging
import threading
from typing import List

import pytest
import torch
from torch import nn

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
