"""The ``flopcount`` command: count, bench, check. Only wiring: parse arguments, load
the model, call the library, print. ``main`` is the one place that prints and exits.

Exit codes: 0 ok; 1 a budget exceeded (check); 2 usage error, bad ENTRY or SPEC, model
construction failure, or a forward that fails (one line on stderr; ``--debug`` adds
the traceback); 130 interrupted.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import os
import sys
import time
import traceback
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, NoReturn, Optional, Sequence, Tuple

from .errors import FlopcountError, FlopcountWarning, TraceError, UsageError

FORMATS = ("table", "tree", "json", "csv", "markdown")
TRACER_CHOICES = ("auto", "jit", "dispatch")
BENCH_DTYPES = ("float32", "float16", "bfloat16")

EXIT_OK, EXIT_BUDGET, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130

_ENTRY_TEXT = """\
ENTRY
  package.module:attr     an importable module (the working directory is searched)
  path/to/file.py:attr    a Python file
      attr is an nn.Module, or a callable (factory or Module class) returning an
      nn.Module, a (module, example_inputs) pair or a (module, inputs, kwargs)
      triple; --config KEY=VALUE are passed to the callable as keyword arguments.
  hf:MODEL_TYPE           a transformers model from its default config, random
                          weights, no download (hf:gpt2, hf:bert, hf:llama);
                          --config KEY=VALUE overrides config fields
  tv:NAME                 torchvision.models.get_model(NAME, weights=None)

SPEC
  dims joined by 'x', optional ':dtype' (default float32): 1x3x224x224, 1x128:int64.
  Integer inputs are token ids within the model's smallest nn.Embedding (0 or 1
  without one); integer or bool --kwarg inputs whose name contains 'mask' are ones.
  Without --input: the factory's example inputs; 1x128:int64 for hf:, 1x3x224x224
  for tv:.

Numbers accept K/M/G/T suffixes (10^3..10^12) and scientific notation: 25M, 5G,
1.5T, 3e9.

Exit codes: 0 ok, 1 a budget exceeded, 2 usage error / bad ENTRY / bad SPEC /
model construction or forward failure (one line on stderr; --debug for the
traceback).
"""

_MAIN_EPILOG = """\
examples:
  flopcount count examples/resnet.py:resnet50 --input 1x3x224x224 --depth 2
  flopcount count hf:gpt2 --config n_layer=2 --format json --output gpt2.json
  flopcount bench examples/resnet.py:resnet18 --input 8x3x224x224 --iters 20
  flopcount check examples/resnet.py:resnet50 --input 1x3x224x224 --max-flops 10G --max-params 30M

'flopcount COMMAND --help' describes each command.
"""

_COUNT_EPILOG = """\
examples:
  flopcount count examples/resnet.py:resnet50 --input 1x3x224x224 --depth 2
  flopcount count examples.mobilenet:mobilenet_v2 --input 1x3x224x224 --format tree --depth 1
  flopcount count hf:bert --config num_hidden_layers=2 --input 2x64:int64 --format json
  flopcount count hf:llama --device meta --input 1x4096:int64 --depth 1
  flopcount count my_model.py:build --input 4x16 --kwarg mask=4x16:bool --format csv -o costs.csv
  flopcount count examples/resnet.py:resnet18 --input 1x3x224x224 --backward --depth 1
  flopcount count examples/resnet.py:resnet50 --input 1x3x224x224 --plot flops.png

""" + _ENTRY_TEXT

_BENCH_EPILOG = """\
examples:
  flopcount bench examples/resnet.py:resnet18 --input 8x3x224x224
  flopcount bench examples/resnet.py:resnet50 --input 1x3x224x224 --warmup 5 --iters 50 --format json
  flopcount bench hf:gpt2 --config n_layer=4 --input 1x256:int64 --device cuda --dtype bfloat16
  flopcount bench examples/vit.py:vit_tiny --input 16x3x32x32 --plot latency.png

Times model(*inputs) under torch.inference_mode() after --warmup untimed calls:
exactly --iters calls, or as many as fit in --duration seconds (at least 10).
Progress goes to stderr; stdout holds only the report.

