"""What following shape-decided values costs a meta count (flopcount/tracers/_values.py):
transformers' LLaMA-2-7B config on meta, 1 x 2048 tokens, count_flops with the value follower on
and off (off: the follower made a no-op), alternating, 4 runs each after a warm-up.

    PYTHONPATH=. .venv/bin/python benchmarks/known_values_overhead.py
"""

from __future__ import annotations

import time
from typing import Dict, List

import torch
import transformers

import flopcount
from flopcount.tracers.fake import values as _values


def main() -> None:
    config = transformers.AutoConfig.for_model(
        "llama", hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=32, vocab_size=32000, use_cache=False,
    )
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config).eval()
    ids = torch.zeros(1, 2048, dtype=torch.long, device="meta")
    flopcount.count_flops(model, ids)  # warm-up
    follow = _values.KnownValues.note
    times: Dict[str, List[float]] = {"on": [], "off": []}
    complete: Dict[str, bool] = {}
    try:
        for index in range(8):
            mode = "on" if index % 2 == 0 else "off"
            _values.KnownValues.note = follow if mode == "on" else (lambda self, *args: None)  # type: ignore[method-assign]
            start = time.perf_counter()
            result = flopcount.count_flops(model, ids)
            times[mode].append(time.perf_counter() - start)
            complete[mode] = result.complete
    finally:
        _values.KnownValues.note = follow  # type: ignore[method-assign]
    for mode, values in times.items():
        ordered = sorted(values)
        print(f"follower {mode}: median {(ordered[1] + ordered[2]) / 2:.3f} s, min {ordered[0]:.3f} s, complete={complete[mode]}")


if __name__ == "__main__":
    main()
