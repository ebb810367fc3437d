"""The CLI's latency wiring: measured (``bench`` and ``check --max-latency``: the entry's
forward timed, with progress on stderr), bounded on a device (``count --on PART`` and
``check --max-latency T --on PART``: roofline lower bounds) and profiled (``profile``:
measured time joined with cost per op)."""

from __future__ import annotations

import argparse
import time
from typing import Any, Callable, ContextManager, Optional, Tuple

from flopcount.cli.deadline import stage
from flopcount.cli.output import emit, iteration_progress, progress, say, with_section, written
from flopcount.cli.parser import EXIT_OK
from flopcount.errors import FlopcountError, UsageError
from flopcount.integrations.tensorboard import summary_writer, write_profile_tensorboard
from flopcount.report.profile import predict_table, profile_csv, profile_html, profile_table
from flopcount.report.render import entry_json
from flopcount.units import format_seconds

__all__ = ["benchmark_entry", "check_timing_args", "math_modes", "predicted_latency_s", "run_profile", "with_prediction"]

_MIN_TIMED = 10
_DEFAULT_DURATION = 1.0


def check_timing_args(args: argparse.Namespace) -> None:
    """Refuse flags that would be silently ignored, before any model is built."""
    if args.iters is not None and args.duration is not None:
        raise UsageError(
            f"--iters {args.iters} and --duration {args.duration:g} exclude each other: --iters N times exactly N calls, "
            f"--duration S times calls until S seconds passed and at least {_MIN_TIMED} ran"
        )


def benchmark_entry(run: Any, args: argparse.Namespace, flops: Any) -> Any:
    if run.device == "meta":
        raise UsageError("cannot time a model on the meta device (it has no data); use --device cpu or cuda")
    import torch

    from flopcount.bench.latency import benchmark

    dtype = None if args.dtype is None else getattr(torch, args.dtype)
    duration = _DEFAULT_DURATION if args.duration is None else args.duration
    timed_calls = (f"exactly {args.iters} timed calls" if args.iters is not None
                   else f"timed calls until {duration:g} s has passed and at least {_MIN_TIMED} ran")
    progress(args, f"benchmarking {run.entry} on {run.device}: {args.warmup} untimed warm-up calls, then {timed_calls} ...")
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


def math_modes(args: argparse.Namespace, part: Optional[str]) -> Any:
    """The modeled part's float32 math modes from ``--matmul-tf32`` / ``--no-conv-tf32``
    (:class:`~flopcount.devices.MathModes`), refused where nothing reads them: without a part
    (``count``/``check`` without ``--on``) and on this machine (its modes are its own). On a
    part without a TF32 peak (a T4, a V100) they change nothing: a note says so, and the
    run goes on at FP32."""
    from flopcount.devices import find_part, is_this_machine

    given = args.matmul_tf32 or args.no_conv_tf32
    if given and part is None:
        raise UsageError("--matmul-tf32/--no-conv-tf32 set the math of the part --on PART models: add --on (e.g. --on h100)")
    if given and is_this_machine(part or ""):
        raise UsageError("--matmul-tf32/--no-conv-tf32 model a datasheet part's math modes; this machine's are its own")
    found = find_part(part) if given and part is not None else None
    if found is not None and "tfloat32" not in found.peaks_tflops:
        flags = [flag for flag, set_ in (("--matmul-tf32", args.matmul_tf32), ("--no-conv-tf32", args.no_conv_tf32)) if set_]
        say(f"{found.name} has no TF32 peak (no TF32 tensor cores): {' and '.join(flags)} change(s) nothing there; "
            f"its float32 work is priced at FP32", "note")
    return _given_modes(args)


def _given_modes(args: argparse.Namespace) -> Any:
    """The math modes the flags ask for, as :func:`math_modes` returns them (which the command
    called before any work: its refusals and note are said once)."""
    from flopcount.devices import MathModes

    return MathModes(conv_tf32=not args.no_conv_tf32, matmul_tf32=args.matmul_tf32)


def _predict(run: Any, args: argparse.Namespace, on: str) -> Any:
    from flopcount.devices import named_roofs
    from flopcount.profiling.predict import predict

    dtype = getattr(args, "dtype", None)
    modes = _given_modes(args)  # count and check checked them (math_modes) before the count
    roofs = named_roofs(on, conv_tf32=modes.conv_tf32, matmul_tf32=modes.matmul_tf32)
    progress(args, f"bounding the latency of {run.entry} on {on} (roofline, fake tensors) ...")
    stage(args, f"the latency bound of {run.entry} on {on}")
    return predict(run.model, run.inputs, run.kwargs, on=roofs, dtype=dtype, backward=bool(getattr(args, "backward", False)))