""" + _ENTRY_TEXT

_CHECK_EPILOG = """\
examples:
  flopcount check examples/resnet.py:resnet50 --input 1x3x224x224 --max-params 30M --max-flops 10G
  flopcount check examples/resnet.py:resnet50 --input 1x3x224x224 --max-size-mb 100 --max-latency-ms 200
  flopcount check examples/resnet.py:resnet50 --input 1x3x224x224          # budgets from pyproject.toml

Budgets come from the flags and from [tool.flopcount] in ./pyproject.toml (or
--config-file); a flag wins over the file:

  [tool.flopcount]
  max-params = "30M"
  max-flops = "10G"
  max-macs = 5e9
  max-size-mb = 100        # parameters + buffers, serialised, 1 MB = 10^6 bytes
  max-latency-ms = 50      # median latency; runs the benchmark

A budget passes when actual <= limit. Prints budget vs actual with PASS/FAIL;
exits 1 naming the exceeded budgets on stderr.

""" + _ENTRY_TEXT


# =========================================================================== parser


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (exit 2) instead of usage + message."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _type(parse: Any) -> Any:
    def convert(text: str) -> Any:
        try:
            return parse(text)
        except UsageError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = getattr(parse, "__name__", "value")
    return convert


def _quantity(what: str) -> Any:
    from .specs import parse_quantity

    return _type(lambda text: parse_quantity(text, "budget"))


def _int_at_least(low: int, what: str) -> Any:
    def parse(text: str) -> int:
        from .specs import parse_quantity

        try:
            value = parse_quantity(text, what)
        except UsageError:
            value = None
        if not isinstance(value, int) or value < low:
            raise UsageError(f"must be an integer >= {low}, got {text!r}")
        return value

    return _type(parse)


def _positive_float(what: str) -> Any:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise UsageError(f"{what} must be a number, got {text!r}") from None
        if not value > 0 or value == float("inf"):
            raise UsageError(f"{what} must be > 0, got {text!r}")
        return value

    return _type(parse)


def _wrap(text: str) -> str:
    import textwrap

    return textwrap.fill(text, width=80)


def build_parser() -> argparse.ArgumentParser:
    """The ``flopcount`` argument parser (three subcommands)."""
    from . import __version__

    formatter = argparse.RawDescriptionHelpFormatter
    parser = _Parser(
        prog="flopcount",
        description="FLOPs, MACs, parameters and latency of PyTorch models, per operator and per module.",
        epilog=_MAIN_EPILOG,
        formatter_class=formatter,
    )
    parser.add_argument("--version", action="version", version=f"flopcount {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    count = commands.add_parser(
        "count",
        help="count FLOPs, MACs and parameters per module and operator",
        description=_wrap("Count FLOPs, MACs and parameters of one forward (and optionally backward) pass, per module "
        "and per operator. Convention: 1 MAC = 2 FLOPs; MACs count contraction ops only."),
        epilog=_COUNT_EPILOG,
        formatter_class=formatter,
    )
    _add_common(count)
    count.add_argument("--backward", action="store_true", help="also count the backward pass of sum(outputs) (dispatch tracer)")
    count.add_argument("--operators", action="store_true", help="also print the per-operator table (table and markdown formats)")
    count.set_defaults(handler=_cmd_count)

    bench = commands.add_parser(
        "bench",
        help="measure latency and throughput (plus FLOPs and achieved FLOP/s)",
        description=_wrap("Measure the latency of the model's forward: median, mean, p90, p99, min, max, std and "
        "throughput, with FLOPs and achieved FLOP/s."),
        epilog=_BENCH_EPILOG,
        formatter_class=formatter,
    )
    _add_common(bench)
    _add_timing(bench)
    bench.set_defaults(handler=_cmd_bench)

    check = commands.add_parser(
        "check",
        help="check budgets (params, FLOPs, MACs, size, latency); exit 1 when one is exceeded",
        description=_wrap("Compare the model with budgets from flags or [tool.flopcount] in pyproject.toml; print "
        "budget vs actual with PASS/FAIL and exit 1 when any budget is exceeded. Made for CI gates."),
        epilog=_CHECK_EPILOG,
        formatter_class=formatter,
    )
    _add_common(check)
    limits = check.add_argument_group("budgets (K/M/G/T suffixes and 1e9 notation accepted)")
    limits.add_argument("--max-params", type=_quantity("--max-params"), metavar="N", help="most parameters, e.g. 25M")
    limits.add_argument("--max-flops", type=_quantity("--max-flops"), metavar="N", help="most FLOPs of one forward, e.g. 5G")
    limits.add_argument("--max-macs", type=_quantity("--max-macs"), metavar="N", help="most MACs of one forward, e.g. 2.5G")
    limits.add_argument("--max-size-mb", type=_quantity("--max-size-mb"), metavar="X", help="most MB (10^6 bytes) of parameters + buffers")
    limits.add_argument("--max-latency-ms", type=_quantity("--max-latency-ms"), metavar="X", help="highest median latency in ms (runs the benchmark)")
    limits.add_argument("--config-file", metavar="PATH", help="read [tool.flopcount] from this TOML file instead of ./pyproject.toml")
    _add_timing(check)
    check.set_defaults(handler=_cmd_check)
    return parser


def _add_common(p: argparse.ArgumentParser) -> None:
    from .specs import parse_config_value, parse_kwarg, parse_spec

    p.add_argument("entry", metavar="ENTRY", help="the model: module:attr, file.py:attr, hf:MODEL_TYPE or tv:NAME (see below)")
    inputs = p.add_argument_group("inputs")
    inputs.add_argument("-i", "--input", dest="inputs", action="append", default=[], type=_type(parse_spec), metavar="SPEC",
                        help="a positional input tensor, e.g. 1x3x224x224 or 1x128:int64 (repeat for several)")
    inputs.add_argument("--kwarg", dest="kwargs", action="append", default=[], type=_type(parse_kwarg), metavar="NAME=SPEC",
                        help="a keyword input tensor, e.g. attention_mask=1x128:int64 (repeatable)")
    inputs.add_argument("--config", dest="config", action="append", default=[], type=_type(parse_config_value), metavar="KEY=VALUE",
                        help="hf: config override, or keyword argument of a factory (int/float/bool/str; repeatable)")
    inputs.add_argument("--device", default="cpu", metavar="D",
                        help="cpu (default), cuda, cuda:N, or meta (shapes only: no memory, dispatch tracer)")
    inputs.add_argument("--seed", type=_int_at_least(0, "--seed"), default=0, metavar="N", help="seed of the random example inputs (default 0)")

    run = p.add_argument_group("counting and output")
    run.add_argument("--tracer", choices=TRACER_CHOICES, default="auto", help="auto (default: jit, else dispatch), jit or dispatch")
    run.add_argument("--depth", type=_int_at_least(0, "--depth"), default=None, metavar="N",
                     help="module rows down to depth N (0 = whole model; default: all)")
    run.add_argument("-f", "--format", choices=FORMATS, default="table", help="table (default), tree, json, csv or markdown")
    run.add_argument("-o", "--output", metavar="FILE", help="write the report to FILE instead of stdout")
    run.add_argument("--plot", metavar="FILE.png", help="also draw FLOPs by module (and latency, for bench) into an image; needs flopcount[plot]")
    run.add_argument("--plot-top", type=_int_at_least(1, "--plot-top"), default=15, metavar="N", help="modules in the plot (default 15)")
    run.add_argument("-q", "--quiet", action="store_true", help="no progress or warnings on stderr")
    run.add_argument("--debug", action="store_true", help="show tracebacks and all warnings")


def _add_timing(p: argparse.ArgumentParser) -> None:
    timing = p.add_argument_group("timing")
    timing.add_argument("--warmup", type=_int_at_least(0, "--warmup"), default=10, metavar="N", help="untimed calls first (default 10)")
    timing.add_argument("--iters", type=_int_at_least(1, "--iters"), default=None, metavar="N", help="time exactly N calls (default: adaptive, see --duration)")
    timing.add_argument("--duration", type=_positive_float("--duration"), default=1.0, metavar="S",
                        help="without --iters, time calls for about S seconds, at least 10 calls (default 1)")
    timing.add_argument("--dtype", choices=BENCH_DTYPES, default=None, help="run under torch.autocast with this dtype (default: the model's own)")


# =========================================================================== main


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the CLI with ``argv`` (default ``sys.argv[1:]``); returns the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, or an argparse error (already printed)
        return exc.code if isinstance(exc.code, int) else (EXIT_USAGE if exc.code else EXIT_OK)
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    caught: List[warnings.WarningMessage] = []
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("default")
            return args.handler(args)
    except KeyboardInterrupt:
        _say("interrupted", "error")
        return EXIT_INTERRUPTED
    except FlopcountError as exc:
        if args.debug:
            traceback.print_exc()
        _say(_one_line(_describe_error(exc)), "error")
        return EXIT_USAGE
    except Exception as exc:  # a model's own code failing outside a tracer (e.g. during the benchmark)
        if args.debug:
            traceback.print_exc()
        _say(_one_line(f"{type(exc).__name__}: {exc}"), "error")
        return EXIT_USAGE
    finally:
        _report_warnings(caught, args)


def _say(message: str, kind: str = "") -> None:
    print(f"flopcount: {kind}: {message}" if kind else f"flopcount: {message}", file=sys.stderr, flush=True)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _describe_error(exc: FlopcountError) -> str:
    text = str(exc)
    if isinstance(exc, TraceError) and exc.module_path and exc.module_path not in text:
        text = f"{text} (module: {exc.module_path})"
    return text


def _report_warnings(caught: Sequence[warnings.WarningMessage], args: argparse.Namespace) -> None:
    if args.quiet:
        return
    seen = set()
    for w in caught:
        ours = issubclass(w.category, FlopcountWarning)
        if not ours and not args.debug:
            continue  # torch.jit TracerWarnings and the like: noise for this report
        text = _one_line(str(w.message))
        if text in seen:
            continue
        seen.add(text)
        _say(text if ours else f"{w.category.__name__}: {text}", "warning")


def _progress(args: argparse.Namespace, message: str) -> None:
    if not args.quiet:
        _say(message)


def _iteration_progress() -> Callable[[int, Optional[int]], None]:
    """Benchmark progress on stderr, at most about twice a second; stdout stays clean."""
    last = [0.0]

    def report(done: int, total: Optional[int]) -> None:
        now = time.monotonic()
        if total is None or done < total:
            if now - last[0] < 0.5:
                return
        last[0] = now
        _say(f"  {done}/{total} calls" if total else f"  {done} calls")

    return report


# =========================================================================== preparing a run


@dataclass
class _Run:
    """A loaded model and the inputs to call it with."""

    entry: str
    model: Any
    inputs: Any
    kwargs: Optional[Dict[str, Any]]
    device: str
    tracer: str


def _check_device(text: str) -> str:
    import torch

    try:
        device = torch.device(text)
    except (RuntimeError, TypeError, ValueError):
        raise UsageError(f"--device {text!r} is not a device (cpu, cuda, cuda:N or meta)") from None
    if device.type not in ("cpu", "cuda", "meta"):
        raise UsageError(f"--device {text!r}: flopcount runs on cpu, cuda or meta")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise UsageError(f"--device {text} was requested but CUDA is not available (torch {torch.__version__}); use --device cpu or meta")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise UsageError(f"--device {text}: only {torch.cuda.device_count()} CUDA device(s) are visible")
    return str(device)


def _check_output(path: Optional[str], flag: str) -> None:
    """Refuse an output path that cannot be written before any long work starts."""
    if path is None:
        return
    target = Path(path)
    if target.is_dir():
        raise UsageError(f"{flag} {path}: is a directory")
    folder = target.parent if str(target.parent) else Path(".")
    if not folder.is_dir():
        raise UsageError(f"{flag} {path}: folder {folder} does not exist")
    if not os.access(folder, os.W_OK) or (target.exists() and not os.access(target, os.W_OK)):
        raise UsageError(f"{flag} {path}: not writable")


def _prepare(args: argparse.Namespace) -> _Run:
    device = _check_device(args.device)
    _check_output(args.output, "--output")
    if args.plot:
        from .report.plot import check_plot_path

        _check_output(args.plot, "--plot")
        check_plot_path(args.plot)
    tracer = args.tracer
    if device == "meta":
        if tracer == "jit":
            raise UsageError("--device meta needs the dispatch tracer (torch.jit cannot trace data-less tensors); drop --tracer jit")
        tracer = "dispatch"
    kw_specs: Dict[str, Any] = {}
    for name, spec in args.kwargs:
        if name in kw_specs:
            raise UsageError(f"--kwarg {name} is given twice")
        kw_specs[name] = spec
    config: Dict[str, Any] = {}
    for key, value in args.config:
        if key in config:
            raise UsageError(f"--config {key} is given twice")
        config[key] = value

    from .entry import load_entry

    loaded = load_entry(args.entry, device=device, config=config)
    model = loaded.model
    if args.inputs or kw_specs:
        inputs, kwargs = _make_inputs(model, args.inputs, kw_specs, device, args.seed)
    elif loaded.inputs is not None or loaded.kwargs is not None:
        inputs = loaded.inputs if loaded.inputs is not None else ()
        kwargs = loaded.kwargs
    elif loaded.default_specs:
        inputs, kwargs = _make_inputs(model, list(loaded.default_specs), dict(loaded.default_kwargs), device, args.seed)
    else:
        inputs, kwargs = (), None
    _check_arity(args.entry, model, inputs, kwargs)
    return _Run(args.entry, model, inputs, kwargs, device, tracer)


def _make_inputs(model: Any, specs: Sequence[Any], kw_specs: Dict[str, Any], device: str, seed: int) -> Tuple[Any, Optional[Dict[str, Any]]]:
    import torch

    from .specs import make_tensor, token_range

    generator = torch.Generator().manual_seed(seed)
    high = token_range(model)
    inputs = tuple(make_tensor(spec, device=device, high=high, generator=generator) for spec in specs)
    kwargs = {
        name: make_tensor(
            spec, device=device, high=high, generator=generator,
            ones="mask" in name.lower() and not (spec.dtype.is_floating_point or spec.dtype.is_complex),
        )
        for name, spec in kw_specs.items()
    }
    return inputs, (kwargs or None)


def _check_arity(entry: str, model: Any, inputs: Any, kwargs: Optional[Dict[str, Any]]) -> None:
    """Name a wrong number of inputs before tracing, with the forward's parameters."""
    from .tracers.modules import as_call_args

    args, kw = as_call_args(inputs, kwargs)
    try:
        signature = inspect.signature(model.forward)
    except (TypeError, ValueError):
        return
    try:
        signature.bind(*args, **kw)
    except TypeError as exc:
        names = [p.name for p in signature.parameters.values()]
        shown = ", ".join(names[:6]) + (", ..." if len(names) > 6 else "")
        given = f"{len(args)} positional input(s)" + (f" and keyword(s) {', '.join(kw)}" if kw else "")
        raise UsageError(
            f"the inputs do not fit {type(model).__name__}.forward({shown}) of {entry}: {exc}; got {given} "
            "(one --input per positional argument, --kwarg NAME=SPEC for keywords)"
        ) from exc


