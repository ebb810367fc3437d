"""flopcount.serve's ceilings against published measurements (issue #31).

Source: NVIDIA TensorRT-LLM, docs/source/performance.md ("Performance of TensorRT-LLM", data
for v0.6.1; the low-latency tables from v0.5), as stored at
https://github.com/NVIDIA/TensorRT-LLM/blob/138f96d45f90b9667426f7c47297d8c06bafac73/docs/source/performance.md
Methodology there: gptSessionBenchmark (static batching: every sequence of the batch is
prefilled, then decoded for the output length), H100 = H100-HBM3-80GB (the H100 SXM), engines
with FP8 weights, FP8 compute and FP8 KV cache (``--enable_fp8 --fp8_kv_cache``) on H100 and
FP16 on A100; "LLaMA 7B" is Llama-2-7b. The A100 variant is not named: the ceiling is taken on
the fastest one (A100 80GB SXM, 2,039 GB/s), so it holds for every variant.

Quoted rows (batch, input, output -> published figure):
  Peak throughput (out tok/s per GPU, TP 1):
    H100 FP8  LLaMA 7B  768, 128, 128 -> 19,694;   80, 2048, 128 -> 2,244
    H100 FP8  GPT-J 6B 1024, 128, 128 -> 26,150;   64, 2048, 128 -> 2,551
    A100 FP16 LLaMA 7B  384, 128, 128 ->  5,586;   52, 2048, 128 ->   591
    A100 FP16 GPT-J 6B  512, 128, 128 ->  6,374;   60, 2048, 128 ->   670
  Low latency (1st token latency, ms, batch 1, TP 1):
    H100 FP8  LLaMA 7B 128 -> 7, 2048 -> 36;  GPT-J 6B 128 -> 7, 2048 -> 29
    A100 FP16 LLaMA 7B 128 -> 16, 2048 -> 133; GPT-J 6B 128 -> 12, 2048 -> 129

flopcount's ceiling for a throughput row is batch x output / (TTFT bound + the decode steps'
bounds), the static batch TensorRT-LLM ran; for a latency row the TTFT bound. A true ceiling
keeps published / ceiling (throughput) and bound / published (latency) at or below 1.0.
Models are built on meta from their published configs (no download).

    .venv/bin/python benchmarks/serve_published.py
"""

from __future__ import annotations

import sys
import time
import warnings
from pathlib import Path
from typing import Any, Dict, List, Tuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# meta-llama/Llama-2-7b-hf and EleutherAI/gpt-j-6b config.json
CONFIGS: Dict[str, Tuple[str, Dict[str, Any]]] = {
    "LLaMA-2-7B": ("llama", dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
                                 num_key_value_heads=32, vocab_size=32000, max_position_embeddings=4096,
                                 tie_word_embeddings=False)),
    "GPT-J-6B": ("gptj", dict(n_embd=4096, n_layer=28, n_head=16, rotary_dim=64, vocab_size=50400, n_positions=2048,
                              tie_word_embeddings=False)),
}
# (model, part, compute/weight dtype, batch, input, output, published out tok/s per GPU)
THROUGHPUT: List[Tuple[str, str, str, int, int, int, float]] = [
    ("LLaMA-2-7B", "H100 SXM", "fp8", 768, 128, 128, 19694), ("LLaMA-2-7B", "H100 SXM", "fp8", 80, 2048, 128, 2244),
    ("GPT-J-6B", "H100 SXM", "fp8", 1024, 128, 128, 26150), ("GPT-J-6B", "H100 SXM", "fp8", 64, 2048, 128, 2551),
    ("LLaMA-2-7B", "A100 80GB SXM", "fp16", 384, 128, 128, 5586),
    ("LLaMA-2-7B", "A100 80GB SXM", "fp16", 52, 2048, 128, 591),
    ("GPT-J-6B", "A100 80GB SXM", "fp16", 512, 128, 128, 6374), ("GPT-J-6B", "A100 80GB SXM", "fp16", 60, 2048, 128, 670),
]
# (model, part, dtype, input, published first-token latency in ms), batch 1
LATENCY: List[Tuple[str, str, str, int, float]] = [
    ("LLaMA-2-7B", "H100 SXM", "fp8", 128, 7), ("LLaMA-2-7B", "H100 SXM", "fp8", 2048, 36),
    ("GPT-J-6B", "H100 SXM", "fp8", 128, 7), ("GPT-J-6B", "H100 SXM", "fp8", 2048, 29),
    ("LLaMA-2-7B", "A100 80GB SXM", "fp16", 128, 16), ("LLaMA-2-7B", "A100 80GB SXM", "fp16", 2048, 133),
    ("GPT-J-6B", "A100 80GB SXM", "fp16", 128, 12), ("GPT-J-6B", "A100 80GB SXM", "fp16", 2048, 129),
]
DTYPES = {"fp8": ("float8_e4m3fn", "fp8"), "fp16": ("float16", None)}


def main() -> None:
    import torch
    import transformers

    from flopcount.devices import named_roofs
    from flopcount.serving import serve_facts, serve_on

    warnings.filterwarnings("ignore")
    facts: Dict[Tuple[str, int, int], Any] = {}
    started = time.perf_counter()
    for name, (kind, config) in CONFIGS.items():
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(kind, **config),
                                                                  dtype=torch.float16)
        for prompt in (128, 2048):
            ids = torch.zeros(1, prompt, dtype=torch.int64, device="meta")
            facts[(name, prompt, 128)] = serve_facts(model, ids, 128)
    print(f"counted in {time.perf_counter() - started:.1f} s\n")
    print("| model | part | dtype | batch | in | out | published tok/s | ceiling tok/s | published / ceiling |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|")
    worst = 0.0
    for name, part, dt, batch, prompt, new, published in THROUGHPUT:
        dtype, weights = DTYPES[dt]
        result = serve_on(facts[(name, prompt, new)], named_roofs(part), part, None, "", batch=[batch], dtype=dtype,
                          weight_dtype=weights)
        row = result.at(batch)
        ceiling = batch * new / (row.ttft_s + row.decode_s)
        worst = max(worst, published / ceiling)
        print(f"| {name} | {part} | {dt} | {batch} | {prompt} | {new} | {published:,.0f} | {ceiling:,.0f} | "
              f"{published / ceiling:.2f} |")
    print("\n| model | part | dtype | input | published TTFT ms | bound ms | bound / published |")
    print("|---|---|---|---:|---:|---:|---:|")
    for name, part, dt, prompt, ms in LATENCY:
        dtype, weights = DTYPES[dt]
        result = serve_on(facts[(name, prompt, 128)], named_roofs(part), part, None, "", batch=[1], dtype=dtype,
                          weight_dtype=weights)
        bound_ms = result.at(1).ttft_s * 1e3
        worst = max(worst, bound_ms / ms)
        print(f"| {name} | {part} | {dt} | {prompt} | {ms:g} | {bound_ms:.2f} | {bound_ms / ms:.2f} |")
    print(f"\nlargest ratio {worst:.2f} (above 1.0 would mean a published figure beat the ceiling)")


if __name__ == "__main__":
    main()
