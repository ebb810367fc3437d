"""A count's FakeTensorMode handed on to the next count (issue #32, branch ``resnet``), measured in
one process: counts with the pool as built (``copies._take_mode`` / ``copies.give_back``) and
counts where every count makes its own mode and makers as before (the two functions swapped for
this script's run only, and the shape cache given a maker of its own), interleaved, CPU time of
the counting thread, median of the rounds; the same totals both ways (checked).

Models: ResNet-50 1x3x224x224 on a meta copy, GPT-2 small 1x256 on a meta copy
(``bench_fastpath.CASES``), and a tiny ``Sequential(Linear(4, 4), ReLU())`` batch 2, whose count is
fixed costs; the tiny one also from 40 Python frames deep (a count inside a test: the mode's
constructor records the whole stack).

    PYTHONPATH=. .venv/bin/python benchmarks/bench_mode_pool.py [--rounds 21]
"""

from __future__ import annotations

import argparse
import copy
import gc
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Dict, List, Tuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from bench_fastpath import CASES  # noqa: E402
from torch import nn  # noqa: E402

import flopcount.tracers.dispatch as dispatch  # noqa: E402
import flopcount.tracers.fake.copies as copies  # noqa: E402
from flopcount import count_flops  # noqa: E402
from flopcount.tracers.fake.making import FakeMaker  # noqa: E402
from flopcount.tracers.fake.shape_cache import ShapeCache  # noqa: E402

warnings.simplefilter("ignore")


def _fresh_pair() -> Tuple[Any, FakeMaker]:
    fake_tensor, fake_mode = copies._fake_types()
    mode = fake_mode(allow_non_fake_inputs=True)
    return mode, FakeMaker(mode, fake_tensor)


class _OwnMaker(ShapeCache):
    """The shape cache as before the pool: a maker of its own (its first fake checked again)."""

    def __init__(self, mode: Any, fake_type: type, maker: Any = None) -> None:
        super().__init__(mode, fake_type)


def _set(pooled: bool) -> None:
    copies._take_mode = _POOLED[0] if pooled else _fresh_pair
    dispatch.give_back = _POOLED[1] if pooled else (lambda copied: None)
    dispatch.ShapeCache = ShapeCache if pooled else _OwnMaker  # type: ignore[misc]


_POOLED: Tuple[Callable[..., Any], Callable[..., Any]] = (copies._take_mode, copies.give_back)


def _deep(depth: int, run: Callable[[], Any]) -> Any:
    return run() if depth == 0 else _deep(depth - 1, run)


def _cases() -> Dict[str, Tuple[nn.Module, Tuple[Any, ...], int]]:
    made: Dict[str, Tuple[nn.Module, Tuple[Any, ...], int]] = {}
    for label in ("ResNet-50 1x3x224x224", "GPT-2 small 1x256"):
        torch.manual_seed(0)
        model, inputs = CASES[label]()
        made[label + ", meta copy"] = copy.deepcopy(model).to("meta"), tuple(t.to("meta") for t in inputs), 0
    tiny = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    made["Sequential(Linear(4, 4), ReLU()) 2x4"] = tiny, (torch.randn(2, 4),), 0
    made["the same, 40 frames deep"] = tiny, (torch.randn(2, 4),), 40
    return made


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=21)
    args = parser.parse_args()
    torch.set_num_threads(1)
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    print(f"torch {torch.__version__}, 1 thread, CPU time of the counting thread, median of {args.rounds} rounds "
          f"(each: one count without the pool, one with), load average {load} at start, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print("| model | every count its own mode | modes handed on | ratio |")
    print("|---|---|---|---|")
    for label, (model, inputs, depth) in _cases().items():
        times: Dict[bool, List[float]] = {False: [], True: []}
        macs: Dict[bool, int] = {}
        for pooled in (False, True, False, True):  # warm-up
            _set(pooled)
            macs[pooled] = _deep(depth, lambda: count_flops(model, inputs)).macs
        assert macs[False] == macs[True], (label, macs)
        gc.collect()
        gc.disable()
        try:
            for _ in range(args.rounds):
                for pooled in (False, True):
                    _set(pooled)
                    start = time.thread_time()
                    _deep(depth, lambda: count_flops(model, inputs))
                    times[pooled].append(time.thread_time() - start)
        finally:
            gc.enable()
            _set(True)
        before, after = statistics.median(times[False]), statistics.median(times[True])
        print(f"| {label} | {before * 1e3:.3f} ms | {after * 1e3:.3f} ms | {after / before:.3f} |")


if __name__ == "__main__":
    main()
