"""flopcount.benchmark vs torch.utils.benchmark.Timer.blocked_autorange, same process,
same callables, same thread count, both under torch.inference_mode(); plus the
harness's own per-iteration overhead on an empty model; plus, when CUDA is present,
CUDA-event latency vs a naive time.time() loop without synchronisation.

    .venv/bin/python benchmarks/bench_latency.py [--budget 2.0] [--rounds 5] [--threads N] [--skip-gpt2]
    .venv/bin/python benchmarks/bench_latency.py --explain [--threads 1]   # where a gap on a short model comes from

Each model is measured in ``--rounds`` alternating rounds (flopcount, Timer, flopcount,
Timer...) so slow drift of the machine affects both; the figure printed per tool is
the median of its round medians.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Tuple

import torch
from torch import nn
from torch.utils import benchmark as tub

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flopcount.bench import benchmark


def mlp() -> Tuple[nn.Module, torch.Tensor]:
    model = nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))
    return model.eval(), torch.randn(32, 512)


def small_cnn() -> Tuple[nn.Module, torch.Tensor]:
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10),
    )
    return model.eval(), torch.randn(8, 3, 64, 64)


def gpt2_small(seq: int) -> Tuple[nn.Module, torch.Tensor]:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config()).eval()  # random weights, no download
    return model, torch.randint(0, 50257, (1, seq))


def timer_median_ms(model: nn.Module, x: torch.Tensor, budget: float, warmup: int, device: str = "cpu") -> float:
    for _ in range(warmup):
        model(x)
    timer = tub.Timer(stmt="model(x)", globals={"model": model, "x": x}, num_threads=torch.get_num_threads())
    return timer.blocked_autorange(min_run_time=budget).median * 1e3


def compare(name: str, model: nn.Module, x: torch.Tensor, budget: float, rounds: int, warmup: int) -> Dict[str, Any]:
    ours: List[float] = []
    theirs: List[float] = []
    iters: List[int] = []
    cvs: List[float] = []
    with torch.inference_mode():
        for _ in range(rounds):
            r = benchmark(model, x, warmup=warmup, budget_s=budget)
            ours.append(r.median_s * 1e3)
            iters.append(r.iters)
            cvs.append(r.cv)
            theirs.append(timer_median_ms(model, x, budget, warmup))
    a, b = statistics.median(ours), statistics.median(theirs)
    return {"name": name, "flopcount_ms": a, "timer_ms": b, "ratio": a / b, "iters": iters, "cv": statistics.median(cvs),
            "rounds_flopcount": ours, "rounds_timer": theirs}


def explain(budget: float, rounds: int) -> None:
    """Where flopcount's per-call median and Timer's figure part, interleaved in rounds.

    Timer's ``blocked_autorange`` times blocks of ``number_per_run`` calls, chosen so that the
    clock overhead (``timeit(0)``, ~0.5 us) is <= 1e-4 of a block: a 2 ms model gets blocks of 10
    calls, a 19 ms one blocks of 1. Its median is then a median of 10-call *means*, which sits
    above the median of single calls when the distribution has a right tail. The third column
    rebuilds Timer's statistic from flopcount's own samples (same run, so no drift between
    them); the last two time Timer's stmt under no_grad and with grad enabled."""
    names = ["flopcount median (single calls)", "flopcount mean", "flopcount samples, median of k-call means",
             "Timer median (inference_mode)", "Timer median (no_grad)", "Timer median (grad enabled)"]
    print(f"== where the figures part ({rounds} interleaved rounds, {budget} s per measurement, "
          f"torch threads {torch.get_num_threads()}) ==")
    for label, make in (("mlp", mlp), ("small_cnn", small_cnn)):
        model, x = make()
        rows: Dict[str, List[float]] = {n: [] for n in names}
        ks: List[int] = []
        same_run: List[float] = []
        for _ in range(rounds):
            with torch.inference_mode():
                r = benchmark(model, x, warmup=10, budget_s=budget)
                m_inf = _timer(model, x, budget)
            with torch.no_grad():
                m_ng = _timer(model, x, budget)
            m_grad = _timer(model, x, budget)
            k = max(1, int(m_inf.number_per_run))
            ks.append(k)
            samples = [v * 1e3 for v in r.stats.samples_s]
            blocks = [statistics.fmean(samples[i:i + k]) for i in range(0, len(samples) - k + 1, k)] or [r.mean_s * 1e3]
            rebuilt = statistics.median(blocks)
            same_run.append(rebuilt / (r.median_s * 1e3))
            for name, value in zip(names, [(r.median_s * 1e3), (r.mean_s * 1e3), rebuilt, m_inf.median * 1e3, m_ng.median * 1e3, m_grad.median * 1e3]):
                rows[name].append(value)
        ref = statistics.median(rows["flopcount median (single calls)"])
        print(f"\n{label}: Timer's calls per block (number_per_run) {sorted(set(ks))}; "
              f"k-call-mean median / single-call median within each flopcount run: "
              f"{' '.join(f'{v:.3f}' for v in same_run)}")
        print(f"{'statistic':<44} {'ms (median of rounds)':>22} {'/ flopcount median':>19}")
        for name in names:
            value = statistics.median(rows[name])
            print(f"{name:<44} {value:>22.4f} {value / ref:>19.3f}")


