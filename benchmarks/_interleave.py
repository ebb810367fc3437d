"""Interleaved timing shared by the benchmarks: every tool once per round, in turn, so a
slow phase of a noisy machine hits every tool alike; medians and per-round ratios."""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable, Dict, List, Optional, Tuple


def rounds(fns: Dict[str, Callable[[], Any]], repeats: int) -> Tuple[Dict[str, Optional[List[float]]], Dict[str, str]]:
    """Each function once as warm-up (first-call costs are not per-model costs), then
    ``repeats`` rounds in turn: every wall time, ``None`` and a one-line reason for a
    function that raised."""
    times: Dict[str, Optional[List[float]]] = {name: [] for name in fns}
    failures: Dict[str, str] = {}
    for name, fn in fns.items():
        try:
            fn()
        except Exception as exc:  # a peer's failure is a result too
            failures[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:90] if str(exc) else ''}"
            times[name] = None
    for _ in range(repeats):
        for name, fn in fns.items():
            if name in failures:
                continue
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)  # type: ignore[union-attr]
    return times, failures


def median(values: Optional[List[float]]) -> Optional[float]:
    return statistics.median(values) if values else None


def ratio(times: Dict[str, Optional[List[float]]], a: str, b: str) -> Optional[float]:
    """Median over rounds of time(a) / time(b)."""
    ta, tb = times.get(a), times.get(b)
    if not ta or not tb:
        return None
    return statistics.median(x / y for x, y in zip(ta, tb))
