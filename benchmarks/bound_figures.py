"""predict's bounds for every case of ``bound_suite.py``, on fixed roofs (nothing measured,
nothing timed): the figures to compare before and after a change to how the bound is booked.

Two roof sets: the T4 datasheet part (an L2 level and DRAM) and a flat CPU-like one (300 GFLOP/s
float32, 2.7 TFLOP/s bfloat16, 15 GB/s, no cache). Prints per case the eager bound, the per-op
sum, the any-implementation bound and the FLOPs, to the last digit.

Run: ``PYTHONPATH=. python benchmarks/bound_figures.py [--quick]``.
"""

from __future__ import annotations

import argparse
import warnings
from typing import Optional, Sequence

import bound_suite

import flopcount
from flopcount.devices import Roofs, named_roofs


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="bound_suite's first 8 cases only")
    args = parser.parse_args(argv)
    roof_sets = {
        "t4": named_roofs("t4"),
        "flat-cpu": Roofs(peak_flops={"float32": 300e9, "bfloat16": 2.7e12}, bandwidth=15e9, device="flat cpu", source="given"),
    }
    for case in bound_suite.cases(args.quick):
        model, inputs, kwargs = case.build()
        kw = case.fresh(kwargs) if case.fresh else kwargs
        for label, roofs in roof_sets.items():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                result = flopcount.predict(model, inputs, kw, device=roofs, backward=case.train,
                                           loss_fn=bound_suite._loss if case.train else None)
            flops = sum(r.flops for r in result.rows)
            print(f"{case.name:40s} {label:8s} eager {result.bound_s('eager'):.9e}  per-op {result.latency_s:.9e}  "
                  f"any {result.any_s:.9e}  flops {flops}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
