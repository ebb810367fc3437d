"""plan() against real gloo runs on CPU, including the 4-process 2-D case (fsdp=2 x tp=2)
that CI leaves out: for each case, the plan's per-rank state bytes, rank-0 peak,
collectives and FLOPs next to what the real rank 0 did (torch's CommDebugMode and
MemTracker, the collectives' real tensors, a dispatch count on real tensors).

    PYTHONPATH=. python benchmarks/bench_plan_gloo.py [--cases llama:2x2,encoder:2x1,encoder:1x2]
    PYTHONPATH=. python benchmarks/bench_plan_gloo.py --cases qwen2:2x1:bf16:16,mistral:4x1:bf16:128

A case is MODEL:FSDPxTP[:bf16][:SEQ]: bf16 is FSDP2's MixedPrecisionPolicy(param_dtype=bfloat16,
reduce_dtype=float32) in both the plan and the real run; SEQ tokens per sequence (default 16).
The peak is planned for gloo (``backend="gloo"``, what the real run uses) and, beside it, for
the default nccl, which leaves out gloo's copy of each reduce-scatter's input."""

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
    from flopcount.planning.plan import _MEMORY_KEYS

    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", default="llama:2x2,encoder:2x1,encoder:1x2")
    args = parser.parse_args()
    for case in args.cases.split(","):
        name, shape, *rest = case.split(":")
        fsdp, tp = (int(v) for v in shape.split("x"))
        mp = "bfloat16" if "bf16" in rest else None
        seq = int(next((r for r in rest if r.isdigit()), gloo.SEQ))
        example = gloo.example_input(name, seq)
        start = time.perf_counter()
        real = gloo.run_real(name, fsdp, tp, tempfile.mkdtemp(), timeout=300, mixed_precision=mp, seq=seq)
        real_s = time.perf_counter() - start
        start = time.perf_counter()
        plan = flopcount.plan(gloo.BUILDERS[name], (example,), fsdp=fsdp, tp=tp, on=None, mixed_precision=mp,
                              backend="gloo")
        plan_s = time.perf_counter() - start
        nccl = flopcount.plan(gloo.BUILDERS[name], (example,), fsdp=fsdp, tp=tp, on=None, mixed_precision=mp)
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
        nccl_error = (nccl.peak_bytes - real["peak"]) / real["peak"]
        categories: dict = {}
        for key, value in real["peak_categories"].items():
            if key != "Total" and value:
                categories[_MEMORY_KEYS.get(key, key)] = categories.get(_MEMORY_KEYS.get(key, key), 0) + value
        planned_categories = {k: v for k, v in plan.memory.items() if v}
        label = f"{name} fsdp={fsdp} tp={tp}" + (" bf16" if mp else "") + f" seq={seq}"
        print(f"{label}: real run {real_s:.1f} s, plan {plan_s:.1f} s")
        print(f"  state bytes equal: {dict(plan.state_bytes) == real['state_bytes']} {dict(plan.state_bytes)}")
        print(f"  peak: plan (gloo) {plan.peak_bytes} real {real['peak']} ({peak_error:+.2%}); "
              f"plan (nccl) {nccl.peak_bytes} ({nccl_error:+.2%})")
        print(f"  peak categories equal FSDPMemTracker's: {planned_categories == categories} {categories}")
        print(f"  collectives equal (kind, count): {planned_counts == counts} {counts}")
        print(f"  collective bytes equal: {planned_sizes == sizes} {sizes}")
        print(f"  FLOPs equal: {dict(plan.flops) == real['flops']} {real['flops']}")


if __name__ == "__main__":
    main()
