"""Structural reuse is exact on the whole zoo (issue #32, "Exactness is the contract").

For every model of ``benchmarks/zoo.py`` (torchvision, the transformers architectures, the
torch.nn layers), count it twice with ``tracer="auto"``: with reuse off (``FLOPCOUNT_REUSE=0``,
every call traced) and on (the default). Do it on the model with real weights and on a copy
built on the meta device, which is how large models are counted and where most calls are
reused. Compare everything a user can read:

* ``to_dict()`` (totals, bytes, operators, modules with their aliases, phases, warnings);
* ``by_operator``, ``by_module``, ``by_module_and_operator`` and ``by_phase`` for flops, macs,
  count, bytes_read and bytes_written;
* each module's call count.

Also ``predict``'s ``to_dict()`` (its per-operator and per-module rows) and its bounds, on a fixed datasheet part
(T4: nothing measured). Prints one line per model that differs or fails, the number of calls
reused on the meta copy, and a summary. The exit status is 1 when any model differs.

    .venv-zoo/bin/python benchmarks/zoo_reuse.py --only torchvision
    .venv/bin/python benchmarks/zoo_reuse.py --only transformers
    .venv/bin/python benchmarks/zoo_reuse.py --only nn

``--off-eager``: the reuse-off count books its tables at once (as the default count did before
branch deferbook, which books them on first read), so each line also says that the tables
booked on first read are those booked at once.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import zoo  # noqa: E402

import flopcount  # noqa: E402

METRICS = ("flops", "macs", "count", "bytes_read", "bytes_written")


def _rows(result: Any) -> Dict[str, Any]:
    rows: Dict[str, Any] = {"dict": result.to_dict(), "calls": [(m.name, m.calls) for m in result.modules]}
    for metric in METRICS:
        rows[metric] = (result.by_operator(metric), result.by_module(metric), result.by_module_and_operator(metric),
                        result.by_phase(metric))
    return rows


def _predicted(result: Any) -> Dict[str, Any]:
    return {"dict": result.to_dict(), "eager": result.bound_s("eager"), "any": result.bound_s("any")}


def _with_reuse(on: bool, fn: Any) -> Any:
    saved = os.environ.get("FLOPCOUNT_REUSE")
    os.environ["FLOPCOUNT_REUSE"] = "1" if on else "0"
    try:
        with zoo.quiet():
            return fn()
    finally:
        if saved is None:
            del os.environ["FLOPCOUNT_REUSE"]
        else:
            os.environ["FLOPCOUNT_REUSE"] = saved


def _first_difference(a: Any, b: Any, where: str = "") -> str:
    if type(a) is not type(b):
        return f"{where}: {type(a).__name__} vs {type(b).__name__}"
    if isinstance(a, dict):
        for key in list(a) + [k for k in b if k not in a]:
            if key not in a or key not in b:
                return f"{where}.{key}: only {'off' if key in a else 'on'}"
            if a[key] != b[key]:
                return _first_difference(a[key], b[key], f"{where}.{key}")
        return f"{where}: key order"
    if isinstance(a, (list, tuple)) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            if x != y:
                return _first_difference(x, y, f"{where}[{i}]")
    return f"{where}: {str(a)[:80]} vs {str(b)[:80]}"


def compare(case: Any, device: Optional[str], predict: bool, eager_off: bool = False) -> Tuple[Optional[str], int]:
    """The first difference between reuse off and on (None: identical) and the calls reused."""
    model = zoo._build(case, device)
    args, kwargs = zoo._inputs_for(case, device=device)
    return compare_model(model, args, kwargs, predict=predict, eager_off=eager_off)


def _eager_count(model: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
    """``count_flops`` with its tables booked at once (``aggregate(deferred=False)``)."""
    from flopcount.core import analysis

    deferred = analysis.aggregate

    def aggregate(costed: Any, **options: Any) -> Any:
        return deferred(costed, **{**options, "deferred": False})

    analysis.aggregate = aggregate
    try:
        return flopcount.count_flops(model, args, kwargs=kwargs or None)
    finally:
        analysis.aggregate = deferred


def compare_model(model: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any], *, predict: bool,
                  results: Optional[Dict[str, Any]] = None, eager_off: bool = False) -> Tuple[Optional[str], int]:
    """``compare`` on a model already built: everything a user reads with reuse off and on
    (count, and predict on a T4 when ``predict``), the first difference (None: identical) and
    the calls the reuse-on count reused. ``results``, when given, receives the reuse-on
    ``count`` and ``predict`` results (benchmarks/zoo_reuse_timm.py checks them further).
    ``eager_off``: the reuse-off count's tables booked at once."""
    if eager_off:
        off_result = _with_reuse(False, lambda: _eager_count(model, args, kwargs))
    else:
        off_result = _with_reuse(False, lambda: flopcount.count_flops(model, args, kwargs=kwargs or None))
    try:  # counted with reuse off: an error with it on is a difference
        on_result = _with_reuse(True, lambda: flopcount.count_flops(model, args, kwargs=kwargs or None))
    except Exception as exc:
        return f"count raised with reuse on only: {zoo.first_line(exc)[:150]}", 0
    if results is not None:
        results["count"] = on_result
    off, on = _rows(off_result), _rows(on_result)
    if off != on:
        return "count " + _first_difference(off, on), 0
    if predict:
        bounds = [_with_reuse(flag, lambda: flopcount.predict(model, args, kwargs or None, on="T4")) for flag in (False, True)]
        if results is not None:
            results["predict"] = bounds[1]
        p_off, p_on = _predicted(bounds[0]), _predicted(bounds[1])
        if p_off != p_on:
            return "predict " + _first_difference(p_off, p_on), 0
    return None, on_result.reused_calls