def _count(run: _Run, backward: bool = False) -> Any:
    from .analysis import count_flops

    return count_flops(run.model, run.inputs, run.kwargs, tracer=run.tracer, backward=backward)


def _benchmark(run: _Run, args: argparse.Namespace, flops: Any) -> Any:
    if run.device == "meta":
        raise UsageError("cannot time a model on the meta device (it has no data); use --device cpu or cuda")
    try:
        from . import bench
    except ImportError as exc:
        raise UsageError(f"benchmarking is not available in this installation: {exc}") from exc
    import torch

    dtype = None if args.dtype is None else getattr(torch, args.dtype)
    how_many = f"{args.iters} timed calls" if args.iters else f"timed calls for about {args.duration:g} s"
    _progress(args, f"benchmarking {run.entry} on {run.device}: {args.warmup} warm-up calls, then {how_many} ...")
    try:
        result = bench.benchmark(
            run.model, run.inputs, run.kwargs,
            warmup=args.warmup, iters=args.iters, budget_s=args.duration,
            device=run.device, dtype=dtype, flops=flops,
            progress=None if args.quiet else _iteration_progress(),
        )
    except FlopcountError:
        raise
    except Exception as exc:
        raise UsageError(f"the forward of {run.entry} failed during the benchmark: {type(exc).__name__}: {exc}") from exc
    _progress(args, f"timed {result.iters} calls in {result.wall_s:.2f} s (median {result.median_ms:.3f} ms)")
    return result


