"""What a default count costs right after other work (issue #32, realgap): the CPU time of
``count_flops`` on real weights when the call before it was another count (warm), or
``FlopCounterMode`` on the meta copy, or a plain forward of the meta copy, or a loop over a big
Python list, or a 64 MiB memset (no Python code, no torch: it only evicts the CPU caches).

bench_reuse's fixed order ran the real-weights column right after ``FlopCounterMode`` in every
round: the 1.5-4 ms this script shows after any of the last four is what read as a cost of real
weights. The meta copy's count pays the same after the same work (``--meta``).

    PYTHONPATH=. .venv/bin/python benchmarks/count_after.py [--repeats 15] [--only resnet50,gpt2] [--meta]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Dict, List

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from bench_fastpath import CASES  # noqa: E402
from bench_reuse import meta_copy  # noqa: E402

from flopcount import count_flops  # noqa: E402

warnings.simplefilter("ignore")
SHORT = {"resnet50": "ResNet-50 1x3x224x224", "bert": "BERT-base 1x128", "gpt2": "GPT-2 small 1x256"}


def _before(model: Any, inputs: Any) -> Dict[str, Callable[[], Any]]:
    """The work each count follows, by name."""
    from torch.utils.flop_counter import FlopCounterMode

    numbers = list(range(4_000_000))  # ~150 MB of int objects and the list's pointers
    block = bytearray(64 << 20)

    def flop_counter_mode() -> None:
        with FlopCounterMode(display=False), torch.no_grad():
            model(*inputs)

    def plain() -> None:
        with torch.no_grad():
            model(*inputs)

    def python_loop() -> None:
        total = 0
        for n in numbers:
            total += n

    def memset() -> None:
        block[:] = bytes(len(block))

    return {"another count (warm)": lambda: None, "FlopCounterMode, meta copy": flop_counter_mode,
            "plain forward, meta copy": plain, "a loop over 4 M ints": python_loop, "a 64 MiB memset": memset}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--only", default="resnet50,gpt2")
    parser.add_argument("--meta", action="store_true", help="count the meta copy instead of the real weights")
    args = parser.parse_args()
    torch.set_num_threads(1)
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    print(f"torch {torch.__version__}, 1 thread, CPU time of the counting thread, median of {args.repeats}, "
          f"load average {load} at start, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    for key in args.only.split(","):
        torch.manual_seed(0)
        model, inputs = CASES[SHORT[key]]()
        meta_model, meta_inputs = meta_copy(model, tuple(inputs))
        counted = (meta_model, meta_inputs) if args.meta else (model, tuple(inputs))
        before = _before(meta_model, meta_inputs)
        for fn in before.values():
            fn()
        count_flops(*counted)
        times: Dict[str, List[float]] = {name: [] for name in before}
        for _ in range(args.repeats):
            for name, fn in before.items():  # each kind of work in turn, a count after each
                fn()
                start = time.thread_time()
                count_flops(*counted)
                times[name].append(time.thread_time() - start)
        print(f"\n{SHORT[key]}, {'meta copy' if args.meta else 'real weights'}: the count right after")
        for name, spent in times.items():
            print(f"  {name:30s} {statistics.median(spent) * 1e3:6.1f} ms")


if __name__ == "__main__":
    main()
