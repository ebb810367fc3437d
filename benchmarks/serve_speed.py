"""Speed of flopcount.serve on a LLaMA-2-70B config on meta (issue #31): prompt 2,048, 256 new
tokens, three batch sizes (1, 8, 64) on H100 and L4, in a fresh process: wall time, CPU time and
peak RSS of the whole call (model built before the clock starts).

    .venv/bin/python benchmarks/serve_speed.py [--layers 80] [--prompt 2048] [--new 256] [--full]

``--full`` counts both batch sizes in full (``serve_facts(..., derived=False)``, the path
before the derivation of issue #31's speed target), for a before/after in one process kind.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=80)
    parser.add_argument("--prompt", type=int, default=2048)
    parser.add_argument("--new", type=int, default=256)
    parser.add_argument("--full", action="store_true", help="count both batch sizes in full (no derivation)")
    args = parser.parse_args()
    import torch
    import transformers

    from flopcount.devices import named_roofs
    from flopcount.serving import serve_facts, serve_on

    warnings.filterwarnings("ignore")
    # meta-llama/Llama-2-70b-hf config.json
    config = transformers.AutoConfig.for_model(
        "llama", hidden_size=8192, intermediate_size=28672, num_hidden_layers=args.layers, num_attention_heads=64,
        num_key_value_heads=8, vocab_size=32000, max_position_embeddings=4096, tie_word_embeddings=False)
    started = time.perf_counter()
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float16)
    built = time.perf_counter() - started
    ids = torch.zeros(1, args.prompt, dtype=torch.int64, device="meta")
    wall0, cpu0 = time.perf_counter(), time.process_time()
    facts = serve_facts(model, ids, args.new, derived=not args.full)
    counted = time.perf_counter() - wall0
    results = [serve_on(facts, named_roofs(part), part, capacity, link, batch=[1, 8, 64])
               for part, capacity, link in (("H100 SXM", 80e9, "nvlink4"), ("L4", 24e9, "pcie4"))]
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    how = "both batch sizes counted in full" if args.full else "derived"
    print(f"LLaMA-2-70B ({args.layers} layers), prompt {args.prompt}, {args.new} new, batches 1, 8, 64 on H100 and L4 ({how}):")
    print(f"  serve: {wall:.1f} s wall ({counted:.1f} s counting, the rest pricing), {cpu:.1f} s CPU, "
          f"peak RSS {peak / 1e9:.2f} GB; model built on meta in {built:.1f} s (not included)")
    for result in results:
        for row in result.batches:
            print(f"  {result.part:9s} B={row.batch:3d}  TTFT >= {row.ttft_s * 1e3:8.1f} ms  ITL >= "
                  f"{row.first_step.seconds * 1e3 if row.first_step else 0:7.2f} ms  tok/s <= {row.tokens_per_s or 0:9.1f}"
                  f"  fits: {row.fits}")


if __name__ == "__main__":
    main()