def _emit(text: str, args: argparse.Namespace) -> None:
    if not text.endswith("\n"):
        text += "\n"
    if args.output:
        try:
            Path(args.output).write_text(text, encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"--output {args.output}: {exc.strerror or exc}") from exc
        _progress(args, f"wrote {args.output}")
    else:
        sys.stdout.write(text)
        sys.stdout.flush()


def _plot(result: Any, args: argparse.Namespace, latencies: Optional[Sequence[float]] = None) -> None:
    if not args.plot:
        return
    from .report.plot import plot_result

    title = f"{args.entry}  inputs: {result.input_description}" if result.input_description else args.entry
    try:
        plot_result(result, args.plot, top=args.plot_top, depth=args.depth, title=title, latencies_ms=latencies)
    except OSError as exc:
        raise UsageError(f"--plot {args.plot}: {exc.strerror or exc}") from exc
    _progress(args, f"wrote {args.plot}")


def _json(data: Dict[str, Any]) -> str:
    return json.dumps(data, indent=2)


def _result_dict(result: Any, entry: str) -> Dict[str, Any]:
    data = {"entry": entry}
    data.update(result.to_dict())
    return data


# =========================================================================== commands


def _cmd_count(args: argparse.Namespace) -> int:
    run = _prepare(args)
    result = _count(run, backward=args.backward)
    _emit(_render_result(result, args, operators=args.operators), args)
    _plot(result, args)
    return EXIT_OK


