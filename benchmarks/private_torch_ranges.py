"""Issue #27 item 4: would the public ``torch.profiler.record_function`` do for ``profile``'s
ranges instead of torch's private ``torch._C._profiler._RecordFunctionFast``?

``profile`` opens a profiler range around the run of every counted op of its join step (the
event's marker) and one around each timed step. This script measures, in one process:

1. the cost of one range (enter + exit) of each kind, outside and inside an active profiler;
2. ``flopcount.profile`` (roofs measured once, then given) of a small CNN and a small transformer encoder (batch 2, eval and
   train with backward) with each kind: the wall time of the whole call, and whether the result
   is the same (the joined rows' names, calls, FLOPs; the unmatched calls). Times per op are
   measurements and differ run to run with either kind; they are not compared.

    PYTHONPATH=. .venv/bin/python benchmarks/private_torch_ranges.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Tuple

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import flopcount
import flopcount.profiling.run as run

FAST: Callable[[str], Any] = torch._C._profiler._RecordFunctionFast
PUBLIC: Callable[[str], Any] = torch.profiler.record_function
KINDS = {"_RecordFunctionFast": FAST, "record_function": PUBLIC}


def range_cost_us(make: Callable[[str], Any], n: int = 20000) -> float:
    names = [f"flopcount#{i}" for i in range(64)]
    start = time.perf_counter()
    for i in range(n):
        with make(names[i & 63]):
            pass
    return (time.perf_counter() - start) / n * 1e6


def models() -> Dict[str, Tuple[nn.Module, Tuple[torch.Tensor, ...]]]:
    torch.manual_seed(0)
    cnn = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10),
    )
    layer = nn.TransformerEncoderLayer(64, 4, 128, batch_first=True, dropout=0.0)
    encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
    return {"cnn": (cnn, (torch.randn(2, 3, 32, 32),)), "encoder": (encoder, (torch.randn(2, 16, 64),))}


def digest(result: Any) -> Tuple[Any, ...]:
    rows = tuple(sorted((r.name, r.module, r.phase, r.calls, r.flops) for r in result.rows))
    unmatched = tuple(sorted((u.kind, u.name, u.module, u.phase, u.calls) for u in result.unmatched))
    return rows, unmatched


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, load {Path('/proc/loadavg').read_text().split()[:3]}")
    print("\n| range kind | outside a profiler (us) | inside a profiler (us) |\n|---|---|---|")
    outside: Dict[str, List[float]] = {k: [] for k in KINDS}
    inside: Dict[str, List[float]] = {k: [] for k in KINDS}
    for _ in range(args.rounds):
        for name, make in KINDS.items():  # interleaved
            outside[name].append(range_cost_us(make))
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True):
            for name, make in KINDS.items():
                inside[name].append(range_cost_us(make, 5000))
    for name in KINDS:
        print(f"| {name} | {statistics.median(outside[name]):.2f} | {statistics.median(inside[name]):.2f} |")
    print("\n| model | mode | profile() s, fast | profile() s, record_function | ratio | same rows and unmatched |\n|---|---|---|---|---|---|")
    original = run._range
    roofs = None  # measured by the first call, then given: each call's time is the profile's own
    try:
        for label, (model, inputs) in models().items():
            for mode in ("eval", "train"):
                model.train(mode == "train")
                walls: Dict[str, List[float]] = {k: [] for k in KINDS}
                digests: Dict[str, Any] = {}
                if roofs is None:
                    roofs = flopcount.profile(model, inputs, warmup=0, steps=1).roofs
                for _ in range(args.rounds):
                    for name, make in KINDS.items():
                        run._range = make  # type: ignore[assignment]
                        start = time.perf_counter()
                        result = flopcount.profile(model, inputs, backward=mode == "train", warmup=1, steps=3, roofs=roofs)
                        roofs = result.roofs
                        walls[name].append(time.perf_counter() - start)
                        digests.setdefault(name, digest(result))
                fast, public = (statistics.median(walls[k]) for k in KINDS)
                same = digests["_RecordFunctionFast"] == digests["record_function"]
                print(f"| {label} | {mode} | {fast:.3f} | {public:.3f} | {public / fast:.2f} | {same} |")
    finally:
        run._range = original  # type: ignore[assignment]
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
