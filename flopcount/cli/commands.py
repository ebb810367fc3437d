"""The commands: load the model from ENTRY, make inputs from SPECs, call the library, hand the
result to a renderer, write it (rendering lives in flopcount.report.render); ``diff``'s sides
and ``check --baseline``'s report, each an ENTRY counted as ``count`` counts it or a saved JSON
report; ``plan`` and ``check --fsdp/--tp``'s per-rank peak, on the meta device."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import inspect
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from flopcount.budget.check import Budget, check_result, flopcount_table, parse_memory_budget, table_budget
from flopcount.cli.deadline import stage
from flopcount.cli.latency import (
    benchmark_entry,
    check_timing_args,
    math_modes,
    predicted_latency_s,
    run_profile,
    with_prediction,
)
from flopcount.cli.output import (
    emit,
    progress,
    refuse_without_section_form,
    report_notes,
    say,
    slash_hint,
    with_section,
    written,
)
from flopcount.cli.parser import EXIT_BUDGET, EXIT_INCOMPLETE, EXIT_OK, pairs_once
from flopcount.cli.serving import count_generation_command, run_serve
from flopcount.core.rendering import render
from flopcount.core.results import load_report
from flopcount.diffs import check_growth, diff
from flopcount.diffs.gate import DEFAULT_GROWTH, parse_growth, table_growth
from flopcount.errors import TensorParallelPlanError, TraceError, UsageError
from flopcount.integrations.tensorboard import summary_writer, write_tensorboard
from flopcount.report.diff import unlike_sides
from flopcount.report.plot import check_plot_path, plot_result, plot_sunburst
from flopcount.report.render import entry_json, overall_status, render_bench, render_check, render_count


@dataclass
class _Run:
    """A loaded model and the inputs to call it with."""

    entry: str
    model: Any
    inputs: Any
    kwargs: Optional[Dict[str, Any]]
    device: str
    tracer: str
    #: what may be behind a failing forward, said with its error (and as warnings when it runs)
    hints: Tuple[str, ...] = ()
    #: the ENTRY's own inputs when --input gave others (said only with a failing forward)
    usual_inputs: str = ""


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


def _check_output(path: Optional[str], flag: str, *, folder: bool = False) -> None:
    """Refuse an output path that cannot be written before any long work starts: a FILE that is
    a folder (a DIR, ``folder``, that is a file), a path through a file, a place not writable.
    Missing folders are no reason: they are made when it is written (:func:`~flopcount.cli.output.written`),
    as ``--tensorboard DIR`` always made its own."""
    if path is None:
        return
    target = Path(path)
    if target.exists() and target.is_dir() != folder:
        raise UsageError(f"{flag} {path}: is a {'file' if folder else 'directory'}; {flag} takes a {'folder' if folder else 'file'}")
    existing = _nearest_existing(target)
    if existing != target and not existing.is_dir():
        raise UsageError(f"{flag} {path}: {existing} is a file, not a folder")
    writable = existing if existing != target else target.parent
    if not os.access(writable, os.W_OK) or (target.exists() and not os.access(target, os.W_OK)):
        raise UsageError(f"{flag} {path}: not writable")


def _nearest_existing(path: Path) -> Path:
    """``path``, or the nearest of its parents that exists (``.`` or ``/`` at the last)."""
    return next((p for p in (path, *path.parents) if p.exists()), Path("."))


def _entry_file(entry: str) -> Optional[Path]:
    """The source file of a ``path.py:attr`` or ``package.module:attr`` ENTRY, when it
    has one (after loading, so the module is already imported), or the file a saved
    artifact ENTRY reads (``model.pt2``, ``hf:./folder``'s config.json)."""
    from flopcount.cli.artifacts import artifact_file

    saved = artifact_file(entry)
    if saved is not None:
        return saved
    module_part, sep, _ = entry.strip().rpartition(":")
    if not sep or entry.strip().lower().startswith(("hf:", "transformers:", "tv:", "torchvision:")):
        return None
    if module_part.endswith(".py") or "/" in module_part or os.sep in module_part:
        return Path(module_part).expanduser()
    module = sys.modules.get(module_part)
    source = getattr(module, "__file__", None)
    return Path(source) if source else None


def _check_not_entry(path: Optional[str], flag: str, entry: str) -> None:
    """Refuse to write a report over the model's own source file."""
    if path is None:
        return
    source = _entry_file(entry)
    if source is not None and source.exists() and Path(path).exists() and Path(path).resolve() == source.resolve():
        raise UsageError(f"{flag} {path}: refusing to overwrite the source file of ENTRY {entry}; choose another file")


def _prepare(args: argparse.Namespace) -> _Run:
    device = _check_device(args.device)
    _check_not_entry(args.output, "--output", args.entry)
    if args.plot:
        _check_not_entry(args.plot, "--plot", args.entry)
        check_plot_path(args.plot)
    tracer = args.tracer
    if device == "meta":
        if tracer == "jit":
            raise UsageError("--device meta needs the dispatch tracer (torch.jit cannot trace data-less tensors); drop --tracer jit")
        tracer = "dispatch"
    kw_specs = pairs_once(args.kwargs, "--kwarg")
    config = pairs_once(args.config, "--config")

    from flopcount.cli.entry import load_entry
    from flopcount.cli.specs import make_inputs, token_range

    stage(args, f"the import and construction of the model ({args.entry}: its module, factory or config)")
    loaded = load_entry(args.entry, device=device, config=config, generating=bool(getattr(args, "generate", None)))
    stage(args, f"making the example inputs of {args.entry}")
    # a package.module ENTRY has a file now that it is imported
    _check_not_entry(args.output, "--output", args.entry)
    _check_not_entry(args.plot, "--plot", args.entry)
    model = loaded.model
    if loaded.no_jit is not None and tracer == "jit":
        raise UsageError(loaded.no_jit)
    if args.inputs or kw_specs:
        specs = list(args.inputs)
        if loaded.fit_specs is not None:  # an exported program: checked against its shapes, placed by position
            specs, kw_specs = loaded.fit_specs(specs, kw_specs)
        elif args.inputs and not getattr(args, "generate", None):  # defaults the prompt does not replace
            kw_specs = {**{k: v for k, v in loaded.default_kwargs.items() if k not in kw_specs}, **kw_specs}
        inputs, kwargs = make_inputs(specs, kw_specs, device, args.seed, token_range(model))
    else:
        inputs, kwargs = _entry_inputs(loaded, device, args.seed)
    _check_arity(args.entry, model, inputs, kwargs)
    hints = _numbers_as_tensors(model, kw_specs)
    usual = ""
    if args.inputs and loaded.default_specs and tuple(args.inputs) != tuple(loaded.default_specs):
        usual = " ".join(f"--input {spec}" for spec in loaded.default_specs)
    return _Run(args.entry, model, inputs, kwargs, device, tracer, hints=hints, usual_inputs=usual)


def _entry_inputs(loaded: Any, device: str, seed: int) -> Tuple[Any, Optional[Dict[str, Any]]]:
    """The example inputs the ENTRY returned, else its default inputs made from SPECs (none: no
    inputs at all); an ENTRY that needs inputs and has no default: its UsageError."""
    from flopcount.cli.specs import make_inputs, token_range

    if loaded.inputs is not None or loaded.kwargs is not None:
        return (loaded.inputs if loaded.inputs is not None else ()), loaded.kwargs
    if loaded.needs_inputs is not None and not (loaded.default_specs or loaded.default_kwargs):
        raise UsageError(loaded.needs_inputs)
    return make_inputs(list(loaded.default_specs), dict(loaded.default_kwargs), device, seed, token_range(loaded.model))


def _check_arity(entry: str, model: Any, inputs: Any, kwargs: Optional[Dict[str, Any]]) -> None:
    """Name a wrong number of inputs before tracing, with the forward's parameters."""
    from flopcount.core.inputs import as_call_args

    args, kw = as_call_args(inputs, kwargs)
    try:
        signature = inspect.signature(model.forward)
    except (TypeError, ValueError):
        return
    try:
        signature.bind(*args, **kw)
    except TypeError as exc:
        shown = _parameters_text(signature)
        given = f"{len(args)} positional input(s)" + (f" and keyword(s) {', '.join(kw)}" if kw else "")
        raise UsageError(
            f"the inputs do not fit {type(model).__name__}.forward({shown}) of {entry}: {exc}; got {given} "
            "(one --input per positional argument, --kwarg NAME=SPEC for keywords)"
        ) from exc


def _numbers_as_tensors(model: Any, kw_specs: Dict[str, Any]) -> Tuple[str, ...]:
    """``--kwarg scale=2`` is a tensor of shape (2,) (a bare integer is a SPEC); where ``forward``'s
    parameter of that name defaults to a number, how to pass the number instead, one line per such kwarg."""
    from flopcount.cli.specs import InputSpec

    try:
        parameters = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return ()
    hints = []
    for name, spec in kw_specs.items():
        parameter = parameters.get(name)
        if parameter is None or not isinstance(spec, InputSpec) or len(spec.shape) != 1:
            continue
        default = parameter.default
        if isinstance(default, (int, float)) and not isinstance(default, bool):
            number = spec.shape[0]
            hints.append(f"--kwarg {name}={spec} is a tensor of shape ({number},), but forward's {name} defaults to the "
                         f"number {default!r}: for the number write --kwarg {name}=int:{number} or {name}=float:{number}")
    return tuple(hints)


def _parameters_text(signature: inspect.Signature, most: int = 6) -> str:
    """The first ``most`` parameters of ``forward`` by name, with the ``*`` before keyword-only
    ones and ``*args`` / ``**kwargs`` as Python writes them (annotations and defaults left out)."""
    bare = [p.replace(annotation=inspect.Parameter.empty, default=inspect.Parameter.empty)
            for p in signature.parameters.values()]
    text = str(inspect.Signature(bare[:most]))[1:-1]
    return text + (", ..." if len(bare) > most else "")


def _dtype_hint(run: _Run, failed_in: Optional[str]) -> Optional[str]:
    """What the inputs' dtype has to do with a forward that failed in module ``failed_in``: an
    embedding given floating inputs (token ids written without ``:int64``), or floating inputs in
    another dtype than the model's parameters (``--input ...:bf16`` on a float32 model: the
    ``--dtype`` that makes them agree); None when neither."""
    from torch import nn

    from flopcount.core.inputs import flatten_tensors

    tensors, _ = flatten_tensors((run.inputs, run.kwargs))
    input_dtypes = {t.dtype for t in tensors if t.is_floating_point()}
    # by name among named_modules: a TorchScript model has no get_submodule
    failed = dict(run.model.named_modules()).get(failed_in or "")
    if input_dtypes and isinstance(failed, (nn.Embedding, nn.EmbeddingBag)):
        first_floating = next(t for t in tensors if t.is_floating_point())
        spec = "x".join(str(size) for size in first_floating.shape) + ":int64"
        return f"'{failed_in}' is an {type(failed).__name__}: token ids are integers, give them as SPEC:int64 (--input {spec})"
    param_dtypes = {p.dtype for p in run.model.parameters() if p.is_floating_point()}
    if len(input_dtypes) != 1 or len(param_dtypes) != 1 or input_dtypes == param_dtypes:
        return None
    from flopcount.types import dtype_name

    given = dtype_name(input_dtypes.pop())
    held = dtype_name(param_dtypes.pop())
    return (f"the floating inputs are {given} but the model's parameters are {held}: "
            f"--dtype {given} casts the model to the inputs' dtype")


def _shape_hint(run: _Run, failed_in: Optional[str]) -> Optional[str]:
    """What the module a forward failed in takes, where its shape rule is one line: a Linear's
    input ends in ``in_features``, a ConvNd's has ``in_channels`` before its N spatial dimensions
    (``--input 4x17`` into Linear(16, 32): torch says "mat1 and mat2 shapes cannot be multiplied
    (4x17 and 16x32)", which names neither); None for any other module."""
    from torch import nn

    failed = dict(run.model.named_modules()).get(failed_in or "") if failed_in else None
    if isinstance(failed, nn.Linear) and not isinstance(failed, nn.modules.lazy.LazyModuleMixin):
        return (f"'{failed_in}' is a Linear({failed.in_features} -> {failed.out_features}): "
                f"the last dimension of its input must be {failed.in_features}")
    if isinstance(failed, (nn.Conv1d, nn.Conv2d, nn.Conv3d)) and not isinstance(failed, nn.modules.lazy.LazyModuleMixin):
        spatial = "x".join("HWD"[i] if len(failed.kernel_size) > 1 else "L" for i in range(len(failed.kernel_size)))
        return (f"'{failed_in}' is a {type(failed).__name__} with {failed.in_channels} input channels: its input is "
                f"Nx{failed.in_channels}x{spatial} (or {failed.in_channels}x{spatial} unbatched)")
    return None


def _device_hint(run: _Run) -> Optional[str]:
    """Inputs on another device than the model's parameters (a factory that builds on meta, inputs
    made on cpu): the ``--device`` that puts them together; None when they agree."""
    from flopcount.core.inputs import flatten_tensors

    tensors, _ = flatten_tensors((run.inputs, run.kwargs))
    input_devices = {t.device.type for t in tensors}
    param_devices = {p.device.type for p in run.model.parameters()}
    if len(input_devices) != 1 or len(param_devices) != 1 or input_devices == param_devices:
        return None
    given, held = input_devices.pop(), param_devices.pop()
    return f"the inputs are on {given} but the model's parameters are on {held}: --device {held} makes the inputs there"


@contextlib.contextmanager
def forward_hints(run: _Run) -> Iterator[None]:
    """A forward failing in the block (a TraceError: count, bench, profile) with what the command
    line most likely got wrong added: the dtype or device of the inputs, a bare-integer --kwarg,
    else the ENTRY's own inputs."""
    try:
        yield
    except TraceError as exc:
        found = tuple(filter(None, (_dtype_hint(run, exc.module_path), _device_hint(run))))
        # nothing more specific: the inputs the ENTRY is known to take (not where the prompt ran and
        # a decode step failed: the prompt was not the fault), else the shape the failing layer takes
        if not found and run.usual_inputs and exc.decode_step is None:
            found = (f"{run.entry}'s own input is {run.usual_inputs} (leave --input out for it)",)
        elif not found:
            found = tuple(filter(None, (_shape_hint(run, exc.module_path),)))
        hints = (*run.hints, *found)
        if not hints:
            raise
        raise TraceError("; ".join((str(exc), *hints)), module_path=exc.module_path, input_shapes=exc.input_shapes) from exc


def _count(run: _Run, args: argparse.Namespace, backward: bool = False, optimizer: Optional[str] = None) -> Any:
    """The count, with its INCOMPLETE reasons and warnings said on stderr."""
    import warnings

    from flopcount.counting.count import count_flops
    from flopcount.errors import UnsupportedOpsWarning

    step = "forward + backward" + (f" + {optimizer} step" if optimizer else "") if backward or optimizer else "forward"
    stage(args, f"the {step} of {run.entry} (counting, tracer {run.tracer})")
    with warnings.catch_warnings():
        # ops without a handler are said once, as INCOMPLETE reasons (report_notes)
        warnings.simplefilter("ignore", UnsupportedOpsWarning)
        with forward_hints(run):
            result = count_flops(
                run.model, run.inputs, run.kwargs, tracer=run.tracer, backward=backward or optimizer is not None, optimizer=optimizer
            )
    if not args.quiet:
        for hint in run.hints:
            say(hint, "warning")
    report_notes(result, args)
    return result


def _strict_failure(result: Any, args: argparse.Namespace) -> bool:
    """``--strict`` and an op without a handler ran: say so (the caller exits 3)."""
    unsupported = result.unsupported_ops()
    if getattr(args, "strict", False) and unsupported:
        listing = ", ".join(f"{op} x{n}" for op, n in unsupported.items())
        say(f"--strict: op(s) without a handler ran: {listing}", "error")
        return True
    return False


def _plot(result: Any, args: argparse.Namespace, budget: Any = None) -> None:
    """``--plot``: FLOPs by module (or the sunburst), with the latencies of a benchmark the result holds."""
    if not args.plot:
        return
    latencies = None if result.benchmark is None else [v * 1e3 for v in result.benchmark.stats.samples_s]
    title = f"{_label(args)}  inputs: {result.input_description}" if result.input_description else _label(args)
    if args.plot_kind == "sunburst":
        written(args, "--plot", args.plot, lambda: plot_sunburst(result, args.plot, max_depth=args.depth or 3, title=title))
    else:
        written(args, "--plot", args.plot, lambda: plot_result(result, args.plot, top=args.plot_top or 15, depth=args.depth,
                                                               title=title, latencies_ms=latencies, budget=budget))


def _estimate_memory(run: _Run, args: argparse.Namespace, dtype: Optional[str] = None) -> Any:
    """Peak memory of one step: inference, or a training step with --backward / --optimizer."""
    from flopcount.memory.estimate import estimate_memory

    backward = bool(args.backward or args.optimizer is not None)
    what = "a training step" + (f" with {args.optimizer}" if args.optimizer else "") if backward else "inference"
    progress(args, f"estimating the peak memory of {what} on fake tensors ...")
    stage(args, f"the memory estimate of {run.entry} ({what} on fake tensors)")
    return estimate_memory(run.model, run.inputs, run.kwargs, backward=backward, optimizer=args.optimizer, dtype=dtype)


def _training_mode(run: _Run, args: argparse.Namespace) -> _Run:
    """A training step (--backward, --optimizer) runs in ``train()`` mode: BatchNorm on batch
    statistics, dropout on; ``--eval`` keeps the model in ``eval()``, and so does inference.
    The model is the CLI's own (built by ENTRY in eval mode), so switching it changes nothing
    of the user's. Returns ``run``."""
    if getattr(args, "eval_mode", False) or not (getattr(args, "backward", False) or getattr(args, "optimizer", None)):
        return run
    run.model.train()
    progress(args, "the training step runs in train() mode (--eval for eval() mode)")
    return run


def _cast(run: _Run, dtype: Optional[str]) -> _Run:
    """``count --dtype``: the model (the CLI's own copy) and its floating inputs in ``dtype``."""
    if dtype is None:
        return run
    import torch

    from flopcount.core.inputs import flatten_tensors

    target = getattr(torch, dtype)
    run.model.to(target)
    tensors, rebuild = flatten_tensors((run.inputs, run.kwargs))
    inputs, kwargs = rebuild([t.to(target) if t.is_floating_point() else t for t in tensors])
    return dataclasses.replace(run, inputs=inputs, kwargs=kwargs)


def _cmd_count(args: argparse.Namespace) -> int:
    if getattr(args, "tensorboard", None):
        summary_writer()  # a missing package is said before counting
    # said before any work, where --memory and --on were read after the count (or, with --generate, not at all)
    for flag, given in (("--memory", args.memory), ("--on", args.on)):
        if given and getattr(args, "generate", None):
            raise UsageError(f"--generate does not read {flag}: it reports the KV cache; generate()'s latency bounds and "
                             "memory per batch on a part are `flopcount serve ENTRY --on PART`")
        if given:
            refuse_without_section_form(args.format, flag)
    if getattr(args, "generate", None) and args.tracer != "auto":  # before: counted by dispatch, the flag unread
        raise UsageError(f"--generate counts every forward with the dispatch tracer (on fake copies for meta weights): "
                         f"drop --tracer {args.tracer}")
    math_modes(args, args.on)  # --matmul-tf32 without --on: one line before any work
    run = _cast(_prepare(args), args.dtype)
    if getattr(args, "generate", None):
        if args.tensorboard:
            raise UsageError("--tensorboard writes a count, not a generation: drop --generate or --tensorboard")
        with forward_hints(run):
            return count_generation_command(run, args, _label(args))
    # --optimizer: the training step (forward + backward + one optimizer step), the step --memory estimates
    if args.eval_mode and not (args.backward or args.optimizer is not None):
        raise UsageError("--eval applies to a training step: add --backward or --optimizer, or drop --eval")
    _training_mode(run, args)
    result = _count(run, args, backward=args.backward, optimizer=args.optimizer)
    text = render_count(result, args.format, entry=_label(args), depth=args.depth, operators=args.operators)
    if args.memory:
        estimate = _estimate_memory(run, args)
        text = with_section(text, args.format, "--memory", "memory", estimate.to_dict(),
                            lambda fmt: estimate.table(max_depth=args.depth, fmt=fmt))
    if args.on:
        text = with_prediction(text, run, args)
    emit(text, args)
    _plot(result, args)
    _tensorboard(result, args)
    return EXIT_INCOMPLETE if _strict_failure(result, args) else EXIT_OK


def _tensorboard(result: Any, args: argparse.Namespace) -> None:
    if not getattr(args, "tensorboard", None):
        return
    depth = 1 if args.depth is None else args.depth
    written(args, "--tensorboard", args.tensorboard, lambda: write_tensorboard(result, args.tensorboard, max_depth=depth,
            label=_label(args)), f"wrote TensorBoard scalars and tables to {args.tensorboard}")


def _label(args: argparse.Namespace) -> str:
    """ENTRY as the reports name it: with its --config overrides, e.g. ``hf:llama [num_hidden_layers=2]``."""
    overrides = ", ".join(f"{key}={value}" for key, value in getattr(args, "config", []) or [])
    return f"{args.entry} [{overrides}]" if overrides else args.entry


def _cmd_bench(args: argparse.Namespace) -> int:
    check_timing_args(args)
    run = _prepare(args)
    result = _count(run, args)
    with forward_hints(run):
        timing = benchmark_entry(run, args, result.flops)
    result = dataclasses.replace(result, benchmark=timing)
    emit(render_bench(result, timing, args.format, entry=_label(args), depth=args.depth), args)
    _plot(result, args)
    return EXIT_OK


def _cmd_check(args: argparse.Namespace) -> int:
    if args.max_latency is not None and args.max_latency_ms is not None:
        raise UsageError("--max-latency and --max-latency-ms both set the latency budget: give one")
    max_latency_ms = args.max_latency if args.max_latency is not None else args.max_latency_ms  # both flags read ms
    max_latency_s = None if max_latency_ms is None else max_latency_ms / 1000
    flags = Budget(
        max_params=args.max_params, max_flops=args.max_flops, max_macs=args.max_macs,
        max_size_mb=args.max_size_mb, max_latency_s=max_latency_s,
        max_memory=None if args.max_memory is None else parse_memory_budget(args.max_memory, "--max-memory"),
    )
    config_file = args.config_file or "pyproject.toml"
    table = flopcount_table(Path(config_file), required=args.config_file is not None)  # read once for all three
    budget = table_budget(table, config_file).merged(flags)
    if args.entry is None:
        _entry_from_config(args, table, config_file)
    gate = _gate_settings(args, table_growth(table, config_file))
    if not budget and gate is None:
        raise UsageError(
            "check: no budgets: give --max-params, --max-flops, --max-macs, --max-size-mb, --max-latency (or --max-latency-ms), "
            f"--max-memory or --baseline REPORT.json, or a [tool.flopcount] table in {config_file}"
        )
    if args.on is not None and not budget.needs_latency:
        raise UsageError("--on PART checks a latency budget: add --max-latency (e.g. --max-latency 10ms)")
    if getattr(args, "bound", None) is not None and args.on is None:
        raise UsageError("--bound picks the lower bound of --on PART: add --on (e.g. --on h100)")
    math_modes(args, args.on)  # --matmul-tf32 without --on, or on this machine: one line before any work
    if budget.needs_latency and args.on is None:
        check_timing_args(args)
        if args.device == "meta":
            raise UsageError("check: --max-latency-ms cannot be measured on the meta device; use --device cpu or cuda")
    run = _prepare(args)
    result = _count(run, args)
    latency = None
    basis = ""
    certain = True  # the latency bound's roofs are sane (not measured under load)
    if budget.needs_latency and args.on is not None:
        latency, basis, certain = predicted_latency_s(run, args)
    elif budget.needs_latency:
        with forward_hints(run):
            timing = benchmark_entry(run, args, result.flops)
        result = dataclasses.replace(result, benchmark=timing)
        latency = timing.median_s
    sharded = args.fsdp is not None or args.tp is not None
    gate_memory = gate is not None and "memory" in gate[1]
    if gate_memory and sharded:
        raise UsageError("--max-growth memory compares one process's peak; drop --fsdp/--tp or the memory allowance")
    wants_estimate = (budget.needs_memory and not sharded) or gate_memory
    estimate = None
    if wants_estimate:
        _training_mode(run, args)  # after the count: FLOPs budgets are of one inference forward
        estimate = _estimate_memory(run, args, dtype=args.dtype)
    planned = _planned_peak(args) if budget.needs_memory and sharded else None
    report = check_result(
        result,
        budget,
        latency_s=latency,
        memory_bytes=estimate.peak_bytes if estimate is not None else (planned[0] if planned is not None else None),
        allow_incomplete=args.allow_incomplete,
        latency_bound=("lower" if certain else "estimate") if args.on is not None else "exact",
        latency_basis=basis,
    ) if budget else None
    growth = _growth(result, estimate, gate, args) if gate is not None else None
    text = render_check(result, report, args.format, entry=_label(args), depth=args.depth, memory=estimate, planned=planned,
                        growth=growth)
    emit(text, args)
    _plot(result, args, budget=report)
    strict = _strict_failure(result, args)
    status = overall_status(report, growth)
    if status == "FAIL":  # certain (or allowed): more work can only make it worse
        if report is not None and report.status == "FAIL":
            say("budget exceeded: " + "; ".join(line.describe() for line in report.exceeded))
        if growth is not None and growth.status == "FAIL":
            say(growth.verdict())
        return EXIT_BUDGET
    if status != "PASS":  # INCOMPLETE, or UNDECIDED: a latency lower bound within its budget
        for r in (report, growth):
            if r is not None and r.status in ("INCOMPLETE", "UNDECIDED"):
                say(r.verdict())
        return EXIT_INCOMPLETE
    return EXIT_INCOMPLETE if strict else EXIT_OK


def _entry_from_config(args: argparse.Namespace, found: Optional[Dict[str, Any]], config_file: str) -> None:
    """``check`` without ENTRY: ``entry`` (and ``input``, unless --input is given) of
    [tool.flopcount], so a pre-commit hook or CI step needs no arguments."""
    from flopcount.cli.specs import parse_spec

    table = {str(k).replace("_", "-"): v for k, v in (found or {}).items()}
    entry = table.get("entry")
    if entry is None:
        raise UsageError(f"check: no ENTRY: give one (e.g. flopcount check model.py:build) or entry = \"model.py:build\" "
                         f"in [tool.flopcount] of {config_file}")
    if not isinstance(entry, str) or not entry.strip():
        raise UsageError(f"{config_file} [tool.flopcount]: entry must be an ENTRY string like \"model.py:build\"")
    args.entry = entry
    specs = table.get("input")
    if specs is not None and not args.inputs:
        specs = [specs] if isinstance(specs, str) else specs
        if not isinstance(specs, list) or not all(isinstance(s, str) for s in specs):
            raise UsageError(f"{config_file} [tool.flopcount]: input must be a SPEC or a list of them, like [\"8x16\"]")
        try:
            args.inputs = [parse_spec(text) for text in specs]
        except UsageError as exc:
            raise UsageError(f"{config_file} [tool.flopcount]: input: {exc}") from None


def _gate_settings(args: argparse.Namespace, settings: Any) -> Optional[Tuple[str, Dict[str, Any], Any]]:
    """The baseline report's path, the growth allowances (flag, else [tool.flopcount]'s
    ``settings``, else no growth of params, FLOPs and MACs) and the report read back; None
    without a baseline."""
    baseline = args.baseline or (str(settings.baseline) if settings.baseline is not None else None)
    if baseline is None:
        if args.max_growth is not None:
            raise UsageError("--max-growth needs --baseline REPORT.json (or baseline = \"...\" in [tool.flopcount])")
        return None
    allowances = args.max_growth or settings.allowances or parse_growth(DEFAULT_GROWTH, "default max-growth")
    report = baseline_report(baseline)
    if "memory" in allowances and not isinstance(report.sections.get("memory"), dict):
        raise UsageError(f"--baseline {baseline} has no peak memory for the memory allowance: write it with count --memory --format json")
    return baseline, dict(allowances), report


def _growth(result: Any, estimate: Any, gate: Tuple[str, Dict[str, Any], Any], args: argparse.Namespace) -> Any:
    """The current count against the baseline report, within the allowances."""
    path, allowances, baseline = gate
    if baseline.by_phase() and list(baseline.by_phase()) != list(result.by_phase()):
        raise UsageError(
            f"--baseline {path} counts {' + '.join(baseline.by_phase())}, check counts {' + '.join(result.by_phase()) or 'forward'}: "
            "write the baseline with count as check runs it (no --backward / --optimizer)"
        )
    current = result.with_sections(memory=estimate.to_dict()) if estimate is not None else result
    change = diff(baseline, current, a_label=path, b_label=_label(args))
    if not args.quiet:
        for note in unlike_sides(change):
            say(f"--baseline {path} (A) and this count (B): {note}", "warning")
    return check_growth(change, allowances, allow_incomplete=args.allow_incomplete)


# --------------------------------------------------------------------------- plan, and check's per-rank peak (--fsdp/--tp):
# the ENTRY loaded on the meta device, one rank's inputs made from SPECs, flopcount.plan called

def _meta_inputs(args: argparse.Namespace) -> Tuple[Any, Optional[Dict[str, Any]], str]:
    """One rank's micro-batch as meta tensors (shapes and dtypes are all plan() reads), and
    where it came from when no --input/--kwarg gave it ("" when they did)."""
    from flopcount.cli.artifacts import looks_like_artifact
    from flopcount.cli.entry import load_entry
    from flopcount.cli.specs import make_inputs

    kw_specs = pairs_once(args.kwargs, "--kwarg")
    if (args.inputs or kw_specs) and not looks_like_artifact(args.entry.strip()):
        return (*make_inputs(list(args.inputs), kw_specs, "meta"), "")
    loaded = load_entry(args.entry, device="meta", config=pairs_once(args.config, "--config"))
    if args.inputs or kw_specs:
        # an exported program's inputs are checked against its shapes (TorchScript's are not known)
        fit = loaded.fit_specs
        specs, kw_specs = fit(list(args.inputs), kw_specs) if fit is not None else (list(args.inputs), kw_specs)
        return (*make_inputs(specs, kw_specs, "meta"), "")
    inputs, kwargs = _entry_inputs(loaded, "meta", 0)
    if loaded.inputs is not None or loaded.kwargs is not None:
        return inputs, kwargs, f"the example inputs {args.entry} returned"
    shown = ", ".join([str(s) for s in loaded.default_specs] + [f"{k}={v}" for k, v in loaded.default_kwargs.items()]) or "no inputs"
    return inputs, kwargs, f"the default input of {args.entry} ({shown})"


#: what the CLI can do where the built-in tensor-parallel plan cannot split the model (it takes no plan of yours)
_CLI_TP_REMEDY = ("run with --tp 1 (FSDP alone), or plan your own split from Python: "
                  "flopcount.plan(build, inputs, tp=N, tp_plan={module path: ParallelStyle})")


def run_plan(args: argparse.Namespace, *, on: Optional[str], link: Any, optimizer: Optional[str], dtype: Optional[str]) -> Any:
    from flopcount.planning.plan import gpu_key, plan
    from flopcount.planning.result import link_bandwidth

    args.fsdp, args.tp = args.fsdp or 1, args.tp or 1
    if getattr(args, "mixed_precision", None) is not None and args.fsdp == 1:  # one line before any work
        raise UsageError("--mixed-precision is FSDP2's MixedPrecisionPolicy: it needs --fsdp > 1 (or cast the model "
                         "with --dtype)")
    gpu_key(on)  # bad --on or --link: one line before any work
    for value in (link.values() if isinstance(link, dict) else [link] if link is not None else []):
        link_bandwidth(value, "--link")
    stage(args, f"the import and construction of the model ({args.entry}, on the meta device)")
    inputs, kwargs, origin = _meta_inputs(args)
    if origin:
        progress(args, f"no --input: planning {origin}; --input SPEC sets one rank's micro-batch")
    progress(args, f"planning {args.entry} on a fake world of {args.fsdp} x {args.tp} ranks")
    stage(args, f"the plan of {args.entry} (its factory on the meta device, sharding, one fake training step)")
    from flopcount.cli.entry import meta_builder

    # an exported program's graph stays on the CPU, where plan's fake step runs
    try:
        result = plan(
            meta_builder(args, dtype, graph_device="cpu"), inputs, kwargs, fsdp=args.fsdp, tp=args.tp,
            optimizer=optimizer or "adamw", on=on, link=link,
            mixed_precision=getattr(args, "mixed_precision", None), backend=getattr(args, "backend", "nccl"),
        )
    except TensorParallelPlanError as exc:  # its remedy, tp_plan=, is the Python API's: say the CLI's
        remedies = f"{exc.choice}, {_CLI_TP_REMEDY}" if exc.choice else _CLI_TP_REMEDY
        raise UsageError(f"{exc.reason}: {remedies}") from exc
    if origin:
        note = f"no --input was given: the micro-batch is {origin}"
        result = dataclasses.replace(result, notes=(*result.notes, note))
    return result


def parse_link(text: Optional[str]) -> Any:
    """``nvlink4``, ``50e9`` (bytes/s), or ``dp=infiniband-ndr,tp=nvlink4``."""
    if text is None:
        return None

    def one(value: str) -> Any:
        try:
            return float(value)
        except ValueError:
            return value

    if "=" in text:
        pairs = [part.partition("=") for part in text.split(",")]
        return {key.strip(): one(value.strip()) for key, _, value in pairs}
    return one(text)


def _render_plan(result: Any, fmt: str, entry: str) -> str:
    if fmt == "json":
        return entry_json(result, entry)
    return result.to_markdown() if fmt == "markdown" else result.table()


def _planned_peak(args: argparse.Namespace) -> Tuple[int, str]:
    """Rank 0's peak of a training step sharded over --fsdp x --tp (flopcount plan), and what it is of."""
    from flopcount.units import format_bytes

    peak = int(run_plan(args, on=None, link=None, optimizer=args.optimizer, dtype=None).peak_bytes)
    return peak, (f"memory: peak {format_bytes(peak)} of rank 0 in a training step (forward + backward + "
                  f"{args.optimizer or 'adamw'}) sharded over fsdp={args.fsdp} x tp={args.tp} ranks (flopcount plan), not of inference")


def _cmd_plan(args: argparse.Namespace) -> int:
    result = run_plan(args, on=args.on, link=parse_link(args.link), optimizer=args.optimizer, dtype=args.dtype)
    emit(_render_plan(result, args.format, args.entry), args)
    return EXIT_OK


def _cmd_profile(args: argparse.Namespace) -> int:
    if args.eval_mode and not args.backward:
        raise UsageError("--eval applies to a training step: add --backward, or drop --eval")
    return run_profile(args, lambda: _training_mode(_prepare(args), args), _label(args), forward_hints)


def _cmd_roofs(args: argparse.Namespace) -> int:
    from flopcount.devices import is_this_machine, named_roofs
    from flopcount.devices.measured import machine_roofs

    modes = math_modes(args, args.part)  # refused on this machine
    if is_this_machine(args.part):
        progress(args, "measuring this machine's roofs (seconds) ..." if args.remeasure else "reading this machine's roofs ...")
        roofs = machine_roofs("cpu", refresh=args.remeasure)
        for problem in roofs.details.get("not_cached", ()):
            say(f"roofs not cached: {problem}", "warning")
    else:
        if args.remeasure:
            raise UsageError(f"--remeasure measures this machine; {args.part!r} is a datasheet part")
        roofs = named_roofs(args.part, conv_tf32=modes.conv_tf32, matmul_tf32=modes.matmul_tf32)
    emit(render(roofs, args.format), args)
    return EXIT_OK


# --------------------------------------------------------------------------- diff A B, and check --baseline's report

#: the options that shape an ENTRY side's count (meaningless for a saved report)
_SHARED = (("inputs", "--input"), ("kwargs", "--kwarg"), ("config", "--config"))


def is_report(text: str) -> bool:
    """A side is a saved report when it names a ``.json`` file (``count --format json``).
    A Hugging Face ``config.json`` is an ENTRY written ``hf:./path``."""
    lowered = text.strip().lower()
    return lowered.endswith(".json") and not lowered.startswith(("hf:", "transformers:"))


#: the other formats count writes a report in: read back by nothing (diff reads JSON)
_UNREAD_REPORTS = {".csv": "CSV", ".md": "markdown", ".html": "HTML", ".txt": "table"}


def _refuse_unread_report(name: str, text: str) -> None:
    """A side naming a report in a format diff does not read (``count -f csv -o r.csv``): one
    line saying which format it reads; before, an ENTRY's "not a model file (not a zip archive)"."""
    suffix = Path(text.strip()).suffix.lower()
    if suffix in _UNREAD_REPORTS and ":" not in text:
        raise UsageError(f"{name} = {text} is a {_UNREAD_REPORTS[suffix]} report: diff reads reports saved as JSON "
                         "(count ... --format json, or -o report.json) or counts an ENTRY")


def _merged(shared: List[Tuple[str, Any]], own: List[Tuple[str, Any]], flag: str) -> List[Tuple[str, Any]]:
    """``--config``/``--kwarg`` pairs of both sides, then one side's, the side's winning per key."""
    return list({**pairs_once(shared, flag), **pairs_once(own, flag)}.items())


def side_args(args: argparse.Namespace, side: str, entry: str) -> argparse.Namespace:
    """The options ``count`` would get for one side: the shared ones with the side's own over them."""
    ns = argparse.Namespace(**vars(args))
    ns.entry = entry
    ns.inputs = list(getattr(args, f"{side}_inputs")) or list(args.inputs)
    ns.kwargs = _merged(args.kwargs, getattr(args, f"{side}_kwargs"), f"--{side}-kwarg")
    ns.config = _merged(args.config, getattr(args, f"{side}_config"), f"--{side}-config")
    ns.output = ns.plot = ns.generate = ns.optimizer = None
    return ns


def count_side(args: argparse.Namespace, side: str, text: str) -> Any:
    """One side of a diff as a FlopResult: a saved report read back, or an ENTRY counted as
    ``count`` would (``--memory``: with its peak), with its ``entry`` label as a report section."""
    name = side.upper()
    if is_report(text):
        own = [f"--{side}-{flag[2:]}" for attr, flag in _SHARED if getattr(args, f"{side}_{attr}")]
        if own:
            raise UsageError(f"{', '.join(own)}: {name} is a saved report ({text}), not an ENTRY to count")
        return read_report(text, f"{name} = {text}")
    _refuse_unread_report(name, text)
    args = side_args(args, side, text)
    progress(args, f"counting {name} = {_label(args)} ...")
    with _naming_side(f"{name} = {_label(args)}"):
        run = _training_mode(_prepare(args), args)  # as count --backward: a training step runs in train() mode
        result = _count(run, args, backward=args.backward)
        sections: Dict[str, Any] = {"entry": _label(args)}
        if args.memory:
            sections["memory"] = _estimate_memory(run, args).to_dict()
    return result.with_sections(**sections)


@contextlib.contextmanager
def _naming_side(side: str) -> Iterator[None]:
    """A diff side's failure begun with the side (``B = new.py:build [hidden=48]: ...``): the
    progress line that named it is not printed under --quiet, and both sides may share an ENTRY."""
    try:
        yield
    except TraceError as exc:
        raise TraceError(f"{side}: {exc}", module_path=exc.module_path, input_shapes=exc.input_shapes) from exc
    except UsageError as exc:
        raise UsageError(f"{side}: {exc}") from exc


def _cmd_diff(args: argparse.Namespace) -> int:
    reports = [is_report(text) for text in (args.a, args.b)]
    if all(reports):
        used = [flag for attr, flag in _SHARED if getattr(args, attr)]
        used += [flag for flag, on in (("--backward", args.backward), ("--memory", args.memory)) if on]
        if used:
            raise UsageError(f"{', '.join(used)}: A and B are both saved reports; these options shape a count of an ENTRY")
    result_a = count_side(args, "a", args.a)
    result_b = count_side(args, "b", args.b)
    change = diff(result_a, result_b, a_label=_side_label(args.a, result_a), b_label=_side_label(args.b, result_b))
    emit(render_diff(change, args.format, depth=args.depth, top=args.top), args)
    return EXIT_OK


def _side_label(text: str, result: Any) -> str:
    """What a side is called: a report's path (with the ENTRY it was counted from), or the
    ENTRY with its --config overrides."""
    entry = result.sections.get("entry")
    if is_report(text):
        return f"{text} ({entry})" if entry else text
    return str(entry or text)


def render_diff(change: Any, fmt: str, *, depth: Optional[int], top: Optional[int]) -> str:
    if fmt == "json":
        return str(change.to_json(max_depth=depth))
    options: Dict[str, Any] = {"markdown": {"top": top or 10}, "csv": {}}.get(fmt, {"top": top})
    return str(render(change, fmt, max_depth=depth, **options))


def baseline_report(path: str) -> Any:
    """The saved report ``check --baseline`` compares with."""
    if not Path(path).is_file():
        here = path.replace("\\", "/") if slash_hint(path) else path
        raise UsageError(f"--baseline {path}: no such file{slash_hint(path)} "
                         f"(write it with: flopcount count ENTRY --format json --output {here})")
    return read_report(path, f"--baseline {path}")


def read_report(path: str, what: str) -> Any:
    """A saved count's report; one that is not a count's, said as what it is: a diff's
    (``diff --format json``), which a count's reader would call a report missing its params."""
    if not Path(path).is_file():
        raise UsageError(f"report {path}: no such file{slash_hint(path)}")
    try:
        return load_report(path)
    except UsageError:
        if _report_kind(path) == "diff":
            raise UsageError(f"{what} is a diff's report (flopcount diff --format json), not a count's: give the "
                             "report count --format json wrote (a diff holds two counts' totals, not one)") from None
        raise


def _report_kind(path: str) -> Optional[str]:
    """The ``kind`` a JSON report names (``"diff"``), or None."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    kind = data.get("kind") if isinstance(data, dict) else None
    return kind if isinstance(kind, str) else None


COMMANDS: Dict[str, Callable[[argparse.Namespace], int]] = {
    "count": _cmd_count, "bench": _cmd_bench, "check": _cmd_check, "profile": _cmd_profile, "plan": _cmd_plan,
    "diff": _cmd_diff, "roofs": _cmd_roofs, "serve": run_serve,
}


def run_command(args: argparse.Namespace) -> int:
    """The command ``args`` names, after refusing a report, plot or trace path that cannot be
    written (before any long work starts)."""
    for flag in ("output", "plot", "trace", "tensorboard"):
        _check_output(getattr(args, flag, None), f"--{flag}", folder=flag == "tensorboard")
    _refuse_plot_options_alone(args)
    return COMMANDS[args.command](args)


def _refuse_plot_options_alone(args: argparse.Namespace) -> None:
    """``--plot-kind`` / ``--plot-top`` shape the image ``--plot`` draws: without ``--plot`` nothing
    reads them (as ``--matmul-tf32`` without ``--on``), so they are refused, not ignored."""
    given = [flag for flag, value in (("--plot-kind", getattr(args, "plot_kind", None)),
                                      ("--plot-top", getattr(args, "plot_top", None))) if value is not None]
    if given and not getattr(args, "plot", None):
        flags = " and ".join(given)
        raise UsageError(f"{flags} shape{'s' if len(given) == 1 else ''} the image --plot FILE.png draws, and no --plot was "
                         f"given: add --plot (e.g. --plot flops.png) or drop {flags}")
