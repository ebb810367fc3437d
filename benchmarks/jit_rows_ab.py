"""Branch jitrows: the CPU time of counting a TorchScript program, the parent's path (one real run,
every op booked on the root) against this branch's (the same run, the ops booked from the graph),
paired in one process, alternating. ``--rounds N``; prints per-model medians, minima and the
per-round ratio's median and quartiles.

    PYTHONPATH=. python benchmarks/jit_rows_ab.py --rounds 21
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from unittest import mock

import torch
from torch import nn

import flopcount
from flopcount.examples.resnet import resnet18
from flopcount.tracers import jit as jit_package


def _models():
    mlp = nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 256)).eval()
    yield "MLP 256-1024-256, 32x256, scripted", torch.jit.script(mlp), torch.randn(32, 256)
    resnet = resnet18().eval()  # flopcount's own (examples/resnet.py): torchvision is optional
    x = torch.randn(1, 3, 224, 224)
    yield "ResNet-18 1x3x224x224, traced", torch.jit.trace(resnet, x), x


def _cpu(fn) -> float:
    start = time.process_time()
    fn()
    return time.process_time() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=21)
    rounds = parser.parse_args().rounds
    warnings.simplefilter("ignore")
    for name, program, x in _models():
        parent = []
        branch = []

        def count_parent():
            with mock.patch.object(jit_package, "trace_scripted", lambda *a, **k: None):
                flopcount.count_flops(program, x)

        def count_branch():
            result = flopcount.count_flops(program, x)
            assert result.tracer == "jit", "the graph path was not taken"

        count_parent(), count_branch()  # warm-up
        for _ in range(rounds):
            parent.append(_cpu(count_parent))
            branch.append(_cpu(count_branch))
        ratios = sorted(b / p for p, b in zip(parent, branch))
        q = statistics.quantiles(ratios, n=4)
        print(f"{name}: parent {statistics.median(parent) * 1e3:.1f} ms (min {min(parent) * 1e3:.1f}), "
              f"branch {statistics.median(branch) * 1e3:.1f} ms (min {min(branch) * 1e3:.1f}), "
              f"ratio median {statistics.median(ratios):.3f} (quartiles {q[0]:.3f}-{q[2]:.3f})")


if __name__ == "__main__":
    main()
