"""Issue #27 (suite time through the product): the CPU seconds of one ``plan`` and one
``estimate_memory`` call on the test suite's tiny models, with a digest of every figure so that
two checkouts can be compared to the byte.

    OMP_NUM_THREADS=1 PYTHONPATH=. python benchmarks/bench_small_calls.py [--repeat 5] [--only plan|memory]

Models (tests/_layer_stacks.py's, batch 2 x 16 tokens): LLaMA (hidden 64, 2 and 7 layers), GPT-2
(hidden 64, 6 layers), and a two-Linear MLP (batch 8). Each case runs once to warm up, then
``--repeat`` times; the median and the lowest CPU seconds per call are printed (this process's
CPU time, the fairer figure on a loaded machine), with the replay on (``FLOPCOUNT_REUSE=1``)
and off. flopcount is imported from ``PYTHONPATH``: to compare two checkouts, run this file from
one with ``PYTHONPATH`` set to each, at the same time, and compare the digests.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Dict, List, Tuple

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the suite's model builders


def cases() -> List[Tuple[str, Callable[[], Any]]]:
    from _layer_stacks import gpt2, ids, llama

    import flopcount
    from flopcount.memory.estimate import estimate_memory

    def mlp() -> nn.Module:
        return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64))

    x, xm = ids(), torch.randn(8, 64, generator=torch.Generator().manual_seed(3))
    llama2, llama7, gpt, small = llama(intermediate_size=96, layers=2), llama(intermediate_size=96), gpt2(), mlp()
    return [
        ("plan llama-2L fsdp2 tp2", lambda: flopcount.plan(lambda: llama(layers=2), (x,), fsdp=2, tp=2, link="nvlink4")),
        ("plan llama-7L fsdp2 tp2", lambda: flopcount.plan(llama, (x,), fsdp=2, tp=2, link="nvlink4")),
        ("plan gpt2-6L fsdp2", lambda: flopcount.plan(gpt2, (x,), fsdp=2, link="nvlink4")),
        ("plan mlp one rank", lambda: flopcount.plan(mlp, (xm,))),
        ("memory llama-2L adamw", lambda: estimate_memory(llama2, (x,), backward=True, optimizer="adamw")),
        ("memory llama-7L adamw", lambda: estimate_memory(llama7, (x,), backward=True, optimizer="adamw")),
        ("memory gpt2-6L inference", lambda: estimate_memory(gpt, (x,))),
        ("memory mlp adamw", lambda: estimate_memory(small, (xm,), backward=True, optimizer="adamw")),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--only", choices=("plan", "memory"))
    options = parser.parse_args()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    import flopcount

    print(f"flopcount from {Path(flopcount.__file__).parent}; load {Path('/proc/loadavg').read_text().split()[:3]}")
    rows: Dict[str, Dict[str, Tuple[float, float, str]]] = {}
    for reuse in ("1", "0"):
        os.environ["FLOPCOUNT_REUSE"] = reuse
        for name, call in cases():
            if options.only and not name.startswith(options.only):
                continue
            digest = hashlib.sha256(repr(call()).encode()).hexdigest()[:12]  # warm-up, and every figure
            seconds = []
            for _ in range(options.repeat):
                start = time.process_time()
                call()
                seconds.append(time.process_time() - start)
            rows.setdefault(name, {})[reuse] = (statistics.median(seconds), min(seconds), digest)
    print(f"{'case':28} {'reuse on: median / min s':>26} {'reuse off: median / min s':>27}  digests (on, off)")
    for name, by in rows.items():
        on, off = by["1"], by["0"]
        print(f"{name:28} {on[0]:12.3f} / {on[1]:.3f}   {off[0]:12.3f} / {off[1]:.3f}    {on[2]} {off[2]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
