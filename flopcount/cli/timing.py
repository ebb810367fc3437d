"""``bench`` and ``check --max-latency``: time the entry's forward, with progress on stderr."""

from __future__ import annotations

import argparse
import time
from typing import Any, Optional

from ..errors import FlopcountError, UsageError
from ..units import format_seconds
from .deadline import stage
from .output import iteration_progress, progress

__all__ = ["benchmark_entry", "check_timing_args"]

_MIN_TIMED = 10
_DEFAULT_DURATION = 1.0


def check_timing_args(args: argparse.Namespace) -> None:
    """Refuse flags that would be silently ignored, before any model is built."""
    if args.iters is not None and args.duration is not None:
        raise UsageError(
            f"--iters {args.iters} and --duration {args.duration:g} exclude each other: --iters N times exactly N calls, "
            f"--duration S times calls until S seconds passed and at least {_MIN_TIMED} ran"
        )


def _timing_plan_text(args: argparse.Namespace, duration: float) -> str:
    if args.iters is not None:
        return f"exactly {args.iters} timed calls"
    return f"timed calls until {duration:g} s has passed and at least {_MIN_TIMED} ran"


def benchmark_entry(run: Any, args: argparse.Namespace, flops: Any) -> Any:
    if run.device == "meta":
        raise UsageError("cannot time a model on the meta device (it has no data); use --device cpu or cuda")
    import torch

    from ..bench.latency import benchmark

    dtype = None if args.dtype is None else getattr(torch, args.dtype)
    duration = _DEFAULT_DURATION if args.duration is None else args.duration
    progress(args, f"benchmarking {run.entry} on {run.device}: {args.warmup} untimed warm-up calls, "
                   f"then {_timing_plan_text(args, duration)} ...")
    stage(args, f"the benchmark of {run.entry} (warm-up and timed calls of its forward)")
    started = time.monotonic()
    warm_report = iteration_progress("warm-up")

    def on_warmup(done: int, total: Optional[int]) -> None:
        if done == 1:
            first = time.monotonic() - started
            timed = args.iters * first if args.iters is not None else max(duration, _MIN_TIMED * first)
            expect = args.warmup * first + timed
            if expect >= 2.0:  # worth saying; a fast model is done before one could read it
                timed_text = f"{args.iters}" if args.iters is not None else f"at least {max(_MIN_TIMED, int(duration / first))}"
                progress(args, f"  the first call took {format_seconds(first, 1)}: expect about {format_seconds(expect, 1)} in all "
                               f"({args.warmup} warm-up + {timed_text} timed calls)")
        warm_report(done, total)

    try:
        result = benchmark(
            run.model, run.inputs, run.kwargs,
            warmup=args.warmup, iters=args.iters, budget_s=duration, min_iters=_MIN_TIMED,
            device=run.device, dtype=dtype, flops=flops, batch_size=args.batch_size,
            progress=None if args.quiet else iteration_progress(),
            warmup_progress=None if args.quiet else on_warmup,
        )
    except FlopcountError:
        raise
    except Exception as exc:
        raise UsageError(f"the forward of {run.entry} failed during the benchmark: {type(exc).__name__}: {exc}") from exc
    progress(args, f"timed {result.iters} calls in {result.wall_s:.2f} s (median {result.median_s * 1e3:.3f} ms; "
                   f"throughput uses batch {result.batch_size}: {result.batch_source})")
    return result
