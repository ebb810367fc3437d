"""count_generation on meta at scale: 128 new tokens after a 2048-token prompt for
Mixtral-8x7B (transformers' default mixtral config) and a LLaMA-70B config (80 layers,
hidden 8192, MLP 28672, 64 heads, 8 KV heads), each in its own subprocess: wall time of the
count (model construction on meta reported apart), the CPU time it used (the wall time on an
idle core; the two differ on a shared machine) and peak RSS of the process.

    .venv/bin/python benchmarks/llm_generation.py [--prompt 2048] [--new-tokens 128]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CONFIGS = {
    "Mixtral-8x7B": ("mixtral", {}),
    "LLaMA-70B": ("llama", dict(num_hidden_layers=80, hidden_size=8192, intermediate_size=28672,
                                num_attention_heads=64, num_key_value_heads=8, vocab_size=32000)),
}


def one(label: str, prompt: int, new_tokens: int) -> dict:
    import warnings

    import torch
    import transformers

    from flopcount.generation.count import count_generation

    warnings.simplefilter("ignore")
    model_type, overrides = CONFIGS[label]
    config = transformers.AutoConfig.for_model(model_type, **overrides)
    started = time.perf_counter()
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()
    built = time.perf_counter() - started
    ids = torch.empty(1, prompt, dtype=torch.int64, device="meta")
    started, cpu = time.perf_counter(), time.process_time()
    result = count_generation(model, ids, new_tokens=new_tokens)
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu
    return {
        "model": label, "build_s": built, "count_s": wall, "count_cpu_s": cpu,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "prefill_flops": result.prefill.flops, "decode_flops": result.decode_flops, "flops": result.flops,
        "kv_cache_bytes": result.kv_cache_bytes, "complete": result.complete,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt", type=int, default=2048)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--row", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.row:
        print(json.dumps(one(args.row, args.prompt, args.new_tokens)))
        return
    print(f"count_generation on meta, 1 x {args.prompt} prompt, {args.new_tokens} new tokens")
    print("| model | count wall time | its CPU time | peak RSS | prefill FLOPs | decode FLOPs | KV cache (bf16) | build on meta |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for label in CONFIGS:
        done = subprocess.run([sys.executable, __file__, "--row", label, "--prompt", str(args.prompt),
                               "--new-tokens", str(args.new_tokens)], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            print(f"| {label} | failed: {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else '?'} |")
            continue
        r = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"| {label} | {r['count_s']:.1f} s | {r['count_cpu_s']:.1f} s | {r['peak_rss_mb']:.0f} MB | {r['prefill_flops'] / 1e12:.2f} T "
              f"| {r['decode_flops'] / 1e12:.2f} T | {r['kv_cache_bytes'] / 2**20:.1f} MiB | {r['build_s']:.1f} s |", flush=True)


if __name__ == "__main__":
    main()
