"""Interleaved timing shared by the benchmarks: every tool once per round, in turn, so a
slow phase of a noisy machine hits every tool alike; medians and per-round ratios."""

from __future__ import annotations

import gc
import statistics
import time
from typing import Any, Callable, Dict, List, Optional, Tuple


def rounds(
    fns: Dict[str, Callable[[], Any]], repeats: int, balanced: bool = False
) -> Tuple[Dict[str, Optional[List[float]]], Dict[str, str]]:
    """Each function once as warm-up (first-call costs are not per-model costs), then
    ``repeats`` rounds in turn: every wall time, ``None`` and a one-line reason for a
    function that raised. ``balanced``: the order changes from round to round (:func:`orders`)
    so that no tool always runs right after the same one: the call after a long, different
    workload (a peer's 100 ms forward, or a plain memset) pays for the CPU caches that work
    evicted, 1.3-4 ms of CPU on a 15 ms count (issue #32, realgap: benchmarks/count_after.py);
    in a fixed order the same tool pays it every round."""
    times: Dict[str, Optional[List[float]]] = {name: [] for name in fns}
    failures: Dict[str, str] = {}
    for name, fn in fns.items():
        try:
            fn()
        except Exception as exc:  # a peer's failure is a result too
            failures[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:90] if str(exc) else ''}"
            times[name] = None
    names = list(fns)
    turns = orders(len(names)) if balanced else [list(range(len(names)))]
    for turn in range(repeats):
        for name in (names[i] for i in turns[turn % len(turns)]):
            fn = fns[name]
            if name in failures:
                continue
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)  # type: ignore[union-attr]
    return times, failures


def orders(n: int) -> List[List[int]]:
    """A Williams design: ``n`` orders of ``range(n)`` (``2n`` when ``n`` is odd) in which each
    index comes right after each other index equally often (once for even ``n``). The first is
    0, 1, n-1, 2, n-2, ...; each next one adds 1 modulo ``n``; odd ``n`` adds the reversed rows."""
    first, low, high = [0], 1, n - 1
    while len(first) < n:
        first.append(low)
        low += 1
        if len(first) < n:
            first.append(high)
            high -= 1
    rows = [[(i + shift) % n for i in first] for shift in range(n)]
    return rows + [row[::-1] for row in rows] if n % 2 else rows


def median(values: Optional[List[float]]) -> Optional[float]:
    return statistics.median(values) if values else None


def ratio(times: Dict[str, Optional[List[float]]], a: str, b: str) -> Optional[float]:
    """Median over rounds of time(a) / time(b)."""
    ta, tb = times.get(a), times.get(b)
    if not ta or not tb:
        return None
    return statistics.median(x / y for x, y in zip(ta, tb))


def paired_cpu(sides: Dict[str, Callable[[], Any]], rounds: int, per: int) -> Tuple[Dict[str, List[float]], List[float]]:
    """Two sides (``"base"`` and ``"this"``) paired: each round runs one side ``per`` times and
    then the other, in an order that alternates from round to round, with the garbage collector
    off; CPU time of the calling thread. Every time per side, and each round's ratio of the two
    sides' medians (this / base)."""
    spent: Dict[str, List[float]] = {"base": [], "this": []}
    ratios: List[float] = []
    gc.collect()
    gc.disable()
    try:
        for turn in range(rounds):
            medians: Dict[str, float] = {}
            for side in ("base", "this") if turn % 2 == 0 else ("this", "base"):
                times = []
                for _ in range(per):
                    start = time.thread_time()
                    sides[side]()
                    times.append(time.thread_time() - start)
                spent[side] += times
                medians[side] = statistics.median(times)
            ratios.append(medians["this"] / medians["base"])
    finally:
        gc.enable()
    return spent, ratios