class Tally:
    """The sweep's counts: one :meth:`run` per model and device, its line printed where it differs
    or fails (the zoo scripts of timm, diffusers/PyG and the transformers types use it too)."""

    def __init__(self, failure: str = "SKIP  ") -> None:
        self.failure = failure  # the word a failed model's line starts with
        self.same = self.differ = self.failed = self.reused_models = self.reused_calls = 0

    def run(self, where: str, device: Optional[str], check: Callable[[], Tuple[Optional[str], int]], width: int = 150) -> None:
        """``check()`` -> (the first difference or None, the calls reused), tallied; an exception
        is a model that cannot be counted either way."""
        try:
            difference, reused = check()
        except Exception as exc:
            self.failed += 1
            print(f"{self.failure} {where}: {zoo.first_line(exc)[:width]}", flush=True)
            return
        if difference is None:
            self.same += 1
            if device == "meta" and reused:
                self.reused_models += 1
                self.reused_calls += reused
        else:
            self.differ += 1
            print(f"DIFFER {where}: {difference}", flush=True)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=zoo.PARTS)
    parser.add_argument("--match", default=None, help="only models whose name contains this text")
    parser.add_argument("--no-predict", action="store_true", help="compare count_flops only")
    parser.add_argument("--off-eager", action="store_true", help="the reuse-off count's tables booked at once")
    args = parser.parse_args(argv)
    cases, _ = zoo.collect(args.only)
    if args.match:
        cases = [c for c in cases if args.match in c.name]
    torch.set_num_threads(1)
    tally = Tally()  # a model that cannot be counted is the zoo's business, not reuse's
    start = time.perf_counter()
    for case in cases:
        for device in (None, "meta"):
            where = f"{case.family}/{case.name}{' (meta)' if device else ''}"
            tally.run(where, device, lambda: compare(case, device, not args.no_predict, eager_off=args.off_eager))
    print(f"\n{len(cases)} models, {tally.same + tally.differ} counts compared (real weights and meta copy): {tally.same} "
          f"identical, {tally.differ} differ, {tally.failed} could not be counted either way; reuse taken on "
          f"{tally.reused_models} meta copies ({tally.reused_calls} calls); torch {torch.__version__}; "
          f"{time.perf_counter() - start:.0f} s", flush=True)
    return 1 if tally.differ else 0


if __name__ == "__main__":
    raise SystemExit(main())
