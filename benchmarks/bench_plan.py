"""Time and peak RAM of planning LLaMA-2-70B (80 layers) at fsdp=64 x tp=8, 4096 tokens
per rank, on this machine (fake world: nothing allocated but fake tensors).

    PYTHONPATH=. python benchmarks/bench_plan.py [--fsdp 64] [--tp 8] [--tokens 4096] [--layers 80]
Prints wall seconds, peak RSS (ru_maxrss) and the plan's headline figures."""

from __future__ import annotations

import argparse
import resource
import time

import torch


def build_70b(layers: int) -> torch.nn.Module:
    from transformers import LlamaForCausalLM

    from flopcount.examples.hf import llama2_70b_config

    config = llama2_70b_config()
    config.num_hidden_layers = layers
    config.use_cache = False
    return LlamaForCausalLM(config).to(torch.bfloat16)


def main() -> None:
    import flopcount

    parser = argparse.ArgumentParser()
    parser.add_argument("--fsdp", type=int, default=64)
    parser.add_argument("--tp", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--layers", type=int, default=80)
    args = parser.parse_args()
    ids = torch.empty(1, args.tokens, dtype=torch.int64, device="meta")
    import transformers.models.llama.modeling_llama  # noqa: F401  # the one-time import, outside the timing

    cpu_start = time.process_time()
    start = time.perf_counter()
    result = flopcount.plan(
        lambda: build_70b(args.layers), (ids,), fsdp=args.fsdp, tp=args.tp,
        on="h100", link={"dp": "infiniband-ndr", "tp": "nvlink4"} if args.fsdp > 1 and args.tp > 1 else "nvlink4",
    )
    seconds = time.perf_counter() - start
    cpu = time.process_time() - cpu_start
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2
    print(f"70B plan fsdp={args.fsdp} tp={args.tp} tokens={args.tokens} layers={args.layers}: "
          f"{seconds:.1f} s wall ({cpu:.1f} s CPU), peak RSS {rss:.2f} GiB")
    print(f"per-rank FLOPs {result.total_flops / 1e12:.1f} T, peak {result.peak_bytes / 1e9:.2f} GB")
    print(result.table())


if __name__ == "__main__":
    main()
