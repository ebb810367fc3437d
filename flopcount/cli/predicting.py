"""The CLI's roofline wiring: ``profile`` (measured time joined with cost), ``count
--on DEVICE`` and ``check --max-latency T --on DEVICE`` (lower bounds)."""

from __future__ import annotations

import argparse
import json
from typing import Any, Callable, Tuple

from flopcount.cli.deadline import stage
from flopcount.cli.output import progress
from flopcount.cli.parser import EXIT_OK
from flopcount.errors import UsageError


def _predict(run: Any, args: argparse.Namespace, on: str) -> Any:
    from flopcount.profiling.predict import predict

    dtype = getattr(args, "dtype", None)
    progress(args, f"bounding the latency of {run.entry} on {on} (roofline, fake tensors) ...")
    stage(args, f"the latency bound of {run.entry} on {on}")
    return predict(run.model, run.inputs, run.kwargs, on=on, dtype=dtype, backward=bool(getattr(args, "backward", False)))


BOUND_NAMES = {"eager": "eager per-op", "any": "any-implementation"}


def predicted_latency_ms(run: Any, args: argparse.Namespace) -> Tuple[float, str]:
    """The roofline lower bound on ``--on DEVICE`` in ms, and which bound it is (said on
    stderr): ``--bound eager|any``, by default "any" on a datasheet part (a certain FAIL for
    an engine the user did not name) and "eager" on this machine (the program flopcount runs)."""
    from flopcount.devices import default_bound
    from flopcount.units import format_seconds

    result = _predict(run, args, args.on)
    kind = getattr(args, "bound", None) or default_bound(result.roofs)
    seconds = result.bound_s(kind)
    basis = f"{BOUND_NAMES[kind]} lower bound on {result.roofs.device}"
    progress(args, f"latency {basis}: {format_seconds(seconds)} (eager {format_seconds(result.latency_s)}, "
                   f"any implementation {format_seconds(result.any_s)}; {result.roofs.source}); a bound, not a forecast")
    return float(seconds * 1e3), basis


def with_prediction(text: str, run: Any, args: argparse.Namespace) -> str:
    """The count's report with the lower bound on ``--on DEVICE`` added."""
    from flopcount.report.profile import predict_table

    result = _predict(run, args, args.on)
    if args.format == "json":
        data = json.loads(text)
        data["predict"] = result.to_dict()
        return json.dumps(data, indent=2)
    if args.format in ("table", "tree", "markdown"):
        fmt = "github" if args.format == "markdown" else "simple"
        return text.rstrip("\n") + "\n\n" + predict_table(result, fmt=fmt)
    raise UsageError(f"--on has no {args.format} form; use --format table, tree, markdown or json")


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


def run_profile(
    args: argparse.Namespace, prepare: Callable[[], Any], emit: Callable[[str, argparse.Namespace], None], label: str
) -> int:
    """``flopcount profile``: check the flags, load the model (``prepare``), profile,
    render once, write the trace and the plot."""
    from flopcount.profiling.run import profile
    from flopcount.report.profile import profile_csv, profile_html, profile_table

    if args.device == "meta":
        raise UsageError("profile runs the model for real: use --device cpu or cuda, not meta")
    if args.tracer != "auto":
        raise UsageError("profile joins the profiler with flopcount's dispatch recorder on the real model: drop --tracer")
    if args.plot_kind != "bars":
        raise UsageError("profile --plot draws the roofline: drop --plot-kind")
    if args.depth is not None and args.by != "module":
        raise UsageError("--depth applies to --by module")
    roofs = _roofs(args.roofs)
    if args.tensorboard:
        from flopcount.integrations.tensorboard import summary_writer

        summary_writer()  # a missing package is said before the model is built
    run = prepare()
    progress(args, f"profiling {label} on {run.device}: {args.warmup} warm-up, a join step, then {args.steps} profiled steps"
                   + (" (forward + backward)" if args.backward else "") + " ...")
    stage(args, f"profiling {label} (warm-up, join and profiled steps)")
    result = profile(run.model, run.inputs, run.kwargs, backward=args.backward, warmup=args.warmup, steps=args.steps,
                     device=run.device, roofs=roofs, keep_trace=args.trace is not None or bool(args.tensorboard))
    if args.format == "json":
        text = json.dumps({"entry": label, **result.to_dict()}, indent=2)
    elif args.format == "csv":
        text = profile_csv(result, by=args.by)
    elif args.format == "html":
        text = profile_html(result, entry=label, by=args.by, depth=args.depth)
    else:
        fmt = "github" if args.format == "markdown" else "simple"
        text = profile_table(result, by=args.by, limit=args.top, fmt=fmt, depth=args.depth)
    emit(text, args)
    if args.trace:
        result.export_chrome_trace(args.trace)
        progress(args, f"wrote {args.trace}")
    if args.plot:
        result.plot_roofline(args.plot, label_top=6 if args.plot_top is None else args.plot_top)
        progress(args, f"wrote {args.plot}")
    if args.tensorboard:
        from flopcount.integrations.tensorboard import write_profile_tensorboard

        table = profile_table(result, by="operator", limit=args.top, fmt="github")
        try:
            write_profile_tensorboard(result, args.tensorboard, label=label, top=args.top, table=table)
        except OSError as exc:
            raise UsageError(f"--tensorboard {args.tensorboard}: {exc.strerror or exc}") from exc
        progress(args, f"wrote the profile to TensorBoard logs in {args.tensorboard}")
    return EXIT_OK
