"""What branch wild5's values-only entries cost a ``Tensor.norm`` call while counting (``F.normalize``
calls it): ``x.norm(2, -1, keepdim=True)`` under the dispatch tracer's ``CompositeInterceptor``, with the
``torch.norm``/``Tensor.norm`` entries in its table (this branch) and without (main's table), interleaved
rounds in one process, CPU time per call.

Run: ``PYTHONPATH=. .venv/bin/python benchmarks/norm_interceptor_cost.py``
"""

import statistics
import time

import torch

from flopcount.tracers import _vocabulary as vocabulary


class _Recorder:
    phase, muted, events = "forward", 0, []

    def record(self, *args):
        pass


def main(rounds: int = 11, calls: int = 20000) -> None:
    table = vocabulary._composites()
    entries = {f: table[f] for f in (torch.norm, torch.Tensor.norm)}
    x = torch.randn(8, 32)

    def per_call(with_entries: bool) -> float:
        if with_entries:
            table.update(entries)
        else:
            for f in entries:
                table.pop(f, None)
        with vocabulary.CompositeInterceptor(_Recorder(), lambda v: v, lambda o: (o,)):
            start = time.process_time()
            for _ in range(calls):
                x.norm(2, -1, keepdim=True)
            return (time.process_time() - start) / calls * 1e6

    try:
        old, new = [], []
        for _ in range(rounds):
            old.append(per_call(False))
            new.append(per_call(True))
    finally:
        table.update(entries)
    print(f"without the norm entries: min {min(old):.2f} us, median {statistics.median(old):.2f} us")
    print(f"with them (this branch):  min {min(new):.2f} us, median {statistics.median(new):.2f} us")


if __name__ == "__main__":
    main()
