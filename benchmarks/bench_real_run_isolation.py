"""What the real-run tracers' isolation costs (issue #29 items 18 and 20), on GPT-2 small (config
only, random weights, CPU, eval) at 1 x 128 tokens:

1. ``private_twin(model, facts)``: the private twin (facts read beforehand, as a count has them) a real run (dispatch, jit, auto's fallback) runs on;
2. one plain forward under ``torch.no_grad()``, bare and inside ``PrivateRandom`` (the dispatch
   mode that moves random ops to private generators): the mode's per-op cost;
3. for scale, ``count_flops(model, ids, tracer="dispatch")`` as a whole.

Interleaved rounds (benchmarks/_interleave.py), medians.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_real_run_isolation.py [--repeats 7] [--tokens 128]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--tokens", type=int, default=128)
    options = parser.parse_args()

    import torch
    from _interleave import median, rounds
    from transformers import GPT2Config, GPT2LMHeadModel

    from flopcount import count_flops
    from flopcount.core.model_facts import model_facts
    from flopcount.core.state import PrivateRandom
    from flopcount.tracers._twin import private_twin

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config()).eval()
    ids = torch.randint(0, 50257, (1, options.tokens))
    modules = sum(1 for _ in model.modules())
    facts = model_facts(model)

    def plain() -> None:
        with torch.no_grad():
            model(ids)

    def under_private_random() -> None:
        with torch.no_grad(), PrivateRandom():
            model(ids)

    fns = {
        "private_twin": lambda: private_twin(model, facts),
        "forward": plain,
        "forward+PrivateRandom": under_private_random,
        "count_flops dispatch": lambda: count_flops(model, ids, tracer="dispatch"),
    }
    times, failures = rounds(fns, options.repeats)
    print(f"GPT-2 small ({modules} modules), 1 x {options.tokens} tokens, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, {options.repeats} interleaved rounds (median)")
    for name in fns:
        value = median(times[name])
        print(f"  {name:<24} {failures[name] if value is None else f'{value * 1e3:9.2f} ms'}")
    base, moded = median(times["forward"]), median(times["forward+PrivateRandom"])
    if base and moded:
        print(f"  PrivateRandom adds {100 * (moded / base - 1):+.1f} % to a plain forward")


if __name__ == "__main__":
    main()
