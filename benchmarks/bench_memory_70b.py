"""Issue #32's memory and plan targets: LLaMA-2-70B (80 layers, bfloat16, built on meta from
its published config), 1 x 4,096 tokens, AdamW: the wall time of ``estimate_memory`` of one
training step and of ``plan`` at fsdp=64 x tp=8 (each target: under 5 s), with their headline
figures so that two runs can be compared to the byte.

    PYTHONPATH=. python benchmarks/bench_memory_70b.py [--only memory|plan|warm-up] [--layers 80]
        [--tokens 4096] [--repeat 1] [--profile FILE]

Wall seconds and this process's CPU seconds (the fairer figure on a loaded machine).
``--profile FILE``: cProfile the last repeat of each case into FILE.<case> (pstats format).
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import resource
import time
import warnings
from typing import Any, Callable, List, Optional

import torch


def build_70b(layers: int) -> torch.nn.Module:
    from transformers import LlamaForCausalLM

    from flopcount.examples.hf import llama2_70b_config

    config = llama2_70b_config()
    config.num_hidden_layers = layers
    config.use_cache = False
    with torch.device("meta"):
        return LlamaForCausalLM(config).to(torch.bfloat16)


def timed(fn: Callable[[], Any], repeat: int, profile: Optional[str]) -> tuple:
    times: List[float] = []
    cpus: List[float] = []
    result = None
    for i in range(repeat):
        profiler = cProfile.Profile() if profile and i == repeat - 1 else None
        start, cpu = time.perf_counter(), time.process_time()
        if profiler is not None:
            profiler.enable()
        result = fn()
        if profiler is not None:
            profiler.disable()
        times.append(time.perf_counter() - start)
        cpus.append(time.process_time() - cpu)
        if profiler is not None and profile:
            profiler.dump_stats(profile)
    return result, " ".join(f"{t:.2f}" for t in times) + " s wall (CPU " + " ".join(f"{c:.2f}" for c in cpus) + " s)"


def warm_ups(layers: int) -> None:
    """The optimizer warm-up alone (AdamW on the model's fake copy), full and by kind, twice each."""
    from flopcount.step.optimizers import build_optimizer, warm_up
    from flopcount.tracers.fake.copies import fake_copies

    model = build_70b(layers)
    for reuse in (False, True, False, True):
        copied = fake_copies(model, [], lambda tensors: ((), {}), storages=True)
        with copied.mode:
            opt, _ = build_optimizer("adamw", {}, list(copied.model.parameters()), "bench")
            start = time.process_time()
            warm_up(opt, "bench", reuse=reuse)
            cpu = time.process_time() - start
        state = sum(v.numel() * v.element_size() for s in opt.state.values() for v in s.values())
        print(f"warm-up {'by kind' if reuse else 'full'}: {cpu:.2f} s CPU, {len(opt.state)} states, {state:,} B")


def main() -> None:
    import flopcount

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=("memory", "plan", "warm-up"), default=None)
    parser.add_argument("--layers", type=int, default=80)
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--profile", default=None)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    import transformers.models.llama.modeling_llama  # noqa: F401  # the one-time import, outside the timing

    with open("/proc/loadavg") as f:
        print("load before:", f.read().strip())
    ids = torch.zeros(1, args.tokens, dtype=torch.int64, device="meta")
    if args.only == "warm-up":
        warm_ups(args.layers)
        return
    if args.only in (None, "memory"):
        model = build_70b(args.layers)
        profile = f"{args.profile}.memory" if args.profile else None
        result, times = timed(
            lambda: flopcount.estimate_memory(model, (), {"input_ids": ids, "labels": ids}, backward=True, optimizer="adamw"),
            args.repeat, profile,
        )
        print(
            f"estimate_memory 70B training step (bf16, AdamW) tokens={args.tokens} layers={args.layers}: "
            f"{times}; peak {result.peak_bytes:,} B in "
            f"{result.peak_phase} of '{result.peak_module}'; at peak {result.at_peak}"
        )
        print("  modules digest:", hashlib.sha256(repr(result.modules).encode()).hexdigest()[:16])
        del model
    if args.only in (None, "plan"):
        profile = f"{args.profile}.plan" if args.profile else None
        result, times = timed(
            lambda: flopcount.plan(
                lambda: build_70b(args.layers), (ids,), fsdp=64, tp=8, on="h100",
                link={"dp": "infiniband-ndr", "tp": "nvlink4"},
            ),
            args.repeat, profile,
        )
        print(
            f"plan 70B fsdp=64 tp=8 tokens={args.tokens} layers={args.layers}: "
            f"{times}; peak {result.peak_bytes:,} B; memory {result.memory}; "
            f"flops {result.flops}; comm {[(c.kind, c.dim, c.calls, c.tensor_bytes) for c in result.comm]}"
        )
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2
    with open("/proc/loadavg") as f:
        print(f"peak RSS {rss:.2f} GiB; load after:", f.read().strip())


if __name__ == "__main__":
    main()
