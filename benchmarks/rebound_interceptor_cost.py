"""What branch wild7's check for a rebound torch function (``core/rebound.py``) costs a call through the
dispatch tracer's ``CompositeInterceptor``: the interceptor of another checkout's
``tracers/_vocabulary.py`` (``--base``: e.g. ``git archive main flopcount | tar -x -C DIR``; its imports
resolve to this checkout's package) against this checkout's, interleaved rounds in one process, CPU time
per call of a Python torch function (``F.relu``, ``F.softmax``: the new branch's memo lookup) and of a
Tensor method (``x + 1``: its type test only).

Run: ``PYTHONPATH=. .venv/bin/python benchmarks/rebound_interceptor_cost.py --base DIR``
"""

import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from flopcount.tracers import _vocabulary as vocabulary


class _Recorder:
    phase, muted, events = "forward", 0, []

    def record(self, *args):
        pass


def _base_interceptor(base: Path) -> type:
    spec = importlib.util.spec_from_file_location("base_vocabulary", base / "flopcount" / "tracers" / "_vocabulary.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["base_vocabulary"] = module
    spec.loader.exec_module(module)
    return module.CompositeInterceptor


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, type=Path)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=20000)
    args = parser.parse_args()
    torch.set_num_threads(1)
    x = torch.randn(8, 32)
    calls = {"F.relu": lambda: F.relu(x), "F.softmax": lambda: F.softmax(x, -1), "x + 1": lambda: x + 1}
    sides = {"base": _base_interceptor(args.base), "this": vocabulary.CompositeInterceptor}
    spent = {(name, side): [] for name in calls for side in sides}
    for r in range(args.rounds):
        for name, call in calls.items():
            for side in (("base", "this") if r % 2 == 0 else ("this", "base")):
                with sides[side](_Recorder(), lambda v: v, lambda o: (o,)):
                    start = time.process_time()
                    for _ in range(args.calls):
                        call()
                    spent[(name, side)].append((time.process_time() - start) / args.calls * 1e6)
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    print(f"torch {torch.__version__}, 1 thread, {args.rounds} rounds x {args.calls} calls, load {load} at the end")
    print("| call | base min / median (us) | this min / median (us) | paired median ratio |")
    print("|---|---|---|---|")
    for name in calls:
        old, new = spent[(name, "base")], spent[(name, "this")]
        ratio = statistics.median(n / o for n, o in zip(new, old))
        print(f"| {name} | {min(old):.2f} / {statistics.median(old):.2f} | {min(new):.2f} / {statistics.median(new):.2f} | {ratio:.3f} |")


if __name__ == "__main__":
    main()
