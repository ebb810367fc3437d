"""CPU seconds of ``estimate_memory`` (an AdamW training step) and ``plan(fsdp=2)`` on stacks of
sliding and full attention in turn (issue #32, helper periodreplay): a tiny 26-layer Gemma-2, a
tiny 24-layer GPT-OSS, and a 46-layer Gemma-2-27B-shaped model on the meta device; a tiny 24-layer
LLaMA (identical layers, replayed before too) as the control. Run it with
``PYTHONPATH`` at the tree to time (the one before periodreplay and the one after, in turn: the
machine is noisy); prints the median of ``--repeat`` calls' ``time.process_time`` after one
warm-up call, the peak the reading gives (equal in both trees) and the load average::

    PYTHONPATH=. python benchmarks/replay_periods_timing.py --model gemma2-26 --reading estimate [--repeat 3]
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from typing import Any, Callable, Dict, List, Optional

import torch
from torch import nn

import flopcount

TINY = {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 128,
        "vocab_size": 128, "max_position_embeddings": 64, "sliding_window": 8}
#: Gemma-2-27B's shapes (its config.json), the layers and all
GEMMA2_27B = {"hidden_size": 4608, "num_attention_heads": 32, "num_key_value_heads": 16, "head_dim": 128,
              "intermediate_size": 36864, "vocab_size": 256000, "max_position_embeddings": 8192, "sliding_window": 4096,
              "query_pre_attn_scalar": 144}
MODELS: Dict[str, Any] = {
    "gemma2-26": ("gemma2", 26, TINY, None, 12),
    "gpt_oss-24": ("gpt_oss", 24, {**TINY, "num_local_experts": 4, "num_experts_per_tok": 2}, None, 12),
    "gemma2-27b-46": ("gemma2", 46, GEMMA2_27B, "meta", 256),
    # identical layers (period 1, replayed before too): its time should not move
    "llama-24": ("llama", 24, {key: value for key, value in TINY.items() if key != "sliding_window"}, None, 12),
}


def builder(name: str) -> Callable[[], nn.Module]:
    from transformers import AutoConfig, AutoModelForCausalLM

    model_type, layers, sizes, device, _ = MODELS[name]

    def build() -> nn.Module:
        config = AutoConfig.for_model(model_type, num_hidden_layers=layers, use_cache=False, **sizes)
        torch.manual_seed(0)
        with torch.device(device or "cpu"):
            return AutoModelForCausalLM.from_config(config).train()

    return build


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=list(MODELS), required=True)
    parser.add_argument("--reading", choices=["estimate", "plan"], required=True)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    build = builder(args.model)
    _, _, _, device, tokens = MODELS[args.model]
    ids = torch.randint(0, 128, (2, tokens), generator=torch.Generator().manual_seed(1))
    if device:
        ids = ids.to(device)
    if args.reading == "estimate":
        model = build()

        def reading() -> int:
            return flopcount.estimate_memory(model, (ids,), backward=True, optimizer="adamw").peak_bytes
    else:
        def reading() -> int:
            return flopcount.plan(build, (ids,), fsdp=2).peak_bytes

    peak = reading()  # warm-up
    seconds = []
    for _ in range(args.repeat):
        start = time.process_time()
        reading()
        seconds.append(time.process_time() - start)
    load = open("/proc/loadavg").read().split()[:3]
    print(f"{args.model} {args.reading}: {statistics.median(seconds):.2f} s CPU (median of {args.repeat}: "
          f"{', '.join(f'{s:.2f}' for s in seconds)}), peak {peak:,} B, load {' '.join(load)}", flush=True)


if __name__ == "__main__":
    main()
