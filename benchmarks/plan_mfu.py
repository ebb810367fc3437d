"""MFU and HFU of a planned step, like for like with torchtitan's published Llama 3.1 8B run
(docs/parallel.md, "MFU and HFU").

torchtitan (docs/performance.md at commit eaea6f6, torch of 2024-12-23): Llama 3.1 8B, 8 H100
(96 GB HBM2e, 500 W), FSDP 8, local batch 2 x 8192 tokens, bf16 mixed precision, selective
activation checkpointing: 5,762 tokens/s per GPU eager (6,667 with torch.compile), "33% to 39%
MFU" against H100 SXM's 989 TFLOP/s bf16 dense; its MFU numerator is
``6 * N + 12 * L * H * Q * T`` FLOPs per token, N the parameters less the token embedding
(torchtitan/utils.py ``get_num_flop_per_token``).

This plans the same step (no activation checkpointing: the plan does what the model does) and
prints, per token: torchtitan's formula, flopcount's model FLOPs (3 x the forward it counts)
and hardware FLOPs (every FLOP the rank ran); then the MFU and HFU each implies at torchtitan's
measured step time, and the plan's own step-time bounds (dp over InfiniBand NDR; torchtitan's 8 ranks
shared one NVLink host, so pass link="nvlink4" for that bound).

    PYTHONPATH=. python benchmarks/plan_mfu.py [--tokens 8192] [--batch 2] [--layers 32]"""

from __future__ import annotations

import argparse
import time

import torch

PUBLISHED_TPS = {"eager": 5762.0, "compiled": 6667.0}
PEAK = 989e12  # H100 SXM bf16 dense, the peak torchtitan divides by


def llama31_8b(layers: int) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        num_hidden_layers=layers, hidden_size=4096, num_attention_heads=32, num_key_value_heads=8,
        intermediate_size=14336, vocab_size=128256, max_position_embeddings=131072, rope_theta=500000.0,
        use_cache=False,
    )
    return LlamaForCausalLM(config)


def main() -> None:
    import flopcount

    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--layers", type=int, default=32)
    args = parser.parse_args()
    tokens = args.batch * args.tokens
    ids = torch.empty(args.batch, args.tokens, dtype=torch.int64, device="meta")
    start = time.perf_counter()
    r = flopcount.plan(lambda: llama31_8b(args.layers), (ids,), fsdp=8, on="h100", link="infiniband-ndr",
                       mixed_precision="bfloat16")
    seconds = time.perf_counter() - start
    with torch.device("meta"):
        model = llama31_8b(args.layers)
    non_embedding = sum(p.numel() for p in model.parameters()) - model.model.embed_tokens.weight.numel()
    titan = 6 * non_embedding + 12 * args.layers * 32 * 128 * args.tokens
    assert r.model_flops is not None and r.step_time is not None
    model_pt, hw_pt = r.model_flops / tokens, r.total_flops / tokens
    print(f"Llama 3.1 8B ({args.layers} layers), fsdp=8, {args.batch} x {args.tokens} tokens per rank, bf16; plan {seconds:.1f} s")
    print(f"  torchtitan 6N + 12·L·H·Q·T:        {titan / 1e9:8.2f} GFLOP/token (N = {non_embedding:,} non-embedding)")
    print(f"  flopcount model FLOPs (MFU's):     {model_pt / 1e9:8.2f} GFLOP/token ({model_pt / titan:.4f} x torchtitan's)")
    print(f"  flopcount hardware FLOPs (HFU's):  {hw_pt / 1e9:8.2f} GFLOP/token ({hw_pt / titan:.4f} x torchtitan's)")
    for name, tps in PUBLISHED_TPS.items():
        step = tokens / tps
        print(f"  at torchtitan's {name} {tps:,.0f} tokens/s/GPU (step {step:.3f} s): torchtitan MFU "
              f"{titan * tps / PEAK:.1%}, flopcount MFU {r.model_flops / step / PEAK:.1%}, HFU {r.total_flops / step / PEAK:.1%}")
    b = r.step_time
    print(f"  plan bounds: compute {b.compute_s:.3f} s, comm {b.comm_s:.3f} s; MFU {b.mfu_no_overlap:.1%} (no overlap) "
          f"{b.mfu_overlap:.1%} (overlap), HFU {b.hfu_no_overlap:.1%} / {b.hfu_overlap:.1%}")


if __name__ == "__main__":
    main()
