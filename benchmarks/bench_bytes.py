"""Bytes per op family (issue #28 item 1) against real runs on this machine.

For each case (an embedding lookup in a million-row table, a 64 MiB static KV cache updated in
place, eval-mode dropout, gathers and scatters on large buffers), prints (Markdown):

* the bytes flopcount books now (``count_flops(...).bytes``) and by the general rule alone
  (every tensor argument read, every output written: what was booked before the family rules),
* the roofline bound ``predict(..., on="this machine")`` gives now, and the bound the
  general rule's bytes would give on the same roofs (bytes / bandwidth: these ops do no or
  almost no arithmetic),
* the fastest of ``--repeats`` timed runs of the eager model (each the mean of an adaptive number
  of calls), the bandwidth that implies for the bytes booked now, and bound / fastest for both:
  a lower bound must stay at or below 1. Where it does not with the bytes at their least, the
  bandwidth roof is below what the run achieved (the roof's problem, issue #28 item 2).

    PYTHONPATH=. .venv/bin/python benchmarks/bench_bytes.py [--repeats 7] [--threads 1]

The roofs are those of "this machine" (measured once and cached; the table prints them).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any, Callable, List, Tuple

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import flopcount
from flopcount.core.analysis import is_view_op
from flopcount.core.traffic import general_traffic
from flopcount.tracers import trace


class Lookup(nn.Module):
    def __init__(self, rows: int, dim: int) -> None:
        super().__init__()
        self.emb = nn.Embedding(rows, dim)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.emb(ids)


class CacheUpdate(nn.Module):
    """A static KV cache (B, H, S, D) fp32 written at T positions, in place."""

    def __init__(self, how: str, heads: int = 32, seq: int = 4096, dim: int = 128) -> None:
        super().__init__()
        self.how = how
        self.register_buffer("cache", torch.zeros(1, heads, seq, dim))

    def forward(self, new: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        if self.how == "index_copy_":
            self.cache.index_copy_(2, pos, new)
        else:
            self.cache[:, :, pos] = new
        return self.cache


class Dropout(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.drop = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(x)


class Gather(nn.Module):
    def __init__(self, rows: int, dim: int) -> None:
        super().__init__()
        self.register_buffer("table", torch.randn(rows, dim))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return torch.index_select(self.table, 0, ids)


class ScatterAdd(nn.Module):
    def __init__(self, size: int) -> None:
        super().__init__()
        self.register_buffer("buf", torch.zeros(size))

    def forward(self, index: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
        return self.buf.scatter_add_(0, index, src)


def cases() -> List[Tuple[str, Callable[[], Tuple[nn.Module, Tuple[Any, ...]]]]]:
    return [
        ("Embedding(1_000_000, 64), 1x16 ids", lambda: (Lookup(1_000_000, 64), (torch.randint(0, 1_000_000, (1, 16)),))),
        ("Embedding(1_000_000, 64), 64x128 ids", lambda: (Lookup(1_000_000, 64), (torch.randint(0, 1_000_000, (64, 128)),))),
        ("64 MiB KV cache, index_copy_ 1 token", lambda: (CacheUpdate("index_copy_"), (torch.randn(1, 32, 1, 128), torch.tensor([77])))),
        ("64 MiB KV cache, cache[:, :, pos] = new, 16 tokens",
         lambda: (CacheUpdate("index_put_"), (torch.randn(1, 32, 16, 128), torch.arange(100, 116)))),
        ("eval Dropout on 256x4096", lambda: (Dropout().eval(), (torch.randn(256, 4096),))),
        ("index_select 512 rows of a 1M x 64 table", lambda: (Gather(1_000_000, 64), (torch.randint(0, 1_000_000, (512,)),))),
        ("scatter_add_ 4096 values into 16M", lambda: (ScatterAdd(1 << 24), (torch.randint(0, 1 << 24, (4096,)), torch.randn(4096)))),
    ]


def general_bytes(model: nn.Module, inputs: Tuple[Any, ...]) -> int:
    """The bytes the general rule alone books for one forward (no family rules)."""
    run = trace(model, inputs, tracer="dispatch")
    total = 0
    for event in run.events:
        read, written = general_traffic(event.call, view=is_view_op(event.call.op))
        total += read + written
    return total


def fastest(model: nn.Module, inputs: Tuple[Any, ...], repeats: int) -> float:
    """The fastest of ``repeats`` means, each over enough calls to last about 20 ms."""
    with torch.no_grad():
        for _ in range(3):
            model(*inputs)
        calls, elapsed = 1, 0.0
        while True:
            start = time.perf_counter()
            for _ in range(calls):
                model(*inputs)
            elapsed = time.perf_counter() - start
            if elapsed > 0.02 or calls >= 1 << 16:
                break
            calls *= 4
        best = elapsed / calls
        for _ in range(repeats - 1):
            start = time.perf_counter()
            for _ in range(calls):
                model(*inputs)
            best = min(best, (time.perf_counter() - start) / calls)
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    rows = []
    roofs = None
    for name, make in cases():
        model, inputs = make()
        now = flopcount.count_flops(model, inputs).bytes
        before = general_bytes(model, inputs)
        bound = flopcount.predict(model, inputs, on="this machine")
        roofs = bound.roofs
        before_s = max(before / roofs.bandwidth, bound.compute_s)
        best = fastest(model, inputs, args.repeats)
        rows.append((name, now, before, bound.latency_s, before_s, best))
        del model
    assert roofs is not None
    print(f"roofs: {roofs.describe()}\n")
    print("| case | bytes now | bytes by the general rule | bound now | bound by the general rule | fastest run | "
          "bytes now / fastest | bound / fastest now | general rule's bound / fastest |")
    print("|---|---|---|---|---|---|---|---|---|")
    worst = 0.0
    for name, now, before, bound_s, before_s, best in rows:
        worst = max(worst, bound_s / best)
        print(f"| {name} | {now:,} | {before:,} | {bound_s * 1e6:.2f} us | {before_s * 1e6:.1f} us | {best * 1e6:.2f} us | "
              f"{now / best / 1e9:.2f} GB/s | {bound_s / best:.3f} | {before_s / best:.1f} |")
    print(f"\nlargest bound / fastest now: {worst:.3f}")
    if worst > 1.02:
        print("ABOVE a measured run: the bytes booked are what the op must move at the least, so a run that moved them "
              f"faster than {roofs.bandwidth / 1e9:.2f} GB/s shows the bandwidth roof below what was achieved "
              "(see the 'bytes now / fastest' column)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
