"""benchmark(): latency and throughput of a model's forward, measured honestly.

Measurement (flopcount.bench.loop: the timing loop and its iteration control, a CPU clock or
CUDA events), statistics (flopcount.bench.stats, a pure function from samples to
:class:`LatencyStats`) and rendering (flopcount.report.bench) are separate pieces. What is
timed, and how: docs/benchmarking.md. The library never prints; warnings use
:class:`~flopcount.errors.FlopcountWarning` and are also stored on the result.
"""

from __future__ import annotations

import time
import warnings
from typing import Any, Callable, List, Mapping, Optional, Tuple, Union

import torch
from torch import nn

from flopcount.bench.device import autocast_context, bind_call, real_run, rss_bytes, synchronize
from flopcount.bench.loop import Clock, LoopPlan, Progress, cpu_block_runner, cuda_block_runner, run_iterations
from flopcount.bench.peak import mfu_part, mfu_peak
from flopcount.bench.result import BenchmarkResult
from flopcount.bench.stats import NOISE_SPREAD, compute_stats
from flopcount.core.deprecation import modeled_part
from flopcount.core.dtypes import optional_dtype
from flopcount.core.inputs import prepare_call, require_module
from flopcount.errors import FlopcountWarning, UsageError, int_at_least
from flopcount.types import dtype_name

# modules whose forward differs between train and eval mode
_TRAIN_SENSITIVE = (
    nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.FeatureAlphaDropout,
    nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm,
    nn.LazyBatchNorm1d, nn.LazyBatchNorm2d, nn.LazyBatchNorm3d,
    nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d,
    nn.LazyInstanceNorm1d, nn.LazyInstanceNorm2d, nn.LazyInstanceNorm3d,
)  # public classes: every torch subclass of the private _DropoutNd and _NormBase


