"""The real-run paths' CPU time (issue #27, branch onerule: their setup in tracers/_real_run.py):
``count_flops`` with tracer "dispatch" and "jit" on GPT-2 small (config only, random weights, eval,
1 x 32 tokens), and ``count_generation`` on a 2-layer LLaMA (2 x 6 prompt, 8 new tokens: its decode
steps 3..5 are fed in one uncounted forward, the catch-up), each as a ratio to a plain no-grad
forward of the same model in the same process. One thread, process CPU time, rounds in turn after a
warm-up call of each, medians: run it alternately on two trees to compare them.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_real_run_paths.py [--repeats 9]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9)
    options = parser.parse_args()

    import torch
    import transformers

    from flopcount import count_flops, count_generation

    torch.set_num_threads(1)
    torch.manual_seed(0)
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config()).eval()
    ids = torch.randint(0, 50257, (1, 32))
    config = transformers.AutoConfig.for_model(
        "llama", hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, vocab_size=50, max_position_embeddings=256,
    )
    llama = transformers.AutoModelForCausalLM.from_config(config).eval()
    llama.generation_config.eos_token_id = None
    prompt = torch.randint(0, 50, (2, 6))

    def forward(model: torch.nn.Module, inputs: torch.Tensor) -> None:
        with torch.no_grad():
            model(inputs)

    fns: Dict[str, Callable[[], object]] = {
        "gpt2 forward": lambda: forward(gpt2, ids),
        "gpt2 count_flops dispatch": lambda: count_flops(gpt2, ids, tracer="dispatch"),
        "gpt2 count_flops jit": lambda: count_flops(gpt2, ids, tracer="jit"),
        "llama forward": lambda: forward(llama, prompt),
        "llama count_generation N=8": lambda: count_generation(llama, prompt, new_tokens=8),
    }
    times: Dict[str, List[float]] = {name: [] for name in fns}
    for fn in fns.values():
        fn()  # warm-up: first-call costs are not per-count costs
    for _ in range(options.repeats):
        for name, fn in fns.items():
            start = time.process_time()
            fn()
            times[name].append(time.process_time() - start)
    medians = {name: statistics.median(values) for name, values in times.items()}
    print(f"torch {torch.__version__}, 1 thread, {options.repeats} rounds (median process CPU time)")
    for name, value in medians.items():
        base = medians["gpt2 forward"] if name.startswith("gpt2") else medians["llama forward"]
        print(f"  {name:<28} {value * 1e3:8.1f} ms  {value / base:6.2f}x its forward")


if __name__ == "__main__":
    main()