def _render_result(result: Any, args: argparse.Namespace, operators: bool = False) -> str:
    fmt = args.format
    if fmt == "json":
        return _json(_result_dict(result, args.entry))
    if fmt == "csv":
        return result.to_csv(max_depth=args.depth)
    if fmt == "tree":
        return result.tree(max_depth=args.depth)
    if fmt == "markdown":
        text = result.to_markdown(max_depth=args.depth)
        return text + ("\n" + _operator_rows(result, "github") if operators else "")
    text = result.table(max_depth=args.depth)
    return text + ("\n\n" + _operator_rows(result, "simple") if operators else "")


def _operator_rows(result: Any, fmt: str) -> str:
    """The per-operator table without the totals footer the module table already shows."""
    from .report import table

    text = table.operator_table(result, fmt=fmt)
    footer = "\n".join(table._footer(result))
    return text[: -len(footer)].rstrip("\n") if text.endswith(footer) else text


def _cmd_bench(args: argparse.Namespace) -> int:
    run = _prepare(args)
    result = _count(run)
    timing = _benchmark(run, args, result.flops)
    result = dataclasses.replace(result, benchmark=timing)
    _emit(_render_bench(result, timing, args), args)
    _plot(result, args, latencies=timing.stats.samples_ms)
    return EXIT_OK


