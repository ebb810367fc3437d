"""CPU seconds of the test suite, per test file and per test: where `make test`'s time goes.

Runs pytest in this process, one test at a time (no xdist), with one torch thread as each xdist
worker has, and books for each test (setup + call + teardown) the CPU time of this process and of
the child processes it waited for (subprocess tests). CPU time, unlike wall time, stays comparable
while other jobs load the machine. Extra arguments go to pytest.

    OMP_NUM_THREADS=1 python benchmarks/suite_cpu.py -m "not serial"          # the main suite
    OMP_NUM_THREADS=1 python benchmarks/suite_cpu.py tests/cli -m "not serial" --top 10
    OMP_NUM_THREADS=1 python benchmarks/suite_cpu.py -m "not serial" --json cpu.json   # every test's figures

A session-scoped server a test starts (tests/_cli_server.py's fork servers) is waited for at the
session's end: its CPU, and its children's, counts in the total but in no test's row.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from collections import Counter
from typing import Any, Dict, Generator, List, Tuple

import pytest


def _cpu() -> Tuple[float, float]:
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time(), children.ru_utime + children.ru_stime


class Recorder:
    """A pytest plugin: (own CPU s, children's CPU s) per test node id."""

    def __init__(self) -> None:
        self.rows: Dict[str, Tuple[float, float]] = {}

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: Any, nextitem: Any) -> Generator[None, None, None]:
        own, children = _cpu()
        yield
        own_after, children_after = _cpu()
        self.rows[item.nodeid] = (own_after - own, children_after - children)


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--top", type=int, default=25, help="how many files and tests to print (default 25)")
    parser.add_argument("--json", metavar="PATH", help="also write every test's (own, children's) CPU seconds to PATH")
    ours, pytest_args = parser.parse_known_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)
    recorder = Recorder()
    start_wall, (start_own, start_children) = time.perf_counter(), _cpu()
    code = pytest.main(["-q", "-p", "no:cacheprovider", *pytest_args], plugins=[recorder])
    wall = time.perf_counter() - start_wall
    own, children = (a - b for a, b in zip(_cpu(), (start_own, start_children)))
    rows = recorder.rows
    if ours.json:
        with open(ours.json, "w") as out:
            json.dump({"wall_s": wall, "cpu_s": own + children, "tests": rows}, out, indent=0)
    per_file: Counter = Counter()
    for node, (mine, theirs) in rows.items():
        per_file[node.split("::")[0]] += mine + theirs
    booked = sum(per_file.values())
    print(f"\n{len(rows)} tests; wall {wall:.1f} s; CPU {own + children:.1f} s (this process {own:.1f} s, children "
          f"{children:.1f} s), {booked:.1f} s of it inside tests; load average now {os.getloadavg()[0]:.2f}")
    print(f"\nCPU s per file (top {ours.top}):")
    for name, seconds in per_file.most_common(ours.top):
        print(f"{seconds:8.2f}  {name}")
    print(f"\nCPU s per test (top {ours.top}; own + children):")
    ranked = sorted(rows.items(), key=lambda kv: -(kv[1][0] + kv[1][1]))
    for node, (mine, theirs) in ranked[: ours.top]:
        print(f"{mine + theirs:8.2f}  ({mine:.2f} + {theirs:.2f})  {node}")
    return int(code)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
