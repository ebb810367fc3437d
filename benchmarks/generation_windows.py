"""count_generation on caches that stop growing (issue #20), against the truth.

Small models (hidden 32, 2 layers, float32, CPU, eager attention): each decode step's MACs
against FlopCounterMode around every forward of a real greedy ``generate()`` (its FLOPs are
2 x the MACs), and the KV cache against the bytes of the storages the real cache holds.
Mistral-7B (transformers' default config: sliding window 4096) on meta, bf16, P = 3584,
N = 1024: decode MACs against the hand formula (linear weights + attention over
min(context, 4096) keys), the KV cache against 32 layers x keys and values x 8 KV heads x
128 x 2 bytes x 4096 positions held (4095 kept) + one int64 window per layer.

    .venv/bin/python benchmarks/generation_windows.py [--skip-7b]
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Dict, Tuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # the truth: tests/_live_oracles.py, as the tests take it

SMALL: Dict[str, Tuple[str, Dict[str, Any]]] = {
    "Mistral, window 16": ("mistral", {"sliding_window": 16}),
    "Gemma2 (local 16 / global)": ("gemma2", {"sliding_window": 16}),
    "Gemma3 (local 16 / global)": ("gemma3_text", {"sliding_window": 16, "layer_types": ["sliding_attention", "full_attention"]}),
}


def _small(kind: str, extra: Dict[str, Any]) -> Any:
    import torch
    import transformers

    config = transformers.AutoConfig.for_model(
        kind, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=8, vocab_size=50, max_position_embeddings=256, **extra)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    model.generation_config.eos_token_id = None
    return model


def small(prompt: int = 12, new_tokens: int = 24) -> None:
    import torch
    from _live_oracles import generate_truth, held_bytes

    from flopcount.generation.count import count_generation

    print(f"| model (B=2, P={prompt}, N={new_tokens}) | decode MACs | truth (FlopCounterMode / 2) | KV held | truth (real cache) | KV positions | traced steps |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for label, (kind, extra) in SMALL.items():
        model = _small(kind, extra)
        ids = torch.randint(0, 50, (2, prompt))
        result = count_generation(model, ids, new_tokens=new_tokens)
        flops, cache = generate_truth(model, ids, new_tokens)
        held = held_bytes(cache)
        shortcut = next((w.split(" were costed")[0].replace("decode steps ", "all but ") for w in result.warnings
                         if "affine continuation" in w), "all")
        print(f"| {label} | {result.decode_macs:,} | {sum(flops[1:]) // 2:,} | {result.kv_cache_bytes:,} B | {held:,} B | "
              f"{result.kv_cache_position_bytes:,} B | {shortcut} |")


def mistral_7b(prompt: int = 3584, new_tokens: int = 1024) -> None:
    import torch
    import transformers

    from flopcount.generation.count import count_generation

    config = transformers.AutoConfig.for_model("mistral")
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()
    started = time.perf_counter()
    result = count_generation(model, torch.zeros(1, prompt, dtype=torch.int64, device="meta"), new_tokens=new_tokens)
    wall = time.perf_counter() - started
    h, layers, heads, kv, hd = config.hidden_size, config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads, config.head_dim or 128
    window = config.sliding_window
    linear = layers * (h * heads * hd + 2 * h * kv * hd + heads * hd * h + 3 * h * config.intermediate_size) + h * config.vocab_size
    truth = sum(linear + layers * heads * 2 * hd * min(prompt + s + 1, window) for s in range(new_tokens - 1))
    held = layers * (2 * kv * hd * 2 * min(prompt + new_tokens - 1, window) + 8)
    print(f"Mistral-7B default config (window {window}), meta, bf16, B=1, P={prompt}, N={new_tokens}: {wall:.1f} s")
    print(f"  decode MACs {result.decode_macs:,} (hand formula {truth:,}); decode FLOPs {result.decode_flops:,}")
    print(f"  KV cache held {result.kv_cache_bytes:,} B (hand formula {held:,} B); positions kept {result.kv_cache_position_bytes:,} B")
    print(f"  {result.warnings[-1] if result.warnings else ''}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-7b", action="store_true")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    import transformers

    transformers.logging.set_verbosity_error()
    small()
    if not args.skip_7b:
        mistral_7b()


if __name__ == "__main__":
    main()
