"""One process's CPU times for papercuts5's paired timing (docs/performance.md): ``count_generation``
on meta of a 2-layer, 256-wide LLaMA (512-token prompt, 64 new tokens) and ``serve`` of it on the
H100 (the two readings that now set each module's own attributes back as found), and
``predict(...).table()`` of 8 x Linear(256, 256) + ReLU on 32 x 256 (the times now share one unit
per column); each the minimum of 3 calls after one warm-up, one torch thread. Prints the three
times in seconds, then the generation's FLOPs, serve's prefill FLOPs per sequence and the table's
length. Run it alternately on two trees:

    for r in 1 2 3 4 5 6 7 8; do for t in /tmp/parent /work/wt/papercuts5; do
        PYTHONPATH=$t OMP_NUM_THREADS=1 python benchmarks/papercuts5_time.py; done; done

``--snapshot`` times instead the attribute snapshot alone (``core.state.module_attributes_kept``,
branch only) over the 423 modules of a LLaMA-7B-sized model on meta: the minimum of 20.
"""

from __future__ import annotations

import sys
import time
from typing import Any, Callable, Tuple

import torch
import transformers

import flopcount


def best(run: Callable[[], Any], calls: int = 3) -> Tuple[float, Any]:
    run()
    times = []
    for _ in range(calls):
        start = time.process_time()
        result = run()
        times.append(time.process_time() - start)
    return min(times), result


def snapshot() -> None:
    from flopcount.core.state import module_attributes_kept

    with torch.device("meta"):
        llama = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model("llama")).eval()
    modules = list(llama.modules())

    def kept() -> None:
        with module_attributes_kept(modules):
            pass

    seconds, _ = best(kept, 20)
    print(f"{len(modules)} modules: {seconds * 1e3:.3f} ms")


def main() -> None:
    torch.set_num_threads(1)
    with torch.device("meta"):
        llama = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(
            "llama", hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2)).eval()
    ids = torch.zeros(1, 512, dtype=torch.int64, device="meta")
    mlp = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU()) for _ in range(8)])
    x = torch.randn(32, 256)
    g, rg = best(lambda: flopcount.count_generation(llama, ids, new_tokens=64))
    s, rs = best(lambda: flopcount.serve(llama, ids, 64, on="h100"))
    p, table = best(lambda: flopcount.predict(mlp, x, on="h100").table())
    print(f"{g:.4f} {s:.4f} {p:.5f} {rg.flops} {rs.facts.prefill.flops} {len(table)}")


if __name__ == "__main__":
    snapshot() if "--snapshot" in sys.argv else main()
