"""`make bench`: every benchmark script in this folder, one after another, each in its own
process (so one tool's global state cannot touch the next). Exits 1 if any script failed.

    .venv/bin/python benchmarks/run_all.py [--quick]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCRIPTS = [
    ("bench_core.py", [], ["--repeats", "3"]),
    ("bench_dispatch.py", [], ["--repeats", "1"]),
    ("bench_latency.py", [], ["--budget", "0.5", "--rounds", "3"]),
    ("compare_peers.py", [], ["--repeats", "1"]),
    ("bench_memory.py", [], ["--quick"]),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats (a smoke run, not figures to record)")
    args = parser.parse_args()
    failed = []
    for script, full, quick in SCRIPTS:
        command = [sys.executable, str(HERE / script)] + (quick if args.quick else full)
        print(f"\n===== {' '.join(command[1:])}", flush=True)
        start = time.perf_counter()
        code = subprocess.call(command)
        print(f"===== {script}: exit {code} in {time.perf_counter() - start:.0f} s", flush=True)
        if code != 0:
            failed.append(script)
    if failed:
        print(f"FAILED: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
