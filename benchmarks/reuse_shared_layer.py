"""Structural reuse on a model whose repeated block is one shared instance (ALBERT: one layer called
12 times): the default policy, reuse off (``FLOPCOUNT_REUSE=0``) and ``FLOPCOUNT_REUSE=always``, in
turn in one process, CPU time of the counting thread, one thread, median of ``--repeats``. The
repeats of a shared layer are seen only while the forward runs; a policy decided before the run
must not take their replays away (branch resnet12, docs/performance.md).

Run: ``PYTHONPATH=. python benchmarks/reuse_shared_layer.py [--repeats 8]`` (needs transformers).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import warnings

import torch

import flopcount

MODES = {"default": None, "reuse off": "0", "always": "always"}


def count(model: torch.nn.Module, ids: torch.Tensor, mode: str) -> tuple[float, flopcount.FlopResult]:
    value = MODES[mode]
    if value is None:
        os.environ.pop("FLOPCOUNT_REUSE", None)
    else:
        os.environ["FLOPCOUNT_REUSE"] = value
    start = time.thread_time()
    result = flopcount.count_flops(model, (ids,))
    return time.thread_time() - start, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=8)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    from transformers import AlbertConfig, AlbertModel

    model = AlbertModel(AlbertConfig()).eval()
    ids = torch.randint(0, 1000, (1, 128))
    saved = os.environ.get("FLOPCOUNT_REUSE")
    times: dict[str, list[float]] = {mode: [] for mode in MODES}
    try:
        for turn in range(args.repeats + 1):
            for mode in MODES:
                seconds, result = count(model, ids, mode)
                if turn == 0:  # warm-up: the FLOPs and the calls booked
                    print(f"{mode}: {result.flops:,} FLOPs, {result.reused_calls} calls booked")
                else:
                    times[mode].append(seconds)
    finally:
        os.environ.pop("FLOPCOUNT_REUSE", None)
        if saved is not None:
            os.environ["FLOPCOUNT_REUSE"] = saved
    for mode, values in times.items():
        print(f"ALBERT-base 1x128, {mode}: {statistics.median(values) * 1e3:.1f} ms CPU, median of {args.repeats}")


if __name__ == "__main__":
    main()
