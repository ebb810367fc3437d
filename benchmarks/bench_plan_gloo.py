"""plan() against real gloo runs on CPU, including the 4-process 2-D case (fsdp=2 x tp=2)
that CI leaves out: for each case, the plan's per-rank state bytes, rank-0 peak,
collectives and FLOPs next to what the real rank 0 did (torch's CommDebugMode and
MemTracker, the collectives' real tensors, a dispatch count on real tensors).

    PYTHONPATH=. python benchmarks/bench_plan_gloo.py [--cases llama:2x2,encoder:2x1,encoder:1x2]"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "plan"))

KIND = {"c10d._allgather_base_": "all_gather", "c10d._reduce_scatter_base_": "reduce_scatter",
        "c10d_functional.all_reduce": "all_reduce", "_c10d_functional.all_reduce": "all_reduce"}


def main() -> None:
    import _plan_gloo as gloo

    import flopcount

    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", default="llama:2x2,encoder:2x1,encoder:1x2")
    args = parser.parse_args()
    for case in args.cases.split(","):
        name, _, shape = case.partition(":")
        fsdp, tp = (int(v) for v in shape.split("x"))
        start = time.perf_counter()
        real = gloo.run_real(name, fsdp, tp, tempfile.mkdtemp(), timeout=300)
        real_s = time.perf_counter() - start
        start = time.perf_counter()
        plan = flopcount.plan(gloo.BUILDERS[name], (gloo.example_input(name),), fsdp=fsdp, tp=tp, device=None)
        plan_s = time.perf_counter() - start
        counts = {KIND[op]: n for op, n in real["comm_counts"].items()}
        sizes: dict = {}
        for op, size in real["collective_bytes"]:
            sizes[KIND[op]] = sizes.get(KIND[op], 0) + size
        planned_counts = {}
        planned_sizes = {}
        for row in plan.comm:
            planned_counts[row.kind] = planned_counts.get(row.kind, 0) + row.calls
            planned_sizes[row.kind] = planned_sizes.get(row.kind, 0) + row.tensor_bytes
        peak_error = (plan.peak_bytes - real["peak"]) / real["peak"]
        print(f"{name} fsdp={fsdp} tp={tp}: real run {real_s:.1f} s, plan {plan_s:.1f} s")
        print(f"  state bytes equal: {dict(plan.state_bytes) == real['state_bytes']} {dict(plan.state_bytes)}")
        print(f"  peak: plan {plan.peak_bytes} real {real['peak']} ({peak_error:+.2%})")
        print(f"  collectives equal (kind, count): {planned_counts == counts} {counts}")
        print(f"  collective bytes equal: {planned_sizes == sizes} {sizes}")
        print(f"  FLOPs equal: {dict(plan.flops) == real['flops']} {real['flops']}")


if __name__ == "__main__":
    main()
