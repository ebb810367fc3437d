"""The default count of another commit and of this checkout, paired in ONE process (branch
weakcls): where a change touches module-level objects that callers bind at import (per-class
memos), swapping functions (``count_ab.py``) cannot put the old code back whole, and two
processes differ by more than the change (a ResNet-50 count's per-process median scattered by
±10 % at load 6). So the other commit's package is copied under another name (``--commit``:
``git archive`` of its ``flopcount/``, every ``flopcount`` word renamed ``flopcount_base``), both
packages are imported, each with its own process-wide caches, and each round counts the model
``--per`` times with one and then the other, in an order that alternates; CPU time of the counting
thread. The figure is the median of the per-round ratios of the two sides' median counts, with
their quartiles; both must give the same ``to_dict()``. Models as ``count_variants.py``
(``count_phases._cases``: meta copies; LLaMA-2-70B on meta at 4,096 tokens).

    PYTHONPATH=. .venv/bin/python benchmarks/count_trees_ab.py --commit main \\
        [--models resnet50,bert,gpt2,70b] [--rounds 30] [--per 5] [--real]
"""

from __future__ import annotations

import argparse
import functools
import io
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Dict, List, Tuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402
from _interleave import paired_cpu  # noqa: E402
from count_phases import _cases  # noqa: E402

from flopcount import count_flops  # noqa: E402

warnings.simplefilter("ignore")
_WORD = re.compile(rb"\bflopcount\b")


def renamed_package(commit: str, into: Path) -> Path:
    """``commit``'s ``flopcount/`` as the package ``flopcount_base`` under ``into``."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit, "flopcount"], check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        for member in tar.getmembers():
            if not member.isfile():
                continue
            data = tar.extractfile(member).read()  # type: ignore[union-attr]
            target = into / member.name.replace("flopcount", "flopcount_base", 1)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(_WORD.sub(b"flopcount_base", data) if member.name.endswith(".py") else data)
    return into


def _quartiles(values: List[float]) -> Tuple[float, float, float]:
    ordered = sorted(values)
    n = len(ordered)
    return ordered[n // 4], ordered[n // 2], ordered[(3 * n) // 4]


def _load() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commit", default="main", help="the other commit (its flopcount/)")
    parser.add_argument("--models", default="resnet50,bert,gpt2,70b")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--per", type=int, default=5, help="counts per side and round")
    parser.add_argument("--real", action="store_true", help="the models with real weights and real CPU inputs (not meta copies)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as folder:
        sys.path.insert(0, str(renamed_package(args.commit, Path(folder))))
        import flopcount_base  # type: ignore[import-not-found]

        sides: Dict[str, Any] = {"base": flopcount_base.count_flops, "this": count_flops}
        print(f"base {args.commit} (as flopcount_base), this {ROOT}; torch {torch.__version__}, 1 thread; "
              f"{args.rounds} rounds x {args.per} counts per side; load {_load()} at start, "
              f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
        print("| model | base median ms (min) | this median ms (min) | per-round ratio: median (quartiles) | same to_dict |")
        print("|---|---|---|---|---|")
        for model in args.models.split(","):
            (_, (net, inputs, _)), = _cases([model], real=args.real).items()
            same = sides["base"](net, inputs).to_dict() == sides["this"](net, inputs).to_dict()
            spent, ratios = paired_cpu({side: functools.partial(sides[side], net, inputs) for side in sides}, args.rounds, args.per)
            low, middle, high = _quartiles(ratios)
            base, this = spent["base"], spent["this"]
            print(f"| {model} | {statistics.median(base) * 1e3:.2f} ({min(base) * 1e3:.2f}) | "
                  f"{statistics.median(this) * 1e3:.2f} ({min(this) * 1e3:.2f}) | {middle:.3f} ({low:.3f}-{high:.3f}) | "
                  f"{same} |", flush=True)
            del net, inputs
    print(f"load at the end {_load()}")


if __name__ == "__main__":
    main()
