"""serve's bounds for a padded batch of prompts: LLaMA-2-7B (its published config.json shapes, on
meta), 8 prompts left-padded to 2,048 positions with real lengths 512..2,048 (evenly spaced), the
attention mask given on the CPU (its values prove each sequence's tokens), bfloat16 on an H100
SXM, tp 1, 128 new tokens. One JSON line per batch priced: the prefill's counted and skipped FLOPs
and the time-to-first-token bound, the first and last decode steps' bounds, the tokens/s ceilings,
the cache per sequence, the largest batch that fits the part's 80 GB less 10 %, and the count's
CPU time.

    PYTHONPATH=. .venv/bin/python benchmarks/serve_padded.py [--batch 8 64] [--new 128] [--side left|right]
        [--model llama2|mistral|gemma2] [--mask cpu|meta|lengths] [--static S] [--chunk C]

A tree without branch servepad's rule prices the padded batch as transformers computes it: every
token-wise op over 8 x 2,048 positions, each attention over the whole 2,048 x 2,048 square (an
explicit mask), each decode step over 2,048 + s keys per sequence and its cache read over them;
with it, each sequence's real tokens (the prefill of each alone, each step at its own positions).

Branch servepad2: ``--model mistral`` (Mistral-7B, sliding window 4,096) and ``--model gemma2``
(Gemma-2-9B, eager, its sliding layers' window 4,096): before, a padded batch's decode steps over a
cache with a sliding layer were priced over every key handed and the pads' cache bytes; ``--mask
meta`` gives the mask on the meta device (no values: priced in full, as before and after), ``--mask
lengths`` states the rows' real lengths instead (``serve_facts(prompt_lengths=)``, new); ``--static
S`` (a static cache of S slots: its steps were priced over all S slots of every row) and ``--chunk C``
(``prefill_chunk_size``: the chunked prefill was priced in full, pads included) were priced so before.
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
MODELS = {"llama2": ("llama", LLAMA_2_7B), "mistral": ("mistral", MISTRAL_7B), "gemma2": ("gemma2", GEMMA_2_9B)}
PROMPT, SHORTEST, ROWS = 2048, 512, 8


def lengths() -> list:  # type: ignore[type-arg]
    """The real lengths: ROWS evenly spaced from SHORTEST to PROMPT, rounded."""
    return [round(SHORTEST + (PROMPT - SHORTEST) * k / (ROWS - 1)) for k in range(ROWS)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--new", type=int, default=128)
    parser.add_argument("--side", choices=("left", "right"), default="left")
    parser.add_argument("--model", choices=tuple(MODELS), default="llama2")
    parser.add_argument("--mask", choices=("cpu", "meta", "lengths"), default="cpu")
    parser.add_argument("--static", type=int, default=None, metavar="S", help="a static cache of S slots")
    parser.add_argument("--chunk", type=int, default=None, metavar="C", help="prefill_chunk_size")
    args = parser.parse_args()

    import torch
    import transformers

    from flopcount.devices import find_part, named_roofs
    from flopcount.serving import serve_facts, serve_on

    warnings.filterwarnings("ignore")
    model_type, shapes = MODELS[args.model]
    config = transformers.AutoConfig.for_model(model_type, **shapes)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()
    model.generation_config.eos_token_id = None
    if args.static:
        model.generation_config.cache_implementation, model.generation_config.max_cache_len = "static", args.static
    model.generation_config.prefill_chunk_size = args.chunk
    mask = torch.zeros(ROWS, PROMPT, dtype=torch.int64)
    for row, length in enumerate(lengths()):  # the real tokens after the pads (left) or before them (right)
        start = PROMPT - length if args.side == "left" else 0
        mask[row, start:start + length] = 1
    part = find_part("h100")
    assert part is not None
    started = time.process_time()
    ids = torch.zeros(ROWS, PROMPT, dtype=torch.int64, device="meta")
    if args.mask == "lengths":
        assert args.side == "left", "prompt_lengths states left-padded rows"
        facts = serve_facts(model, ids, args.new, prompt_lengths=lengths())
    else:
        facts = serve_facts(model, ids, args.new, kwargs={"attention_mask": mask.to(args.mask)})
    cpu = time.process_time() - started
    result = serve_on(facts, named_roofs("h100"), part.name, float(part.memory_bytes), part.links[0],
                      batch=args.batch, dtype="bfloat16")
    for row in result.batches:
        first, last = row.first_step, row.last_step
        assert first is not None and last is not None
        print(json.dumps(dict(
            model=args.model, mask=args.mask, static=args.static, chunk=args.chunk, lengths=lengths(), side=args.side, prompt=PROMPT, new=args.new, batch=row.batch,
            prefill_flops=row.prefill.flops, prefill_skipped=row.prefill.skipped_flops,
            ttft_ms=round(row.ttft_s * 1e3, 3), ttft_compute_ms=round(row.prefill.compute_s * 1e3, 3),
            ttft_memory_ms=round(row.prefill.memory_s * 1e3, 3),
            first_step_ms=round(first.seconds * 1e3, 4), first_skipped=first.skipped_flops,
            last_step_ms=round(last.seconds * 1e3, 4),
            tokens_per_s_per_sequence=round(row.tokens_per_s_per_sequence or 0.0, 2),
            tokens_per_s=round(row.tokens_per_s or 0.0, 1),
            cache_gb_per_sequence=round(result.kv_bytes_per_sequence / 1e9, 4), max_batch=result.max_batch,
            cpu_s=round(cpu, 2))))


if __name__ == "__main__":
    main()
