"""How fast the CLI answers before any model work: ``flopcount --help``, ``--version`` and an
argument error, each as a fresh process (median of N runs), beside ``python -c "import torch"``
measured in the same run (what every command paid before torch was imported lazily).

    .venv/bin/python benchmarks/bench_cli_startup.py [--runs 7] [--checkout DIR]

``--checkout DIR`` times another checkout of flopcount (e.g. an older commit in a git
worktree) with the same interpreter, for a before/after in one run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

ROOT = Path(__file__).resolve().parents[1]

CASES = {
    "flopcount --help": ["-m", "flopcount", "--help"],
    "flopcount --version": ["-m", "flopcount", "--version"],
    "flopcount count --bogus (argument error)": ["-m", "flopcount", "count", "--bogus"],
    'python -c "import torch"': ["-c", "import torch"],
}


def _time(argv: List[str], checkout: Path, runs: int) -> float:
    env = dict(os.environ, PYTHONPATH=str(checkout))
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run([sys.executable, *argv], env=env, cwd=checkout, capture_output=True, check=False)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--checkout", type=Path, default=None, help="another flopcount checkout to time beside this one")
    args = parser.parse_args(argv)
    checkouts: Dict[str, Path] = {"this checkout": ROOT}
    if args.checkout is not None:
        checkouts["--checkout"] = args.checkout.resolve()
    print(f"median of {args.runs} fresh processes, seconds ({sys.executable})")
    print("| case | " + " | ".join(checkouts) + " |")
    print("|---|" + "---|" * len(checkouts))
    for label, case in CASES.items():
        cells = [f"{_time(case, path, args.runs):.3f}" for path in checkouts.values()]
        print(f"| {label} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
