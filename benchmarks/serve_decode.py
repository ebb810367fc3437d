"""serve's decode-step bounds where the cache holds keys a step's mask hides: Llama-4-Scout's
chunked attention (``attention_chunk_size`` 8,192, three layers in four) at a 16k context, and a
LLaMA-2-7B static cache (``cache_implementation="static"``, ``max_cache_len`` 4,096, prompt 512).
Both built on meta from their published config.json shapes (no download), bfloat16 on an H100 SXM,
tp 1, 128 new tokens. One JSON line per case and batch: the first and last decode steps' counted
and skipped FLOPs and their bounds (the inter-token latency bound at the first and last context),
the tokens/s ceilings, the time-to-first-token bound, the cache per sequence, the largest batch
that fits the part's 80 GB less 10 %, and the count's CPU time.

    PYTHONPATH=. .venv/bin/python benchmarks/serve_decode.py [--case scout llama2-static] [--batch 1 64]

A tree without branch servedecode's rule prices each step's attention over every key the cache
hands it (C of a chunked layer, all 4,096 slots of the static cache) and reads every position the
cache holds; with it, the keys the mask admits (p mod C + 1; p + 1) and the positions before them.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# meta-llama/Llama-4-Scout-17B-16E's text_config (config.json): 48 layers, every fourth without rope
# and with full attention (no_rope_layer_interval 4), the others chunked; 16 experts, one per token
SCOUT = dict(num_hidden_layers=48, hidden_size=5120, num_attention_heads=40, num_key_value_heads=8, head_dim=128,
             intermediate_size=8192, intermediate_size_mlp=16384, num_local_experts=16, num_experts_per_tok=1,
             vocab_size=202048, attention_chunk_size=8192, max_position_embeddings=32768,
             attn_implementation="sdpa")
# meta-llama/Llama-2-7b-hf's config.json
LLAMA_2_7B = dict(num_hidden_layers=32, hidden_size=4096, num_attention_heads=32, num_key_value_heads=32,
                  intermediate_size=11008, vocab_size=32000, max_position_embeddings=4096)
CASES = ("scout", "llama2-static")


def _model(case: str):  # type: ignore[no-untyped-def]
    import torch
    import transformers

    if case == "scout":
        config = transformers.Llama4TextConfig(**SCOUT)
    else:
        config = transformers.AutoConfig.for_model("llama", **LLAMA_2_7B)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()
    model.generation_config.eos_token_id = None
    if case == "llama2-static":
        model.generation_config.cache_implementation = "static"
        model.generation_config.max_cache_len = 4096
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--case", nargs="+", choices=CASES, default=list(CASES))
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--new", type=int, default=128)
    args = parser.parse_args()

    import torch

    from flopcount.devices import find_part, named_roofs
    from flopcount.serving import serve_facts, serve_on

    warnings.filterwarnings("ignore")
    part = find_part("h100")
    assert part is not None
    for case in args.case:
        model = _model(case)
        prompt = 16384 if case == "scout" else 512
        started = time.process_time()
        facts = serve_facts(model, torch.zeros(1, prompt, dtype=torch.int64, device="meta"), args.new)
        cpu = time.process_time() - started
        result = serve_on(facts, named_roofs("h100"), part.name, float(part.memory_bytes), part.links[0],
                          batch=args.batch, dtype="bfloat16")
        for row in result.batches:
            first, last = row.first_step, row.last_step
            assert first is not None and last is not None
            print(json.dumps(dict(
                case=case, prompt=prompt, new=args.new, batch=row.batch,
                first_flops=first.flops, first_skipped=first.skipped_flops, last_skipped=last.skipped_flops,
                first_step_ms=round(first.seconds * 1e3, 4), first_compute_ms=round(first.compute_s * 1e3, 4),
                first_memory_ms=round(first.memory_s * 1e3, 4), last_step_ms=round(last.seconds * 1e3, 4),
                tokens_per_s_per_sequence=round(row.tokens_per_s_per_sequence or 0.0, 2),
                tokens_per_s=round(row.tokens_per_s or 0.0, 1), ttft_ms=round(row.ttft_s * 1e3, 3),
                cache_gb_per_sequence=round(result.kv_bytes_per_sequence / 1e9, 4), max_batch=result.max_batch,
                cpu_s=round(cpu, 2))))


if __name__ == "__main__":
    main()
