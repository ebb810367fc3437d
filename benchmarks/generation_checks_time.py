"""One process's CPU times for papercuts4's paired timing (docs/performance.md): ``count_generation`` on
meta of a 2-layer, 256-wide GPT-2 and LLaMA (512-token prompt, 64 new tokens), and ``count_flops`` of 8 x
Linear(256, 256) + ReLU on 32 x 256; each the minimum of 3 calls after one warm-up, one torch thread.
Prints the three times in seconds, then the three FLOP counts. Run it alternately on two trees:

    for r in 1 2 3 4 5 6 7 8; do for t in /tmp/parent /work/wt/papercuts4; do
        PYTHONPATH=$t OMP_NUM_THREADS=1 python benchmarks/generation_checks_time.py; done; done
"""

from __future__ import annotations

import time
from typing import Any, Callable, Tuple

import torch
import transformers

import flopcount


def best(run: Callable[[], Any]) -> Tuple[float, Any]:
    run()
    times = []
    for _ in range(3):
        start = time.process_time()
        result = run()
        times.append(time.process_time() - start)
    return min(times), result


def main() -> None:
    torch.set_num_threads(1)
    with torch.device("meta"):
        gpt = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=2, n_embd=256, n_head=4, n_positions=1024)).eval()
        llama = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(
            "llama", hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2)).eval()
    ids = torch.zeros(1, 512, dtype=torch.int64, device="meta")
    mlp = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU()) for _ in range(8)])
    x = torch.randn(32, 256)
    g, rg = best(lambda: flopcount.count_generation(gpt, ids, new_tokens=64))
    ll, rl = best(lambda: flopcount.count_generation(llama, ids, new_tokens=64))
    c, rc = best(lambda: flopcount.count_flops(mlp, x))
    print(f"{g:.4f} {ll:.4f} {c:.5f} {rg.flops} {rl.flops} {rc.flops}")


if __name__ == "__main__":
    main()
