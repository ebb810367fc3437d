"""ampcheck: the layer replay under bf16 autocast on a 24-layer GPT-2-like stack (Conv1D + Linear
with biases, LayerNorm, GELU), CPU time of ``estimate_memory(backward=True, optimizer="adamw",
autocast=torch.bfloat16)`` with the replay on and off (``FLOPCOUNT_REUSE=1/0``), interleaved,
and whether the two estimates are equal.

Run: ``PYTHONPATH=. /work/main/.venv/bin/python benchmarks/replay_autocast.py [--rounds 5]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from test_memory_layers import AmpStack  # the tests' GPT-2-like stack

import flopcount
from flopcount.memory import estimate as estimate_module

TAKEN = []
_LAYERED = estimate_module._layered


def _spy(*args: object, **kwargs: object) -> object:
    figures = _LAYERED(*args, **kwargs)  # type: ignore[arg-type]
    TAKEN.append(figures is not None)
    return figures


estimate_module._layered = _spy  # type: ignore[assignment]  (whether the replay was taken)


def timed(model: torch.nn.Module, x: torch.Tensor, reuse: str) -> tuple[float, object]:
    os.environ["FLOPCOUNT_REUSE"] = reuse
    start = time.process_time()
    result = flopcount.estimate_memory(model, (x,), backward=True, optimizer="adamw", autocast=torch.bfloat16)
    return time.process_time() - start, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--layers", type=int, default=24)
    options = parser.parse_args()
    warnings.simplefilter("ignore")
    torch.manual_seed(0)
    model = AmpStack(layers=options.layers, width=64).train()
    x = torch.randn(2, 16, 64, generator=torch.Generator().manual_seed(0))
    timed(model, x, "0")  # warm both paths once
    timed(model, x, "1")
    on_times, off_times = [], []
    for _ in range(options.rounds):
        off_time, off = timed(model, x, "0")
        TAKEN.clear()
        on_time, on = timed(model, x, "1")
        assert TAKEN == [True], "the replay was not taken"
        assert on == off, "the replay differs from the full trace"
        off_times.append(off_time)
        on_times.append(on_time)
    ratios = [a / b for a, b in zip(on_times, off_times)]
    print(f"{options.layers} layers, {options.rounds} interleaved rounds, CPU s: full median {statistics.median(off_times):.2f}, "
          f"replay median {statistics.median(on_times):.2f}, replay/full per round {', '.join(f'{r:.2f}' for r in ratios)}; "
          f"estimates equal; load {open('/proc/loadavg').read().split()[:3]}")


if __name__ == "__main__":
    main()