def _bench_rows(result: Any, timing: Any) -> List[Tuple[str, str, Any]]:
    """(label, human text, raw value) for each line of the bench summary."""
    from .report.units import format_bytes, format_count, format_ms, with_unit

    rows: List[Tuple[str, str, Any]] = [
        ("median", format_ms(timing.median_ms), timing.median_ms),
        ("mean", format_ms(timing.mean_ms), timing.mean_ms),
        ("p90", format_ms(timing.p90_ms), timing.p90_ms),
        ("p99", format_ms(timing.p99_ms), timing.p99_ms),
        ("min", format_ms(timing.min_ms), timing.min_ms),
        ("max", format_ms(timing.max_ms), timing.max_ms),
        ("std", format_ms(timing.std_ms), timing.std_ms),
        ("iterations", str(timing.iters), timing.iters),
        ("throughput", f"{timing.throughput:.1f} samples/s (batch {timing.batch_size})", timing.throughput),
        ("FLOPs", with_unit(result.flops, "FLOPs"), result.flops),
        ("MACs", with_unit(result.macs, "MACs"), result.macs),
        ("params", format_count(result.params), result.params),
    ]
    achieved = getattr(timing, "achieved_flops_per_s", None)
    if achieved is not None:
        rows.append(("achieved", with_unit(achieved, "FLOP/s"), achieved))
    mfu = getattr(timing, "mfu", None)
    if mfu is not None:
        rows.append(("MFU", f"{100 * mfu:.2f}%", mfu))
    memory = getattr(timing, "peak_memory_bytes", None)
    if memory is not None:
        rows.append((f"memory ({timing.memory_kind})", format_bytes(memory), memory))
    return rows