def benchmark(
    model: nn.Module,
    inputs: Any = (),
    kwargs: Optional[Mapping[str, Any]] = None,
    *,
    warmup: int = 10,
    iters: Optional[int] = None,
    min_iters: int = 10,
    budget_s: float = 1.0,
    max_iters: int = 100_000,
    device: Union[None, str, torch.device] = None,
    dtype: Union[None, str, torch.dtype] = None,
    compile: Union[bool, Mapping[str, Any]] = False,
    batch_size: Optional[int] = None,
    flops: Any = None,
    peak_flops: Optional[float] = None,
    on: Optional[str] = None,
    noise_threshold: float = NOISE_SPREAD,
    timer: Optional[Clock] = None,
    progress: Optional[Progress] = None,
    warmup_progress: Optional[Progress] = None,
    gpu_name: Optional[str] = None,
) -> BenchmarkResult:
    """Median (and spread) latency of ``model(inputs, **kwargs)`` under
    ``torch.inference_mode()``, after ``warmup`` untimed calls.

    ``inputs``: a tuple is unpacked as positional arguments, anything else is one
    argument. ``iters`` times exactly that many calls; without it calls are timed
    until ``budget_s`` seconds passed and at least ``min_iters`` ran. ``device`` runs
    on that device (the model is moved for the run and moved back); ``dtype``
    (torch.float16/bfloat16 or a name: "bf16", "half"...; docs/api.md#dtypes) runs under ``torch.autocast``. ``compile=True`` (or a dict of
    ``torch.compile`` options) times ``torch.compile(model)``; its compiling first call
    is reported as ``compile_s`` (seconds). ``flops`` (a number or a ``FlopResult``) gives
    achieved FLOP/s = flops / median; ``mfu`` uses ``peak_flops`` (FLOP/s) or the
    dense peak of the modeled part ``on`` (default: the CUDA device's name; ``gpu_name=`` is
    its deprecated 0.2 name) from :mod:`flopcount.peaks`. ``timer``: a nanosecond clock replacing
    ``time.perf_counter_ns`` (tests). ``batch_size`` (samples per call, for
    ``throughput``) defaults to the leading dimension of the first input tensor; the
    result's ``batch_source`` says which was taken. ``progress(done, total)`` is called
    during the timed calls, ``warmup_progress(done, warmup)`` after each warm-up call.
    The model's flags, parameters, buffers and
    gradients are left as found. A train-mode dropout draws from torch's generator as your
    own calls would; the generator is set back afterwards only when this is the process's
    only Python thread (setting it back would rewind another thread's draws). A model or input without data (meta
    device, fake tensors) is refused with a :class:`UsageError`: there is nothing to time.
    """
    on = modeled_part(on, gpu_name, "benchmark", old="gpu_name")
    mfu_part("benchmark", on, peak_flops)  # as StepTimer's: an unknown part named now (before: no MFU, no word)
    require_module(model, "benchmark")
    dtype = optional_dtype(dtype, "benchmark: dtype", "autocast")
    int_at_least(warmup, 0, "benchmark: warmup")
    plan = LoopPlan(iters=iters, min_iters=min_iters, budget_s=budget_s, max_iters=max_iters)
    plan.validate()
    if batch_size is not None:
        int_at_least(batch_size, 1, "benchmark: batch_size")
    flop_count = _flops_value(flops)
    borrowed = real_run(model, inputs, kwargs, device, "benchmark")  # the inputs walked once, here
    call, dev = borrowed.call, borrowed.device
    amp = autocast_context(dev, dtype)
    clock: Clock = timer if timer is not None else time.perf_counter_ns
    batch, batch_source = batch_and_source(call, None, batch_size)
    notes: List[str] = []
    modules = list(model.modules())
    if batch_size is None and batch_source.startswith("dim 0") and _sequence_first(modules):
        notes.append(
            f"throughput takes batch {batch} from {batch_source}, but the model has a sequence-first layer "
            "(batch_first=False), whose batch is dim 1: pass batch_size (--batch-size) if dim 0 is the sequence"
        )
    training = any(m.training for m in modules)
    if any(m.training and isinstance(m, _TRAIN_SENSITIVE) for m in modules):
        notes.append("model is in training mode: dropout/batch-norm run as in training (call model.eval() to time inference)")

    compile_s: Optional[float] = None
    peak_mem: Optional[int] = None
    with borrowed.borrow(model) as on_device:
        fn: Callable[..., Any] = on_device
        if compile:
            options = dict(compile) if isinstance(compile, Mapping) else {}
            fn = torch.compile(on_device, **options)
        timed = bind_call(fn, borrowed.run)
        rss_before = rss_bytes() if dev.type == "cpu" else None
        with torch.inference_mode(), amp:
            if compile:
                t0 = clock()
                timed()
                synchronize(dev)
                compile_s = (clock() - t0) * 1e-9
            for done in range(1, warmup + 1):
                timed()
                if warmup_progress is not None:
                    synchronize(dev)  # so the report follows the work, not the launches
                    warmup_progress(done, warmup)
            synchronize(dev)
            if dev.type == "cuda":
                torch.cuda.reset_peak_memory_stats(dev)
                runner = cuda_block_runner(timed, dev)
            else:
                runner = cpu_block_runner(timed, clock)
            samples, wall_ns = run_iterations(runner, plan, clock, progress)
            if dev.type == "cuda":
                peak_mem = int(torch.cuda.max_memory_allocated(dev))
        if dev.type == "cpu":
            rss_after = rss_bytes()
            if rss_before is not None and rss_after is not None:
                peak_mem = max(0, rss_after - rss_before)

    stats = compute_stats(samples_s=samples)
    if stats.is_noisy(noise_threshold):
        notes.append(
            f"noisy measurement: IQR/median {100 * stats.rel_iqr:.1f}% > {100 * noise_threshold:.0f}% "
            f"(CV {100 * stats.cv:.1f}%): other load, frequency scaling or too short a budget"
        )
    peak, source = mfu_peak(dev, dtype, peak_flops, on)
    for note in notes:
        warnings.warn(note, FlopcountWarning, stacklevel=2)
    return BenchmarkResult(
        stats=stats,
        device=str(dev),
        timing="cuda_event" if dev.type == "cuda" else "perf_counter",
        warmup=warmup,
        batch_size=batch,
        batch_source=batch_source,
        dtype=None if dtype is None else dtype_name(dtype),
        compiled=bool(compile),
        compile_s=compile_s,
        wall_s=wall_ns * 1e-9,
        flops=flop_count,
        peak_flops=peak,
        peak_source=source,
        peak_memory_bytes=peak_mem,
        memory_kind=None if peak_mem is None else ("cuda max_memory_allocated" if dev.type == "cuda" else "cpu RSS growth"),
        threads=torch.get_num_threads(),
        training=training,
        noise_threshold=noise_threshold,
        warnings=tuple(notes),
    )


def batch_and_source(inputs: Any, kwargs: Optional[Mapping[str, Any]], batch_size: Optional[int]) -> Tuple[int, str]:
    """Samples per call for throughput, and where that number came from: ``batch_size``
    when given, else dim 0 of the first input tensor (wrong for a sequence-first input
    such as an LSTM's (T, B, F): pass ``batch_size`` there). ``inputs`` may be a PreparedCall."""
    if batch_size is not None:
        return batch_size, "as given"
    tensors = prepare_call(inputs, kwargs).tensors
    if not tensors:
        return 1, "no input tensor"
    first = tensors[0]
    if first.dim() == 0:
        return 1, "the first input is a scalar"
    return int(first.shape[0]), f"dim 0 of Tensor[{', '.join(str(d) for d in first.shape)}]"


def _sequence_first(modules: List[nn.Module]) -> bool:
    seq_first = (nn.RNNBase, nn.MultiheadAttention, nn.Transformer, nn.TransformerEncoderLayer, nn.TransformerDecoderLayer)
    return any(isinstance(m, seq_first) and not getattr(m, "batch_first", True) for m in modules)


def _flops_value(flops: Any) -> Optional[float]:
    if flops is None:
        return None
    if isinstance(flops, bool):
        raise UsageError("flops must be a number or a FlopResult, got a bool")
    if isinstance(flops, (int, float)):
        value = float(flops)
    elif hasattr(flops, "flops"):
        value = float(flops.flops)
    else:
        raise UsageError(f"flops must be a number or a FlopResult, got {type(flops).__name__}")
    if value < 0:
        raise UsageError(f"flops must be >= 0, got {value}")
    return value
