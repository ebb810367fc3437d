"""One clock for the benchmarks that time real runs on the CPU or a GPU: perf_counter on the
CPU; on a GPU a pair of CUDA events around the call (GPU time between the markers, never more
than the wall time: the stricter comparison for a lower bound), read after the run."""

from __future__ import annotations

import time
from typing import Any


class Clock:
    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda

    def start(self) -> Any:
        if not self.cuda:
            return time.perf_counter()
        import torch

        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def stop(self, start: Any) -> Any:
        """A span: seconds on the CPU, the (start, end) events on a GPU (read with :meth:`seconds`)."""
        if not self.cuda:
            return time.perf_counter() - start
        import torch

        end = torch.cuda.Event(enable_timing=True)
        end.record()
        return (start, end)

    @staticmethod
    def seconds(span: Any) -> float:
        if isinstance(span, tuple):
            span[1].synchronize()
            return float(span[0].elapsed_time(span[1])) / 1e3
        return float(span)
