"""The layer replay on a stack whose layers each hold a functools.partial activation (Gemma,
Starcoder2: transformers' GELUTanh): estimate_memory and plan of a 28-layer tiny Gemma, CPU
seconds (median of 3) and a figure of each. Run on two trees in turn (docs/performance.md,
"gemmareplay"): ``PYTHONPATH=TREE python benchmarks/replay_partials.py``."""

from __future__ import annotations

import time
import warnings
from typing import Any, Callable, List

import torch

import flopcount


def _median_cpu(call: Callable[[], Any]) -> tuple:
    times: List[float] = []
    result = None
    for _ in range(3):
        start = time.process_time()
        result = call()
        times.append(time.process_time() - start)
    return sorted(times)[1], result


def main() -> None:
    from transformers import GemmaConfig, GemmaForCausalLM

    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    config = GemmaConfig(num_hidden_layers=28, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=16, vocab_size=256, use_cache=False)
    torch.manual_seed(0)
    model = GemmaForCausalLM(config)
    ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(1))
    kwargs = {"input_ids": ids, "labels": ids}
    seconds, estimate = _median_cpu(lambda: flopcount.estimate_memory(model, (), kwargs, backward=True, optimizer="adamw"))
    print(f"{flopcount.__file__}\n  estimate_memory {seconds:.2f} s CPU (median of 3), peak {estimate.peak_bytes} B")
    seconds, planned = _median_cpu(
        lambda: flopcount.plan(lambda: GemmaForCausalLM(config), (), kwargs, on="h100", fsdp=4, optimizer="adamw")
    )
    print(f"  plan(fsdp=4) {seconds:.2f} s CPU (median of 3), forward MACs {planned.macs['forward']}")


if __name__ == "__main__":
    main()
