"""serve's time-to-first-token bound with and without a chunked prefill: LLaMA-2-7B's shapes (or
Mistral-7B's, ``--model mistral-7b``: a sliding window of 4,096 on every layer; Gemma-2-9B's,
``--model gemma-2-9b``, and GPT-OSS-20B's, ``--model gpt-oss-20b``: sliding and full layers
alternating, eager attention, which transformers runs them with) in bfloat16 on an H100 SXM, built on meta (no download), batch 1, 8 new tokens, at each prompt length, prefilled in
one forward and in chunks (``generation_config.prefill_chunk_size``, as ``generate()`` reads it;
serve has no flag of its own). One JSON line per run: the prefill's counted FLOPs, its attention
FLOPs, the FLOPs the bound leaves out (``skipped``: the scores outside the causal or windowed mask
a kernel need not compute), the bound and its terms, and the count's CPU time.

    PYTHONPATH=. .venv/bin/python benchmarks/serve_chunked.py [--prompt 8192 32768] [--chunk 2048]
        [--model llama-2-7b|mistral-7b|gemma-2-9b|gpt-oss-20b]

A tree without the rule (the parent) prices later chunks in full; with it, chunk after chunk the
attention priced is the prompt's one P(P + 1)/2 triangle, as the one-forward prefill's. Mistral-7B:
before branch servewindow every attention whose window ends inside the prompt was priced in full;
with it, at the window's band, W(W + 1)/2 + (P - W) W scores per head and layer, chunked or not.
Gemma-2-9B and GPT-OSS-20B: before branch serveeager their eager attention (two matmuls and
elementwise ops over the scores) was priced over the whole P x P square; with it, at the same band
and triangle.
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

# meta-llama/Llama-2-7b-hf's config.json, with positions for a 32k prompt
LLAMA_2_7B = dict(num_hidden_layers=32, hidden_size=4096, num_attention_heads=32, num_key_value_heads=32,
                  intermediate_size=11008, vocab_size=32000, max_position_embeddings=32768)
# mistralai/Mistral-7B-v0.1's config.json
MISTRAL_7B = dict(num_hidden_layers=32, hidden_size=4096, num_attention_heads=32, num_key_value_heads=8,
                  intermediate_size=14336, vocab_size=32000, sliding_window=4096, max_position_embeddings=32768)
# google/gemma-2-9b's config.json, with positions for a 32k prompt
GEMMA_2_9B = dict(num_hidden_layers=42, hidden_size=3584, num_attention_heads=16, num_key_value_heads=8, head_dim=256,
                  intermediate_size=14336, vocab_size=256000, sliding_window=4096, query_pre_attn_scalar=256,
                  attn_logit_softcapping=50.0, final_logit_softcapping=30.0, max_position_embeddings=32768,
                  attn_implementation="eager")
# openai/gpt-oss-20b's config.json (its experts priced in bf16, not MXFP4)
GPT_OSS_20B = dict(num_hidden_layers=24, hidden_size=2880, num_attention_heads=64, num_key_value_heads=8, head_dim=64,
                   intermediate_size=2880, num_local_experts=32, num_experts_per_tok=4, vocab_size=201088,
                   sliding_window=128, max_position_embeddings=131072, attn_implementation="eager")
MODELS = {"llama-2-7b": ("llama", LLAMA_2_7B), "mistral-7b": ("mistral", MISTRAL_7B),
          "gemma-2-9b": ("gemma2", GEMMA_2_9B), "gpt-oss-20b": ("gpt_oss", GPT_OSS_20B)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompt", type=int, nargs="+", default=[8192, 32768])
    parser.add_argument("--chunk", type=int, default=2048)
    parser.add_argument("--model", choices=sorted(MODELS), default="llama-2-7b")
    args = parser.parse_args()

    import torch
    import transformers

    from flopcount.devices import named_roofs
    from flopcount.serving import serve_facts, serve_on

    warnings.filterwarnings("ignore")
    model_type, shapes = MODELS[args.model]
    config = transformers.AutoConfig.for_model(model_type, **shapes)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()
    model.generation_config.eos_token_id = None
    for prompt in args.prompt:
        for chunk in (None, args.chunk):
            model.generation_config.prefill_chunk_size = chunk
            started = time.process_time()
            facts = serve_facts(model, torch.zeros(1, prompt, dtype=torch.int64, device="meta"), 8)
            cpu = time.process_time() - started
            row = serve_on(facts, named_roofs("h100"), "H100 SXM", None, "", batch=[1], dtype="bfloat16").at(1)
            prefill = row.prefill
            print(json.dumps(dict(model=args.model, prompt=prompt, chunk=chunk, flops=prefill.flops,
                                  attention=prefill.attention_flops,
                                  skipped=prefill.skipped_flops, ttft_ms=round(row.ttft_s * 1e3, 3),
                                  compute_ms=round(prefill.compute_s * 1e3, 3), memory_ms=round(prefill.memory_s * 1e3, 3),
                                  cpu_s=round(cpu, 2))))


if __name__ == "__main__":
    main()
