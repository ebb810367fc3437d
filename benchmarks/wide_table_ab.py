"""Paired A/B of the text tables' wide-character layout (branch gatefollow): a module table of
``--rows`` rows (ASCII names, as nearly every model has, and the same with one CJK character in
each name) laid out by tabulate directly (the parent's ``grid``) and through
``report.table.text_table``, the two alternated in one process, CPU time
(``time.process_time``), minimum and median per table.

    PYTHONPATH=. python benchmarks/wide_table_ab.py [--rounds 15] [--rows 2000]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any, Callable, Dict, List, Sequence

from tabulate import tabulate

from flopcount.report.table import text_table

HEADERS = ["Module", "Type", "Params", "MACs", "FLOPs", "FLOPs %"]


def rows(n: int, name: str) -> List[List[Any]]:
    return [[f"model.layers.{i}.{name}", "Linear", "1.049 M", "4.295 G", "8.590 G", "0.1%"] for i in range(n)]


def parent(table: Sequence[Sequence[Any]]) -> str:
    return tabulate(table, headers=HEADERS, tablefmt="simple")


def current(table: Sequence[Sequence[Any]]) -> str:
    return text_table(table, HEADERS, tablefmt="simple")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--rows", type=int, default=2000)
    args = parser.parse_args()
    for label, table in (("ascii", rows(args.rows, "mlp.up_proj")), ("cjk", rows(args.rows, "层.up_proj"))):
        times: Dict[str, List[float]] = {"parent": [], "current": []}
        ways: Dict[str, Callable[[Sequence[Sequence[Any]]], str]] = {"parent": parent, "current": current}
        for _ in range(args.rounds):
            for name, way in ways.items():
                start = time.process_time()
                way(table)
                times[name].append(time.process_time() - start)
        for name, seen in times.items():
            print(f"{label:5s} {name:7s} min {min(seen) * 1e3:7.1f} ms  median {statistics.median(seen) * 1e3:7.1f} ms")


if __name__ == "__main__":
    main()
