"""What the "left as found" guard costs a reading (branch asfound): ``core.state.left_as_found``
on ResNet-50's and GPT-2 small's modules (read every module class's Python data and the globals
their code names, then compare and set back), CPU time of this thread per reading; the class
facts cached per class (``_NAMED_GLOBALS``) are warm, as from a process's second count on.

    PYTHONPATH=. .venv/bin/python benchmarks/left_as_found_cost.py [--rounds 200]
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path
from typing import List

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402
from bench_fastpath import CASES  # noqa: E402

from flopcount.core.state import left_as_found  # noqa: E402

warnings.simplefilter("ignore")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args()
    with open("/proc/loadavg") as f:
        print("load at start", " ".join(f.read().split()[:3]))
    print("| model | modules | classes read | median us (p25) |")
    print("|---|---|---|---|")
    for label in ("ResNet-50 1x3x224x224", "GPT-2 small 1x256"):
        model, _ = CASES[label]()
        modules = list(model.modules())
        with left_as_found(modules) as found:  # warms the per-class caches
            classes = len(found._classes)
        spent: List[float] = []
        for _ in range(args.rounds):
            start = time.thread_time()
            with left_as_found(modules):
                pass
            spent.append(time.thread_time() - start)
        spent.sort()
        median, p25 = spent[len(spent) // 2] * 1e6, spent[len(spent) // 4] * 1e6
        print(f"| {label} | {len(modules)} | {classes} | {median:.0f} ({p25:.0f}) |")
    with open("/proc/loadavg") as f:
        print("load at the end", " ".join(f.read().split()[:3]))


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
