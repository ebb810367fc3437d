"""The profile join on the CPU zoo (issue #21): for every torch.nn and transformers model of
the coverage zoo (benchmarks/zoo_nn.py, benchmarks/zoo_hf.py), built with its inputs as
benchmarks/zoo.py builds them, in eval mode (``--train``: the zoo's train rows in train
mode, forward only; ``--backward``: forward and backward), run ``flopcount.profile(..., warmup=0,
steps=1)`` and ``count_flops(..., tracer="dispatch")`` and check that the join adds no
error: each operator's FLOPs in ``ProfileResult.by_operator()`` equal
``FlopResult.by_operator()`` exactly, and list ``ProfileResult.unmatched``.

    .venv/bin/python benchmarks/profile_zoo.py --only nn --json nn.json
    .venv/bin/python benchmarks/profile_zoo.py --only transformers --start 0 --limit 10

A model whose profile takes longer than ``--timeout`` seconds (default 10) is stopped
(SIGALRM) and reported as skipped. Prints Markdown on stdout, progress on stderr.
"""

from __future__ import annotations

import argparse
import json
import platform
import signal
import sys
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from zoo import _build, _inputs_for, _map, first_line, quiet  # noqa: E402
from zoo_nn import Case  # noqa: E402

import flopcount  # noqa: E402
from flopcount import count_flops  # noqa: E402


class TimeLimit(Exception):
    pass


def _alarm(signum: int, frame: Any) -> None:
    raise TimeLimit()


def _leaf(t: torch.Tensor) -> torch.Tensor:
    """``t`` as a leaf that requires grad when it is floating (strides kept), else ``t``."""
    return t.detach().requires_grad_() if t.is_floating_point() else t


def cases(only: Optional[str], train: bool) -> List[Case]:
    out: List[Case] = []
    if only in (None, "nn"):
        import zoo_nn

        # in eval, a "(eval)" row repeats its train row
        out += [c for c in zoo_nn.cases() if train or "(eval)" not in c.name]
    if only in (None, "transformers"):
        import zoo_hf

        out += zoo_hf.cases()
    return out


def compare(profiled: Dict[str, float], counted: Dict[str, float]) -> List[Dict[str, Any]]:
    """Operators whose FLOPs differ (exactly) between the profile's join and the count."""
    return [{"op": op, "profile": profiled.get(op, 0), "count": counted.get(op, 0)}
            for op in sorted(set(profiled) | set(counted)) if profiled.get(op, 0) != counted.get(op, 0)]


def run_case(case: Case, timeout: float, train: bool, backward: bool = False) -> Dict[str, Any]:
    row: Dict[str, Any] = {"family": case.family, "name": case.name + (" (train)" if train and case.train else ""),
                           "status": "ok", "diffs": [], "unmatched": []}
    start = time.perf_counter()
    try:
        model = _build(case).train(train and case.train)
        args, kwargs = _inputs_for(case)
        if backward and args:  # the first input requires grad: a layer without parameters has a backward too
            args = (_map(args[0], _leaf),) + tuple(args[1:])  # (not a loss's target)
        with quiet():
            counted = count_flops(model, args, kwargs=kwargs or None, tracer="dispatch", backward=backward)
        row["count_s"] = time.perf_counter() - start
        begin = time.perf_counter()
        previous = signal.signal(signal.SIGALRM, _alarm)
        signal.setitimer(signal.ITIMER_REAL, timeout)
        try:
            with quiet():
                prof = flopcount.profile(model, args, kwargs or None, backward=backward, warmup=0, steps=1)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
        row["profile_s"] = time.perf_counter() - begin
    except TimeLimit:
        row.update(status="skipped", error=f"profile over {timeout:g} s")
        return row
    except Exception as exc:  # a failing model is a row of the report
        row.update(status="failed", error=first_line(exc))
        return row
    row["flops"] = counted.flops
    row["diffs"] = compare({op: r.flops for op, r in prof.by_operator().items()},
                           dict(counted.by_operator()))
    row["unmatched"] = [{"kind": u.kind, "op": u.name, "module": u.module, "calls": u.calls,
                         "time_s": u.time_s, "flops": u.flops, "reason": u.reason} for u in prof.unmatched]
    return row


def _fmt(value: float) -> str:
    return f"{value:g}" if value != int(value) else str(int(value))


def report(rows: List[Dict[str, Any]]) -> Iterator[str]:
    ran = [r for r in rows if r["status"] == "ok"]
    equal = [r for r in ran if not r["diffs"]]
    differ = [r for r in ran if r["diffs"]]
    unmatched = [r for r in ran if r["unmatched"]]
    skipped = [r for r in rows if r["status"] == "skipped"]
    failed = [r for r in rows if r["status"] == "failed"]
    yield (f"torch {torch.__version__}, {platform.machine()} {platform.system()}, "
           f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n")
    yield f"- models: {len(rows)}; run: {len(ran)}; skipped (time limit): {len(skipped)}; failed: {len(failed)}"
    yield f"- FLOPs per operator equal to count_flops: {len(equal)} of {len(ran)}"
    yield f"- with differences: {len(differ)}"
    yield f"- with unmatched calls: {len(unmatched)}\n"
    if differ:
        yield "| model | operator | profile FLOPs | count FLOPs |\n|---|---|---|---|"
        for r in differ:
            for d in r["diffs"]:
                yield f"| {r['family']}/{r['name']} | `{d['op']}` | {_fmt(d['profile'])} | {_fmt(d['count'])} |"
        yield ""
    if unmatched:
        yield "| model | kind | operator | calls | time | FLOPs | reason |\n|---|---|---|---|---|---|---|"
        for r in unmatched:
            for u in r["unmatched"]:
                yield (f"| {r['family']}/{r['name']} | {u['kind']} | `{u['op']}` | {_fmt(u['calls'])} | "
                       f"{u['time_s'] * 1e6:.1f} us | {_fmt(u['flops'])} | {u['reason']} |")
        yield ""
    for title, group in (("Skipped", skipped), ("Failed", failed)):
        if group:
            yield f"{title}:\n"
            for r in group:
                yield f"- {r['family']}/{r['name']}: {r['error']}"
            yield ""


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=("nn", "transformers"))
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument("--limit", type=int)
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds a profile may take")
    parser.add_argument("--train", action="store_true", help="the zoo's train rows in train mode (forward only)")
    parser.add_argument("--backward", action="store_true", help="a training step: forward and backward")
    parser.add_argument("--json", type=Path, help="write the rows here")
    parser.add_argument("--from-json", type=Path, nargs="+", help="report rows written by --json")
    args = parser.parse_args(argv)
    rows: List[Dict[str, Any]] = []
    if args.from_json:
        for path in args.from_json:
            rows += json.loads(path.read_text())
    else:
        todo = cases(args.only, args.train)[args.start:]
        todo = todo[:args.limit] if args.limit is not None else todo
        for case in todo:
            row = run_case(case, args.timeout, args.train, args.backward)
            took = row.get("count_s", 0) + row.get("profile_s", 0)
            print(f"{case.family}/{case.name}: {row['status']} {took:.1f}s {len(row['diffs'])} diffs "
                  f"{len(row['unmatched'])} unmatched {row.get('error', '')}", file=sys.stderr, flush=True)
            rows.append(row)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1, default=str))
    print("\n".join(report(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