def predicted_latency_s(run: Any, args: argparse.Namespace) -> Tuple[float, str, bool]:
    """The roofline lower bound on ``--on PART`` in seconds, which bound it is (said on
    stderr): ``--bound eager|any``, by default "any" on a datasheet part (a certain FAIL for
    an engine the user did not name) and "eager" on this machine (the program flopcount runs),
    and whether it is certain: not on this machine's roofs measured now and found not sane (a
    load average above the cores, two passes apart: roofs below what the machine does, so a
    bound that may be above what it runs; docs/devices.md, "Roofs measured under load")."""
    from flopcount.devices import default_bound
    from flopcount.devices.roofline import BOUND_NAMES, float32_math_text

    result = _predict(run, args, args.on)
    kind = getattr(args, "bound", None) or default_bound(result.roofs)
    # a torch.compile-d model's eager bound is the any-implementation one: named so, and why where eager was meant
    why = ", which is a torch.compile-d model's eager bound" if result.compiled and kind == "eager" else ""
    if result.compiled:
        kind = "any"
    seconds = result.bound_s(kind)
    math = float32_math_text(result.float32_math())
    # a FAIL is certain under the math the bound assumed (--matmul-tf32 for an engine that runs TF32)
    basis = f"{BOUND_NAMES[kind]} lower bound on {result.roofs.device}" + (f" with {math}" if math else "") + why
    doubts = result.roofs.doubts
    if doubts:
        basis += f" on roofs measured under load ({'; '.join(doubts)})"
    progress(args, f"latency {basis}: {format_seconds(seconds)} (eager per-op sum {format_seconds(result.latency_s)}, "
                   f"any implementation {format_seconds(result.any_s)}; {result.roofs.source}); "
                   + ("an estimate, not a bound" if doubts else "a bound, not a forecast"))
    return float(seconds), basis, not doubts


def with_prediction(text: str, run: Any, args: argparse.Namespace) -> str:
    """The count's report with the lower bound on ``--on PART`` added."""
    result = _predict(run, args, args.on)
    return with_section(text, args.format, "--on", "predict", result.to_dict(), lambda fmt: predict_table(result, fmt=fmt))


def _roofs(text: Any) -> Any:
    if text is None:
        return None
    from flopcount.budget.check import parse_quantity
    from flopcount.devices.roofline import Roofs

    parts = [p.strip() for p in str(text).split(",")]
    if len(parts) != 2:
        raise UsageError(f"--roofs {text!r}: give PEAK_FLOPS,BANDWIDTH, e.g. 2T,100G (FLOP/s and bytes/s)")
    peak, bandwidth = (parse_quantity(p, "--roofs") for p in parts)
    return Roofs({"float32": float(peak)}, float(bandwidth), "--roofs", "given")


def run_profile(args: argparse.Namespace, prepare: Callable[[], Any], label: str,
                hints: Callable[[Any], ContextManager[None]]) -> int:
    """``flopcount profile``: check the flags, load the model (``prepare``), profile (a failing
    forward with the command line's ``hints`` about the prepared run), render once, write the
    trace and the plot."""
    from flopcount.profiling.run import profile

    if args.device == "meta":
        raise UsageError("profile runs the model for real: use --device cpu or cuda, not meta")
    if args.tracer != "auto":
        raise UsageError("profile joins the profiler with flopcount's dispatch recorder on the real model: drop --tracer")
    if args.plot_kind not in (None, "bars"):
        raise UsageError("profile --plot draws the roofline: drop --plot-kind")
    if args.depth is not None and args.by != "module":
        raise UsageError("--depth applies to --by module")
    roofs = _roofs(args.roofs)
    if args.tensorboard:
        summary_writer()  # a missing package is said before the model is built
    run = prepare()
    progress(args, f"profiling {label} on {run.device}: {args.warmup} warm-up, a join step, then {args.steps} profiled steps"
                   + (" (forward + backward)" if args.backward else "") + " ...")
    stage(args, f"profiling {label} (warm-up, join and profiled steps)")
    with hints(run):
        result = profile(run.model, run.inputs, run.kwargs, backward=args.backward, warmup=args.warmup, steps=args.steps,
                         device=run.device, roofs=roofs, keep_trace=args.trace is not None or bool(args.tensorboard))
    if args.format == "json":
        text = entry_json(result, label)
    elif args.format == "csv":
        text = profile_csv(result, by=args.by)
    elif args.format == "html":
        text = profile_html(result, entry=label, by=args.by, depth=args.depth)
    else:
        fmt = "github" if args.format == "markdown" else "simple"
        text = profile_table(result, by=args.by, limit=args.top, fmt=fmt, depth=args.depth)
    emit(text, args)
    if args.trace:
        written(args, "--trace", args.trace, lambda: result.export_chrome_trace(args.trace))
    if args.plot:
        written(args, "--plot", args.plot, lambda: result.plot_roofline(args.plot, label_top=6 if args.plot_top is None else args.plot_top))
    if args.tensorboard:
        table = profile_table(result, by="operator", limit=args.top, fmt="github")
        written(args, "--tensorboard", args.tensorboard, lambda: write_profile_tensorboard(
            result, args.tensorboard, label=label, top=args.top, table=table), f"wrote the profile to TensorBoard logs in {args.tensorboard}")
    return EXIT_OK
