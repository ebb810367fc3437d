"""Paired A/B of the pull-request comment's escaping (branch gatewalk): the markdown of an
801-module diff (80 blocks of 10 modules, the MLP widened) rendered with the parent's
``escape_markdown`` (``|`` and ``\\`` only) and with the current one (also ``* _ ` <``), the two
alternated in one process, CPU time (``time.process_time``), minimum and median.

    PYTHONPATH=. python benchmarks/escape_markdown_ab.py [--rounds 15]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable, Dict, List

import torch
from torch import nn

import flopcount
from flopcount.report import diff as rendering
from flopcount.units import escape_markdown


def parent_escape(cell: object) -> str:
    """``escape_markdown`` as it was on the parent commit."""
    return str(cell).replace("\\", "\\\\").replace("|", "\\|")


class Block(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.attn = nn.ModuleDict({name: nn.Linear(8, 8) for name in ("q_proj", "k_proj", "v_proj", "o_proj")})
        self.mlp = nn.ModuleDict({"gate_proj": nn.Linear(8, hidden), "up_proj": nn.Linear(8, hidden),
                                  "down_proj": nn.Linear(hidden, 8)})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = sum(layer(x) for layer in self.attn.values())
        return a + self.mlp["down_proj"](self.mlp["gate_proj"](a) * self.mlp["up_proj"](a))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=15)
    rounds = parser.parse_args().rounds
    x = torch.randn(2, 8)
    a = flopcount.count_flops(nn.Sequential(*[Block(16) for _ in range(80)]), x).to_dict()
    b = flopcount.count_flops(nn.Sequential(*[Block(24) for _ in range(80)]), x).to_dict()
    change = flopcount.diff(a, b)
    escapes: Dict[str, Callable[[object], str]] = {"parent": parent_escape, "current": escape_markdown}
    times: Dict[str, List[float]] = {name: [] for name in escapes}
    try:
        for i in range(rounds):
            for name in (("parent", "current") if i % 2 == 0 else ("current", "parent")):
                rendering.escape_markdown = escapes[name]  # type: ignore[assignment]
                start = time.process_time()
                change.to_markdown()
                times[name].append(time.process_time() - start)
    finally:
        rendering.escape_markdown = escape_markdown  # type: ignore[assignment]
    print(f"{len(change.modules)} module rows, {rounds} rounds each, CPU time")
    for name, spent in times.items():
        print(f"{name:8s} min {min(spent) * 1e3:.1f} ms, median {statistics.median(spent) * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
