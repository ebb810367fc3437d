"""flopcount.profile and flopcount.predict against the issue #21 targets, on this machine.

Prints (Markdown):
  1. a 2048^3 float32 GEMM's efficiency against the measured compute roof (target 0.8-1.05)
     and a 64M-element add's against the bandwidth roof (target 0.6-1.05);
  2. for ResNet-50 (224x224, batch 1) and BERT-base (seq 128, batch 1) at one thread: the sum
     of the joined op times per step against ``benchmark()``'s mean latency (target within
     10 %), the profiled step against the plain one (profiling overhead), predict("this
     machine") against the measured latency (a lower bound: ratio <= 1), and the Spearman
     rank agreement between per-op attainable time and measured time.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_profile.py [--threads 1] [--steps 5] [--skip-models]

Roofs are measured once per machine and cached ($XDG_CACHE_HOME/flopcount/roofs.json);
``--refresh-roofs`` measures again.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any, List, Sequence, Tuple

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _ranks import spearman

import flopcount
from flopcount.devices.measured import best_of, machine_roofs, measure_roofs


class MatMul(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a @ b


class Add(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a + b


class AddInPlace(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a.add_(b)


def _median(values: Sequence[float]) -> float:
    return statistics.median(values)


def roofs_section(rounds: int, steps: int) -> List[flopcount.Roofs]:
    """Each round measures the roofs afresh right before profiling, so a busy phase of a
    shared machine hits roof and op alike; medians over rounds."""
    print("## Roofs and micro-benchmarks\n")
    n, numel = 2048, 64 * 2**20
    cases = (
        ("2048^3 float32 GEMM", MatMul(), lambda: (torch.randn(n, n), torch.randn(n, n)), "aten::matmul", "0.8-1.05"),
        ("64M-element float32 add, a + b (new output)", Add(), lambda: (torch.rand(numel), torch.rand(numel)), "aten::add", "0.6-1.05"),
        ("64M-element float32 add, a += b", AddInPlace(), lambda: (torch.rand(numel), torch.rand(numel)), "aten::add_", "0.6-1.05"),
    )
    print("| case | FLOPs | bytes | measured / step | attainable | efficiency (median of rounds) | each round | target |")
    print("|---|---|---|---|---|---|---|---|")
    roofs_seen = []
    for label, model, make, op, target in cases:
        inputs = make()
        effs, times, attain = [], [], []
        for _ in range(rounds):
            roofs = measure_roofs("cpu", ["float32"])
            roofs_seen.append(roofs)
            row = flopcount.profile(model, inputs, roofs=roofs, warmup=1, steps=steps).by_operator()[op]
            effs.append(row.efficiency or 0.0)
            times.append(row.time_s)
            attain.append(row.attainable_s)
        print(f"| {label} | {row.flops:.4g} | {row.bytes:.4g} | {_median(times) * 1e3:.2f} ms | {_median(attain) * 1e3:.2f} ms | "
              f"{_median(effs):.3f} | {', '.join(f'{e:.2f}' for e in effs)} | {target} |")
    peaks = [r.peak_flops["float32"] for r in roofs_seen]
    bws = [r.bandwidth for r in roofs_seen]
    print(f"\nRoofs measured {len(roofs_seen)} times: float32 peak {min(peaks) / 1e9:.1f}-{max(peaks) / 1e9:.1f} GFLOP/s, "
          f"bandwidth {min(bws) / 1e9:.2f}-{max(bws) / 1e9:.2f} GB/s ({roofs_seen[-1].details})\n")
    return roofs_seen


def _models() -> List[Tuple[str, nn.Module, Any]]:
    from flopcount.examples.resnet import resnet50

    found: List[Tuple[str, nn.Module, Any]] = [("ResNet-50 (1x3x224x224)", resnet50().eval(), torch.randn(1, 3, 224, 224))]
    try:
        from flopcount.examples.hf import bert, token_ids

        model = bert().eval()
        found.append(("BERT-base (1x128 tokens)", model, token_ids(1, 128, model.config.vocab_size)))
    except ImportError:
        print("(transformers not installed: BERT-base skipped)\n")
    return found


def models_section(roofs: flopcount.Roofs, rounds: int, steps: int) -> None:
    """Rounds of benchmark() then profile() on the same model, interleaved; per-round
    ratios, medians."""
    print(f"## Models at {torch.get_num_threads()} thread(s), median of {rounds} interleaved rounds\n")
    print("| model | benchmark() mean | profiled step | step / mean | sum of op times | ops / mean | "
          "predict(this machine) | bound / mean | Spearman (attainable vs time) | unmatched |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, model, x in _models():
        means, steps_s, ops, rhos = [], [], [], []
        for _ in range(rounds):
            means.append(flopcount.benchmark(model, x, warmup=1, iters=steps).stats.mean_s)
            result = flopcount.profile(model, x, roofs=roofs, warmup=1, steps=steps)
            steps_s.append(result.total_time_s)
            ops.append(result.op_time_s)
            rows = [r for r in result.rows if r.time_s > 0 and r.attainable_s > 0]
            rhos.append(spearman([r.attainable_s for r in rows], [r.time_s for r in rows]))
        bound = flopcount.predict(model, x, on=roofs).latency_s
        mean = _median(means)
        print(
            f"| {name} | {mean * 1e3:.1f} ms | {_median(steps_s) * 1e3:.1f} ms | "
            f"{_median([s / m for s, m in zip(steps_s, means)]):.3f} | {_median(ops) * 1e3:.1f} ms | "
            f"{_median([o / m for o, m in zip(ops, means)]):.3f} | {bound * 1e3:.2f} ms | {bound / min(means):.3f} | "
            f"{_median(rhos):.2f} ({len(rows)} rows) | {len(result.unmatched)} |"
        )
        print(f"<!-- {name}: means {[round(m * 1e3, 1) for m in means]} ms, profiled steps "
              f"{[round(v * 1e3, 1) for v in steps_s]} ms; last {result.overview} -->")
    print()


def main(argv: Sequence[str] = ()) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--skip-models", action="store_true")
    parser.add_argument("--refresh-roofs", action="store_true")
    args = parser.parse_args(list(argv) or None)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(f"# bench_profile: torch {torch.__version__}, {torch.get_num_threads()} thread(s)\n")
    seen = roofs_section(args.rounds, args.steps)
    if not args.skip_models:
        # the best of every measurement so far (this run's and the cache's): load only slows
        roofs = best_of(machine_roofs("cpu", refresh=args.refresh_roofs), *seen)
        print(f"Roofs for predict and the models: {roofs.describe()}\n")
        models_section(roofs, args.rounds, args.steps)


if __name__ == "__main__":
    main(sys.argv[1:])
