"""The CPU int8 roof's two libraries side by side (branch hwroofs): per round, the best rate of
fbgemm's dynamic quantized linear and of aten's ``_int_mm``, each over the roof's three shapes
(``flopcount.devices.measured._int8_kernels``), at 1 and 2 threads, alternating in one process.
The roof is the best of both; this says which one sets it here.

Run: ``PYTHONPATH=. python benchmarks/int8_roof_kernels.py [ROUNDS] [--budget S]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from flopcount.devices import measured


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rounds", nargs="?", type=int, default=8)
    parser.add_argument("--budget", type=float, default=0.15, help="seconds of timed calls per kernel per round")
    args = parser.parse_args()
    cpu = torch.device("cpu")
    timer = measured._timer(cpu, None)
    before = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            kernels = measured._int8_kernels(cpu)
            libraries = {"fbgemm": [k for label, k in kernels if "quantized" in label],
                         "_int_mm": [k for label, k in kernels if "_int_mm" in label]}
            rates: dict = {name: [] for name in libraries}
            for index in range(args.rounds):
                started = time.process_time()
                for name, found in libraries.items():
                    rates[name].append(max(measured._best_rate(k, args.budget, timer) for k in found) if found else 0.0)
                fb, mm = rates["fbgemm"][-1], rates["_int_mm"][-1]
                print(f"threads {threads} round {index}: fbgemm {fb / 1e9:7.1f}  _int_mm {mm / 1e9:7.1f} GFLOP/s  "
                      f"ratio {mm / fb if fb else float('nan'):.3f}  load {os.getloadavg()[0]:.2f}  "
                      f"cpu {time.process_time() - started:.2f} s", flush=True)
            ratios = [mm / fb for fb, mm in zip(rates["fbgemm"], rates["_int_mm"]) if fb]
            print(f"threads {threads}: " + "; ".join(
                f"{name} max {max(v) / 1e9:.1f} median {statistics.median(v) / 1e9:.1f} GFLOP/s" for name, v in rates.items())
                + (f"; _int_mm / fbgemm min {min(ratios):.3f} median {statistics.median(ratios):.3f} max {max(ratios):.3f}"
                   if ratios else ""))
    finally:
        torch.set_num_threads(before)


if __name__ == "__main__":
    main()