def _render_bench(result: Any, timing: Any, args: argparse.Namespace) -> str:
    from tabulate import tabulate

    fmt = args.format
    if fmt == "json":
        return _json(_result_dict(result, args.entry))
    rows = _bench_rows(result, timing)
    if fmt == "csv":
        lines = ["metric,value"] + [f"{_csv_key(label)},{raw}" for label, _, raw in rows]
        return "\n".join(lines)
    mode = "eager" if not getattr(timing, "compiled", False) else "torch.compile"
    heading = (
        f"{args.entry} | inputs {result.input_description or '()'} | {timing.device} ({timing.timing}, {mode}, "
        f"dtype {timing.dtype or 'as model'}) | {timing.warmup} warm-up calls"
    )
    table = tabulate([[label, text] for label, text, _ in rows], headers=["Latency", "Value"],
                     tablefmt="github" if fmt == "markdown" else "simple", colalign=("left", "right"))
    parts = [f"**{heading}**\n" if fmt == "markdown" else heading, table]
    if fmt == "tree":
        parts.append(result.tree(max_depth=args.depth))
    return "\n".join(parts)


def _csv_key(label: str) -> str:
    return label.split(" (")[0].lower().replace(" ", "_")


def _cmd_check(args: argparse.Namespace) -> int:
    from .budget import Budget, check_result, load_budget_file

    flags = Budget(
        max_params=args.max_params, max_flops=args.max_flops, max_macs=args.max_macs,
        max_size_mb=args.max_size_mb, max_latency_ms=args.max_latency_ms,
    )
    config_file = args.config_file or "pyproject.toml"
    budget = load_budget_file(config_file, required=args.config_file is not None).merged(flags)
    if not budget:
        raise UsageError(
            "check: no budgets: give --max-params, --max-flops, --max-macs, --max-size-mb or --max-latency-ms, "
            f"or a [tool.flopcount] table in {config_file}"
        )
    if budget.needs_latency and args.device == "meta":
        raise UsageError("check: --max-latency-ms cannot be measured on the meta device; use --device cpu or cuda")
    run = _prepare(args)
    result = _count(run)
    latency = None
    if budget.needs_latency:
        timing = _benchmark(run, args, result.flops)
        result = dataclasses.replace(result, benchmark=timing)
        latency = timing.median_ms
    report = check_result(result, budget, latency_ms=latency)
    _emit(_render_check(result, report, args), args)
    _plot(result, args, latencies=None if latency is None else result.benchmark.stats.samples_ms)
    if not report.passed:
        _say("budget exceeded: " + "; ".join(line.describe() for line in report.exceeded))
        return EXIT_BUDGET
    return EXIT_OK


def _render_check(result: Any, report: Any, args: argparse.Namespace) -> str:
    fmt = args.format
    if fmt == "json":
        data = _result_dict(result, args.entry)
        data["budget"] = report.to_dict()
        return _json(data)
    if fmt == "csv":
        return report.to_csv()
    failed = [line.name for line in report.exceeded]
    verdict = (
        f"PASS: all {len(report.lines)} budget(s) met"
        if report.passed
        else f"FAIL: {len(failed)} of {len(report.lines)} budget(s) exceeded: {', '.join(failed)}"
    )
    heading = f"{args.entry} | inputs {result.input_description or '()'}"
    if fmt == "markdown":
        return f"**{heading}**\n\n{report.table(fmt='github')}\n\n**{verdict}**"
    parts = [heading, report.table(), verdict]
    if fmt == "tree":
        parts += ["", result.tree(max_depth=args.depth)]
    return "\n".join(parts)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
