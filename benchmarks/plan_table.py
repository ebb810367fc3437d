"""Per-rank plans of LLaMA-2-7B and 70B training at fsdp 8/64 x tp 1/2/8 (docs/parallel.md).

One micro-batch of 1 x 4096 tokens per rank, float32 parameters and AdamW state, FSDP2
mixed precision (bfloat16 compute, float32 gradient reduction: torchtitan's default), no
activation checkpointing; links: tp over NVLink 4, dp over InfiniBand NDR; H100 SXM.

    PYTHONPATH=. python benchmarks/plan_table.py [--tokens 4096] [--models 7b,70b]
Prints one markdown row per plan and the seconds each plan took."""

from __future__ import annotations

import argparse
import time

import torch


def build(name: str) -> torch.nn.Module:
    from transformers import LlamaForCausalLM

    from flopcount.examples.hf import llama2_7b_config, llama2_70b_config

    config = llama2_7b_config() if name == "7b" else llama2_70b_config()
    config.use_cache = False
    return LlamaForCausalLM(config)


def main() -> None:
    import flopcount

    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--models", default="7b,70b")
    args = parser.parse_args()
    ids = torch.empty(1, args.tokens, dtype=torch.int64, device="meta")
    print("| model | fsdp | tp | params+grads+Adam (GB) | activations (GB) | peak (GB) | TFLOPs/rank (HFU's) | "
          "model TFLOPs/rank (MFU's) | dp wire (GB) | tp wire (GB) | compute (s) | comm (s) | MFU no overlap | "
          "MFU overlap | HFU no overlap | HFU overlap | plan (s) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name in args.models.split(","):
        for fsdp in (8, 64):
            for tp in (1, 2, 8):
                link = {"dp": "infiniband-ndr", "tp": "nvlink4"} if tp > 1 else {"dp": "infiniband-ndr"}
                start = time.perf_counter()
                r = flopcount.plan(lambda: build(name), (ids,), fsdp=fsdp, tp=tp, on="h100", link=link,
                                   mixed_precision="bfloat16")
                seconds = time.perf_counter() - start
                state = sum(r.state_bytes.values()) / 1e9
                wire = {dim: sum(c.wire_bytes for c in r.comm if c.dim == dim) / 1e9 for dim in ("dp", "tp")}
                b = r.step_time
                assert b is not None and b.mfu_overlap is not None and b.hfu_overlap is not None
                print(f"| {name} | {fsdp} | {tp} | {state:.2f} | {r.memory.get('activations', 0) / 1e9:.2f} | "
                      f"{r.peak_bytes / 1e9:.2f} | {r.total_flops / 1e12:.1f} | {(r.model_flops or 0) / 1e12:.1f} | "
                      f"{wire['dp']:.2f} | {wire['tp']:.2f} | {b.compute_s:.3f} | {b.comm_s:.3f} | "
                      f"{b.mfu_no_overlap:.1%} | {b.mfu_overlap:.1%} | {b.hfu_no_overlap:.1%} | {b.hfu_overlap:.1%} | "
                      f"{seconds:.1f} |", flush=True)


if __name__ == "__main__":
    main()
