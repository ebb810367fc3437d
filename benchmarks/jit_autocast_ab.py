"""tracer="jit" under bf16 autocast, paired in one process: the parent's path (no cast marks: the
mode not pushed) against this branch's (tracers/jit/autocast.py), alternating each round, CPU time.

    PYTHONPATH=. /work/main/.venv/bin/python benchmarks/jit_autocast_ab.py --rounds 21
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from typing import Callable, Dict, List

import torch

import flopcount.tracers.jit.tracer as jit_tracer
from flopcount import count_flops
from flopcount.examples import hf, resnet


def _once(model: torch.nn.Module, x: torch.Tensor, marks: bool, real: Callable[[], bool]) -> float:
    jit_tracer.autocast_on = real if marks else (lambda: False)  # type: ignore[assignment]
    start = time.process_time()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        count_flops(model, x, tracer="jit")
    return time.process_time() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=21)
    rounds = parser.parse_args().rounds
    warnings.simplefilter("ignore")
    models = {
        "ResNet-50 1x3x224x224": (resnet.resnet50().eval(), torch.randn(1, 3, 224, 224)),
        "GPT-2 4 layers x 128, 1x32": (
            hf.gpt2(n_layer=4, n_embd=128, n_head=4, vocab_size=1000, n_positions=64).eval(),
            torch.randint(0, 1000, (1, 32)),
        ),
    }
    real = jit_tracer.autocast_on
    try:
        for name, (model, x) in models.items():
            _once(model, x, False, real), _once(model, x, True, real)  # warm
            times: Dict[bool, List[float]] = {False: [], True: []}
            ratios = []
            for index in range(rounds):
                got = {marks: _once(model, x, marks, real) for marks in ((False, True) if index % 2 == 0 else (True, False))}
                for marks, seconds in got.items():
                    times[marks].append(seconds)
                ratios.append(got[True] / got[False])
            low, _, high = statistics.quantiles(ratios, n=4)
            print(f"{name}: parent's path median {statistics.median(times[False]) * 1e3:.0f} ms (min {min(times[False]) * 1e3:.0f}), "
                  f"this branch {statistics.median(times[True]) * 1e3:.0f} ms (min {min(times[True]) * 1e3:.0f}); "
                  f"per-round ratio median {statistics.median(ratios):.3f} (quartiles {low:.3f}-{high:.3f})")
    finally:
        jit_tracer.autocast_on = real  # type: ignore[assignment]


if __name__ == "__main__":
    main()
