"""serve's decode-step bounds where the cache holds keys a step's mask hides: Llama-4-Scout's
chunked attention (``attention_chunk_size`` 8,192, three layers in four) at a 16k context, and a
LLaMA-2-7B static cache (``cache_implementation="static"``, ``max_cache_len`` 4,096, prompt 512).
Both built on meta from their published config.json shapes (no download), bfloat16 on an H100 SXM,
tp 1, 128 new tokens. One JSON line per case and batch: the first and last decode steps' counted
and skipped FLOPs and their bounds (the inter-token latency bound at the first and last context),
the tokens/s ceilings, the time-to-first-token bound, the cache per sequence, the largest batch
that fits the part's 80 GB less 10 %, and the count's CPU time.

    PYTHONPATH=. .venv/bin/python benchmarks/serve_decode.py [--case scout llama2-static] [--batch 1 64]

Branch servepad's cases (``--case mistral-static gemma2-static gpt2-reorder``): Mistral-7B (SDPA)
and Gemma-2-9B (eager: transformers 5.24 refuses it SDPA) over a static cache of 8,192 slots, their
sliding layers' window 4,096, prompt 2,048; GPT-2 XL loaded eager with ``reorder_and_upcast_attn``
(its scores by ``baddbmm``, dynamic cache), prompt 896. A tree without servepad's rules prices a
static cache's sliding layers over all their slots, an eager attention's score ops in decode over
every slot, and a ``baddbmm`` attention over the whole square.

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
# mistralai/Mistral-7B-v0.1's config.json
MISTRAL_7B = dict(num_hidden_layers=32, hidden_size=4096, num_attention_heads=32, num_key_value_heads=8,
                  intermediate_size=14336, vocab_size=32000, sliding_window=4096, max_position_embeddings=32768)
# google/gemma-2-9b's config.json (eager attention: transformers 5.24 refuses Gemma-2 SDPA)
GEMMA_2_9B = dict(num_hidden_layers=42, hidden_size=3584, num_attention_heads=16, num_key_value_heads=8, head_dim=256,
                  intermediate_size=14336, vocab_size=256000, sliding_window=4096, query_pre_attn_scalar=256,
                  attn_logit_softcapping=50.0, final_logit_softcapping=30.0, max_position_embeddings=8192,
                  attn_implementation="eager")
# openai-community/gpt2-xl's config.json, its attention eager with the reordered, upcast baddbmm
GPT2_XL = dict(n_layer=48, n_embd=1600, n_head=25, n_positions=1024, vocab_size=50257, reorder_and_upcast_attn=True,
               attn_implementation="eager")
#: case -> (model type, config, static cache slots or None, prompt)
BUILT = {"mistral-static": ("mistral", MISTRAL_7B, 8192, 2048), "gemma2-static": ("gemma2", GEMMA_2_9B, 8192, 2048),
         "gpt2-reorder": ("gpt2", GPT2_XL, None, 896)}
CASES = ("scout", "llama2-static", *BUILT)



def _model(case: str):  # type: ignore[no-untyped-def]
    import torch
    import transformers

    slots = 4096 if case == "llama2-static" else None
    if case == "scout":
        config = transformers.Llama4TextConfig(**SCOUT)
    elif case in BUILT:
        kind, fields, slots, _ = BUILT[case]
        config = transformers.AutoConfig.for_model(kind, **fields)
    else:
        config = transformers.AutoConfig.for_model("llama", **LLAMA_2_7B)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()
    model.generation_config.eos_token_id = None
    if slots is not None:
        model.generation_config.cache_implementation = "static"
        model.generation_config.max_cache_len = slots
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
        prompt = 16384 if case == "scout" else BUILT[case][3] if case in BUILT else 512
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
                prefill_flops=row.prefill.flops, prefill_skipped=row.prefill.skipped_flops,
                first_step_ms=round(first.seconds * 1e3, 4), first_compute_ms=round(first.compute_s * 1e3, 4),
                first_memory_ms=round(first.memory_s * 1e3, 4), last_step_ms=round(last.seconds * 1e3, 4),
                tokens_per_s_per_sequence=round(row.tokens_per_s_per_sequence or 0.0, 2),
                tokens_per_s=round(row.tokens_per_s or 0.0, 1), ttft_ms=round(row.ttft_s * 1e3, 3),
                cache_gb_per_sequence=round(result.kv_bytes_per_sequence / 1e9, 4), max_batch=result.max_batch,
                cpu_s=round(cpu, 2))))


if __name__ == "__main__":
    main()