def _timer(model: nn.Module, x: torch.Tensor, budget: float) -> Any:
    for _ in range(10):
        model(x)
    timer = tub.Timer(stmt="model(x)", globals={"model": model, "x": x}, num_threads=torch.get_num_threads())
    return timer.blocked_autorange(min_run_time=budget)


def overhead(budget: float) -> Dict[str, float]:
    """Harness cost per iteration on an empty model: flopcount's wall time per
    iteration of its timed region minus the per-call cost Timer measures with its
    amortised loop (timeit: many calls per clock reading)."""
    model, x = nn.Identity(), torch.randn(1)
    with torch.inference_mode():
        r = benchmark(model, x, warmup=100, budget_s=budget)
        call_ms = timer_median_ms(model, x, budget, 100)
    per_iter_us = r.wall_s / r.iters * 1e6
    return {
        "iters": r.iters,
        "flopcount_median_us": r.median_s * 1e6,
        "timer_per_call_us": call_ms * 1e3,
        "wall_per_iter_us": per_iter_us,
        "overhead_us": per_iter_us - call_ms * 1e3,
    }


def cuda_section(models: List[Tuple[str, Callable[[], Tuple[nn.Module, torch.Tensor]]]], budget: float) -> None:
    print("\n== CUDA: CUDA-event latency vs Timer vs naive time.time() loop without synchronisation ==")
    print(f"device: {torch.cuda.get_device_name()}")
    header = f"{'model':<12} {'flopcount ms':>13} {'Timer ms':>10} {'ratio':>7} {'naive ms':>10} {'naive/events':>13} {'synced wall ms':>15}"
    print(header)
    for name, make in models:
        model, x = make()
        model, x = model.cuda(), x.cuda()
        with torch.inference_mode():
            r = benchmark(model, x, warmup=10, budget_s=budget)
            for _ in range(10):
                model(x)
            torch.cuda.synchronize()
            t = tub.Timer(stmt="model(x)", globals={"model": model, "x": x}).blocked_autorange(min_run_time=budget)
            n = 50
            torch.cuda.synchronize()
            start = time.time()
            for _ in range(n):
                model(x)  # the classic mistake: no synchronize, so this times kernel launches
            naive_ms = (time.time() - start) / n * 1e3
            torch.cuda.synchronize()
            start = time.time()
            for _ in range(n):
                model(x)
            torch.cuda.synchronize()
            synced_ms = (time.time() - start) / n * 1e3
        print(f"{name:<12} {(r.median_s * 1e3):>13.4f} {t.median * 1e3:>10.4f} {(r.median_s * 1e3) / (t.median * 1e3):>7.3f} "
              f"{naive_ms:>10.4f} {naive_ms / (r.median_s * 1e3):>13.3f} {synced_ms:>15.4f}")


def main(argv: Any = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=2.0, help="seconds of timing per measurement (both tools)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seq", type=int, default=64, help="GPT-2 sequence length")
    parser.add_argument("--skip-gpt2", action="store_true")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads for the whole run (default: torch's)")
    parser.add_argument("--explain", action="store_true", help="only the MLP, decomposing the gap (statistic, grad mode)")
    args = parser.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.explain:
        explain(args.budget, args.rounds)
        return 0

    cpu = platform.processor() or platform.machine()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    print(f"torch {torch.__version__}, python {platform.python_version()}, CPU {cpu}, "
          f"torch threads {torch.get_num_threads()}, CUDA {'yes' if torch.cuda.is_available() else 'no'}")
    print(f"budget {args.budget} s per measurement, {args.rounds} alternating rounds, 10 warm-up calls each\n")

    models: List[Tuple[str, Callable[[], Tuple[nn.Module, torch.Tensor]]]] = [("mlp", mlp), ("small_cnn", small_cnn)]
    if not args.skip_gpt2:
        models.append((f"gpt2_s{args.seq}", lambda: gpt2_small(args.seq)))

    print("== CPU: flopcount.benchmark median vs torch.utils.benchmark.Timer.blocked_autorange median ==")
    print(f"{'model':<12} {'flopcount ms':>13} {'Timer ms':>10} {'ratio':>7} {'CV':>7}  per-round ratios (flopcount/Timer)")
    worst = 0.0
    for name, make in models:
        model, x = make()
        row = compare(name, model, x, args.budget, args.rounds, warmup=10)
        worst = max(worst, abs(row["ratio"] - 1))
        rounds = " ".join(f"{a / b:.3f}" for a, b in zip(row["rounds_flopcount"], row["rounds_timer"]))
        print(f"{name:<12} {row['flopcount_ms']:>13.4f} {row['timer_ms']:>10.4f} {row['ratio']:>7.3f} "
              f"{100 * row['cv']:>6.1f}%  {rounds}  (iterations/round {'/'.join(map(str, row['iters']))})")
    print(f"largest disagreement: {100 * worst:.2f}% (target < 5%)")

    o = overhead(args.budget)
    print("\n== harness overhead on an empty model (nn.Identity, 1-element tensor) ==")
    print(f"iterations {o['iters']}; flopcount median sample {o['flopcount_median_us']:.3f} us; "
          f"Timer per call {o['timer_per_call_us']:.3f} us; flopcount wall per iteration {o['wall_per_iter_us']:.3f} us")
    print(f"harness overhead per iteration: {o['overhead_us']:.3f} us (target < 20 us)")

    if torch.cuda.is_available():
        cuda_section(models, args.budget)
    else:
        print("\n(no CUDA: the CUDA-event vs naive time.time() comparison was not run)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
