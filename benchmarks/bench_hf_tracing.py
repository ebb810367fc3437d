"""transformers' "is tracing" probe answered as on a real run (flopcount/tracers/fake/hf_tracing.py):
what it changes in the figures, and what it costs, measured in one process with the mechanism on
and off (off: ``hf_tracing.uses_transformers`` answers False, the behaviour before the fix).

    PYTHONPATH=. python benchmarks/bench_hf_tracing.py [--repeats 5] [--skip-70b]

Cases: the 2-layer LLaMA example (flopcount.examples.hf.llama: GQA 8/2 heads, hidden 256) at
2 x 128 tokens with an all-ones mask (count_flops forward and backward, estimate_memory of a
training step), timed in interleaved rounds (medians, ratio on/off); and LLaMA-2-70B's published
config on meta (bfloat16, 80 layers, no cache, 1 x 4,096 real token ids): count_flops with
backward and estimate_memory with AdamW, on and off once each, their figures and times.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Dict, Iterator

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _interleave import median, rounds


@contextlib.contextmanager
def mechanism(on: bool) -> Iterator[None]:
    from flopcount.tracers.fake import hf_tracing

    original = hf_tracing.uses_transformers
    if not on:
        hf_tracing.uses_transformers = lambda modules: False  # type: ignore[assignment]
    try:
        yield
    finally:
        hf_tracing.uses_transformers = original  # type: ignore[assignment]


def switched(fn: Callable[[], Any], on: bool) -> Callable[[], Any]:
    def run() -> Any:
        with mechanism(on):
            return fn()

    return run


def small(repeats: int) -> None:
    import flopcount
    from flopcount.examples.hf import llama

    model = llama().train()
    ids = torch.randint(0, 1000, (2, 128), generator=torch.Generator().manual_seed(0))
    kwargs = {"attention_mask": torch.ones(2, 128, dtype=torch.long)}
    cases: Dict[str, Callable[[], Any]] = {
        "count forward": lambda: flopcount.count_flops(model, (ids,), kwargs),
        "count backward": lambda: flopcount.count_flops(model, (ids,), kwargs, backward=True),
        "estimate_memory training step": lambda: flopcount.estimate_memory(model, (ids,), kwargs, backward=True, optimizer="adamw"),
    }
    for name, fn in cases.items():
        on, off = switched(fn, True), switched(fn, False)
        figure = (lambda r: f"{r.flops:,} FLOPs") if name.startswith("count") else (lambda r: f"peak {r.peak_bytes:,} B")
        times, failures = rounds({"on": on, "off": off}, repeats)
        assert not failures, failures
        t_on, t_off = median(times["on"]), median(times["off"])
        assert t_on is not None and t_off is not None
        print(
            f"llama 2x128 ones-mask, {name}: on {figure(on())} in {t_on * 1e3:.1f} ms, "
            f"off {figure(off())} in {t_off * 1e3:.1f} ms (medians of {repeats}), ratio on/off {t_on / t_off:.2f}"
        )


def big() -> None:
    from transformers import LlamaForCausalLM

    import flopcount
    from flopcount.examples.hf import llama2_70b_config

    config = llama2_70b_config()
    config.use_cache = False
    with torch.device("meta"):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    ids = torch.randint(0, 32000, (1, 4096), generator=torch.Generator().manual_seed(0))
    for on in (True, False):
        with mechanism(on):
            start, cpu = time.perf_counter(), time.process_time()
            counted = flopcount.count_flops(model, (ids,), backward=True)
            wall, cpu = time.perf_counter() - start, time.process_time() - cpu
            print(
                f"70B meta 1x4096 count_flops backward, {'on' if on else 'off'}: {counted.by_phase()} "
                f"({wall:.2f} s wall, {cpu:.2f} s CPU)"
            )
            start, cpu = time.perf_counter(), time.process_time()
            estimate = flopcount.estimate_memory(model, (ids,), {"labels": ids}, backward=True, optimizer="adamw")
            wall, cpu = time.perf_counter() - start, time.process_time() - cpu
            at = estimate.at_peak
            print(
                f"70B meta 1x4096 estimate_memory AdamW step, {'on' if on else 'off'}: peak {estimate.peak_bytes:,} B "
                f"in {estimate.peak_phase}; activations {at.activations:,} B, temporaries {at.temporaries:,} B "
                f"({wall:.2f} s wall, {cpu:.2f} s CPU)"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--skip-70b", action="store_true")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    import transformers.models.llama.modeling_llama  # noqa: F401  # the one-time import, outside the timing

    with open("/proc/loadavg") as f:
        print("load before:", f.read().strip())
    small(args.repeats)
    if not args.skip_70b:
        big()
    with open("/proc/loadavg") as f:
        print("load after:", f.read().strip())


if __name__ == "__main__":
    main()
