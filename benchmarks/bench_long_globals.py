"""A stack of 24 blocks whose forward reads a long global container (issue #32, branch
``leftover``): what structural reuse's key costs per count when a user's global holds 100,000
floats (a list, a tuple, a dict) or 10,000 tensors. Process CPU time of ``count_flops`` (default
fake path, reuse on), after one warm-up count, minimum and median of the repeats; with the MACs
and the calls reused, which must not change from one side to the other.

Run it against another tree by its ``PYTHONPATH`` (the parent's, exported with ``git archive``),
alternating sides (docs/performance.md, branch leftover):

    PYTHONPATH=. .venv/bin/python benchmarks/bench_long_globals.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any, Callable, Dict

import torch
from torch import nn

import flopcount

D = 64
ITEMS: Any = None  # the global the blocks read: each case binds it


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(D, 4 * D)
        self.down = nn.Linear(4 * D, D)

    def forward(self, x):
        return self.down(torch.relu(self.up(x))) * ITEMS[-1] + x  # a dict's last key is -1


class Stack(nn.Module):
    def __init__(self, n: int = 24) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(n))

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


CASES: Dict[str, Callable[[], Any]] = {
    "a list of 1 float": lambda: [0.5],
    "a list of 100k floats": lambda: [0.5] * 100_000,
    "a tuple of 100k floats": lambda: tuple([0.5] * 100_000),
    "a list of 10k tensors": lambda: [torch.full((D,), 0.5) for _ in range(10_000)],
    "a dict of 100k floats": lambda: {**{i: 0.5 for i in range(99_999)}, -1: 0.5},
}


def main() -> None:
    global ITEMS
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    repeats = parser.parse_args().repeats
    torch.set_num_threads(1)
    model, x = Stack(), torch.randn(4, D)
    for name, make in CASES.items():
        ITEMS = make()
        flopcount.count_flops(model, x)  # warm-up
        times = []
        for _ in range(repeats):
            start = time.process_time()
            result = flopcount.count_flops(model, x)
            times.append(time.process_time() - start)
        print(f"{name:24s} CPU min {min(times) * 1e3:7.1f} ms, median {statistics.median(times) * 1e3:7.1f} ms; "
              f"MACs {result.macs}, reused {result.reused_calls}")


if __name__ == "__main__":
    main()
