"""Exactness of a speed pass on the whole zoo, before against after (issue #32, "Exactness is the
contract"): every model of ``benchmarks/zoo.py`` (one part) counted twice with the default tracer,
with real weights and on a meta copy, and what a user reads of both counts (``zoo_reuse._rows``:
``to_dict()``, the tables by operator, module, module x operator and phase for every metric, the
modules' call counts) written to a file; ``--compare`` then says which models differ between two
such files (two checkouts) or between a model's first and second count (what a count keeps for the
next one: shared calls, their kept prices).

    PYTHONPATH=BASE python benchmarks/zoo_before_after.py --tree BASE --only nn --dump base.pkl
    PYTHONPATH=. python benchmarks/zoo_before_after.py --tree . --only nn --dump branch.pkl
    python benchmarks/zoo_before_after.py --compare base.pkl branch.pkl

(torchvision with ``.venv-zoo``; ``--tree`` is the checkout whose ``flopcount`` and ``zoo`` are used,
which need not have this script.)
"""

from __future__ import annotations

import argparse
import pickle
import sys
import time
from pathlib import Path
from typing import Any, Dict


def dump(tree: Path, part: str, out: Path) -> None:
    sys.path.insert(0, str(tree))
    sys.path.insert(0, str(tree / "benchmarks"))
    import torch
    import zoo
    import zoo_reuse

    import flopcount

    torch.set_num_threads(1)
    cases, _ = zoo.collect(part)
    rows: Dict[str, Any] = {}
    start = time.perf_counter()
    for case in cases:
        for device in (None, "meta"):
            where = f"{case.family}/{case.name}{' (meta)' if device else ''}"
            try:
                with zoo.quiet():
                    model = zoo._build(case, device)
                    args, kwargs = zoo._inputs_for(case, device=device)
                    first = zoo_reuse._rows(flopcount.count_flops(model, args, kwargs=kwargs or None))
                    second = zoo_reuse._rows(flopcount.count_flops(model, args, kwargs=kwargs or None))
                rows[where] = ("counted", first, second)
            except Exception as exc:  # a model the zoo cannot count is compared by its error
                rows[where] = ("error", zoo.first_line(exc)[:150])
    with open(out, "wb") as f:
        pickle.dump(rows, f)
    print(f"{part}: {len(rows)} counts of {len(cases)} models written to {out} ({time.perf_counter() - start:.0f} s); "
          f"flopcount {flopcount.__file__}")


def compare(before_file: Path, after_file: Path) -> int:
    with open(before_file, "rb") as f:
        before = pickle.load(f)
    with open(after_file, "rb") as f:
        after = pickle.load(f)
    same = differ = errors = 0
    for where in sorted(set(before) | set(after)):
        a, b = before.get(where), after.get(where)
        if a is not None and a == b and (a[0] == "error" or a[1] == a[2]):
            same += 1
            errors += a[0] == "error"
            continue
        differ += 1
        why = "missing on one side" if a is None or b is None else "an error on one side" if a[0] != b[0] else \
            "first count differs from second" if a == b else "before differs from after"
        print(f"DIFFER {where}: {why}")
    print(f"{same} identical (before = after, each model's second count = its first; {errors} of them failing "
          f"the same way on both sides), {differ} differ")
    return 1 if differ else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--only", choices=("torchvision", "transformers", "nn"))
    parser.add_argument("--dump", type=Path)
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"))
    args = parser.parse_args()
    if args.compare:
        return compare(*args.compare)
    if not (args.only and args.dump):
        parser.error("give --only and --dump, or --compare BEFORE AFTER")
    dump(args.tree.resolve(), args.only, args.dump)
    return 0


if __name__ == "__main__":
    sys.exit(main())
