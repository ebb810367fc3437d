"""Latency and throughput of a model's forward, measured honestly.

Three separate pieces, each testable on its own:

* measurement — :func:`run_iterations` (the timing loop and its iteration control)
  with a CPU clock or CUDA events;
* statistics — :func:`compute_stats`, a pure function from samples to
  :class:`LatencyStats`;
* rendering — :meth:`BenchmarkResult.to_dict` and ``str(result)``.

What is measured: the wall time of one ``model(*args, **kwargs)`` call under
``torch.inference_mode()``, after ``warmup`` untimed calls. On CPU each iteration is
bracketed by ``time.perf_counter_ns()`` (or the injected ``timer``); on CUDA by a pair
of ``torch.cuda.Event(enable_timing=True)`` recorded on the current stream, read after
a synchronisation, so asynchronous kernel launches are not mistaken for completed
work. The library never prints; warnings use :class:`~flopcount.errors.FlopcountWarning`
and are also stored on the result.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import torch
from torch import nn

from . import peaks
from .errors import FlopcountWarning, UsageError
from .tracers.modules import as_call_args, flatten_tensors

#: A clock returning integer nanoseconds, like :func:`time.perf_counter_ns`.
Clock = Callable[[], int]

#: Relative spread (IQR / median) above which a measurement is called noisy.
NOISE_SPREAD = 0.10

_AUTOCAST_DTYPES = (torch.float16, torch.bfloat16)
# modules whose forward differs between train and eval mode
_TRAIN_SENSITIVE = (nn.modules.dropout._DropoutNd, nn.modules.batchnorm._NormBase)


# =========================================================================== statistics


@dataclass(frozen=True)
class LatencyStats:
    """Summary of per-iteration latencies, in milliseconds.

    Percentiles use linear interpolation between closest ranks (numpy's default
    ``method="linear"``: rank ``p/100 * (n-1)`` in the sorted samples); ``std_ms`` is the
    sample standard deviation (``ddof=1``, 0 for one sample); ``cv = std / mean``;
    ``iqr_ms = p75 - p25``; ``rel_iqr = iqr / median``, the robust spread used to
    call a run noisy (the CV is reported too, but one interrupt or GC pause inflates it).
    """

    iters: int
    median_ms: float
    mean_ms: float
    p90_ms: float
    p99_ms: float
    min_ms: float
    max_ms: float
    std_ms: float
    cv: float
    iqr_ms: float
    rel_iqr: float
    samples_ms: Tuple[float, ...] = field(default=(), repr=False)

    def is_noisy(self, threshold: float = NOISE_SPREAD) -> bool:
        """True when the robust relative spread (IQR / median) exceeds ``threshold``,
        the criterion ``torch.utils.benchmark`` warns on."""
        return self.rel_iqr > threshold

    def to_dict(self, samples: bool = False) -> Dict[str, Any]:
        out: Dict[str, Any] = {
            "iters": self.iters,
            "median_ms": self.median_ms,
            "mean_ms": self.mean_ms,
            "p90_ms": self.p90_ms,
            "p99_ms": self.p99_ms,
            "min_ms": self.min_ms,
            "max_ms": self.max_ms,
            "std_ms": self.std_ms,
            "cv": self.cv,
            "iqr_ms": self.iqr_ms,
            "rel_iqr": self.rel_iqr,
        }
        if samples:
            out["samples_ms"] = list(self.samples_ms)
        return out


def percentile(sorted_values: Sequence[float], p: float) -> float:
    """The ``p``-th percentile (0..100) of already sorted values, linear interpolation
    between closest ranks: rank ``r = p/100 * (n-1)``, value ``v[floor r] + frac(r) *
    (v[ceil r] - v[floor r])`` (numpy's default method)."""
    n = len(sorted_values)
    if n == 0:
        raise UsageError("percentile of no samples")
    if not 0.0 <= p <= 100.0:
        raise UsageError(f"percentile must be within 0..100, got {p}")
    rank = p / 100.0 * (n - 1)
    lo = math.floor(rank)
    hi = min(lo + 1, n - 1)
    frac = rank - lo
    return float(sorted_values[lo] + frac * (sorted_values[hi] - sorted_values[lo]))


def compute_stats(samples_ms: Sequence[float]) -> LatencyStats:
    """Statistics of per-iteration latencies (ms); see :class:`LatencyStats` for the
    conventions. Pure: no torch, no clock."""
    values = sorted(float(s) for s in samples_ms)
    n = len(values)
    if n == 0:
        raise UsageError("no latency samples to summarise")
    mean = math.fsum(values) / n
    var = math.fsum((v - mean) ** 2 for v in values) / (n - 1) if n > 1 else 0.0
    std = math.sqrt(var)
    median = percentile(values, 50.0)
    iqr = percentile(values, 75.0) - percentile(values, 25.0)
    return LatencyStats(
        iters=n,
        median_ms=median,
        mean_ms=mean,
        p90_ms=percentile(values, 90.0),
        p99_ms=percentile(values, 99.0),
        min_ms=values[0],
        max_ms=values[-1],
        std_ms=std,
        cv=std / mean if mean > 0 else 0.0,
        iqr_ms=iqr,
        rel_iqr=iqr / median if median > 0 else 0.0,
        samples_ms=tuple(float(s) for s in samples_ms),
    )


# =========================================================================== measurement

#: ``run_block(n)`` runs ``n`` timed iterations and returns their latencies in ms.
BlockRunner = Callable[[int], List[float]]


@dataclass(frozen=True)
class LoopPlan:
    """How many iterations to time: exactly ``iters`` when given; otherwise blocks of
    iterations until ``budget_s`` of wall time is spent and at least ``min_iters`` ran,
    never more than ``max_iters`` (the scheme of ``torch.utils.benchmark``'s
    ``blocked_autorange``, but keeping every iteration's sample)."""

    iters: Optional[int] = None
    min_iters: int = 10
    budget_s: float = 1.0
    max_iters: int = 100_000
    block_fraction: float = 0.05  # each adaptive block aims at this share of the budget
    max_block: int = 10_000

    def validate(self) -> None:
        if self.iters is not None and (not isinstance(self.iters, int) or self.iters < 1):
            raise UsageError(f"iters must be a positive int or None, got {self.iters!r}")
        if not isinstance(self.min_iters, int) or self.min_iters < 1:
            raise UsageError(f"min_iters must be a positive int, got {self.min_iters!r}")
        if not self.budget_s > 0:
            raise UsageError(f"budget_s must be > 0, got {self.budget_s!r}")
        if self.max_iters < self.min_iters:
            raise UsageError(f"max_iters ({self.max_iters}) is below min_iters ({self.min_iters})")


#: ``progress(done, total)`` after each block; ``total`` is None under a time budget.
Progress = Callable[[int, Optional[int]], None]


def run_iterations(
    run_block: BlockRunner, plan: LoopPlan, clock: Clock, progress: Optional[Progress] = None
) -> Tuple[List[float], int]:
    """Iteration control: call ``run_block`` until ``plan`` is satisfied.

    Returns ``(samples_ms, wall_ns)`` where ``wall_ns`` is the clock time the whole
    timed region took (samples plus loop overhead). The first adaptive block is one
    iteration; each later block is sized from the previous block's wall time so
    each takes about ``block_fraction * budget_s``, which keeps the budget check out
    of the per-iteration path without overshooting the budget by much.
    """
    begin = clock()
    if plan.iters is not None:
        if progress is None:
            return run_block(plan.iters), clock() - begin
        # about ten reports; a block boundary costs one clock read (CPU) or one sync (CUDA)
        chunk = max(1, -(-plan.iters // 10))
        samples = []
        while len(samples) < plan.iters:
            samples.extend(run_block(min(chunk, plan.iters - len(samples))))
            progress(len(samples), plan.iters)
        return samples, clock() - begin
    budget_ns = plan.budget_s * 1e9
    samples: List[float] = []
    block = 1
    block_start = begin
    while True:
        samples.extend(run_block(block))
        now = clock()
        elapsed = now - begin
        count = len(samples)
        if progress is not None:
            progress(count, None)
        if count >= plan.max_iters or (count >= plan.min_iters and elapsed >= budget_ns):
            return samples, elapsed
        # size the next block from the last one, so one slow early call (a cold cache,
        # a page fault) does not keep later blocks tiny
        per_iter = max((now - block_start) / block, 1.0)
        block_start = now
        target = int(plan.block_fraction * budget_ns / per_iter)
        if elapsed < budget_ns:  # do not plan far past the budget
            target = min(target, int((budget_ns - elapsed) / per_iter) + 1)
        block = max(1, min(target, plan.max_block, plan.max_iters - count))
        if count < plan.min_iters:
            block = max(block, plan.min_iters - count)


def cpu_block_runner(call: Callable[[], Any], clock: Clock) -> BlockRunner:
    """Times each call with two clock readings taken right around it; nothing else
    happens between them (no allocation but the sample append, after the reading)."""

    def run_block(n: int) -> List[float]:
        samples: List[int] = []
        append = samples.append
        for _ in range(n):
            t0 = clock()
            call()
            t1 = clock()
            append(t1 - t0)
        return [s * 1e-6 for s in samples]

    return run_block


def cuda_block_runner(call: Callable[[], Any], device: torch.device) -> BlockRunner:
    """Records a start and an end CUDA event around each call on the current stream,
    synchronises once per block, then reads ``elapsed_time`` (GPU time, ms). Events
    are reused across blocks."""
    stream = torch.cuda.current_stream(device)
    pool: List[Tuple[Any, Any]] = []

    def run_block(n: int) -> List[float]:
        while len(pool) < n:
            pool.append((torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)))
        pairs = pool[:n]
        for start, end in pairs:
            start.record(stream)
            call()
            end.record(stream)
        pairs[-1][1].synchronize()
        return [start.elapsed_time(end) for start, end in pairs]

    return run_block


# =========================================================================== the model, borrowed


def resolve_device(model: nn.Module, inputs: Any, kwargs: Optional[Mapping[str, Any]], device: Any) -> torch.device:
    """The device to run on: ``device`` when given (CUDA must exist), otherwise the
    device of the model's first parameter/buffer, else of the first input tensor, else CPU."""
    if device is not None:
        try:
            dev = torch.device(device)
        except (RuntimeError, TypeError) as exc:
            raise UsageError(f"not a device: {device!r}") from exc
        if dev.type == "cuda":
            if not torch.cuda.is_available():
                raise UsageError(f"device={device!r} was asked for but CUDA is not available (torch {torch.__version__})")
            if dev.index is None:
                dev = torch.device("cuda", torch.cuda.current_device())
        if dev.type not in ("cpu", "cuda"):
            raise UsageError(f"benchmark supports cpu and cuda devices, got {dev.type!r}")
        return dev
    for tensor in _chain(model.parameters(), model.buffers()):
        return tensor.device
    tensors, _ = flatten_tensors((inputs, dict(kwargs or {})))
    return tensors[0].device if tensors else torch.device("cpu")


def _chain(*iterables: Any) -> Iterator[Any]:
    for it in iterables:
        yield from it


def _same_device(a: torch.device, b: torch.device) -> bool:
    return a.type == b.type and (a.type == "cpu" or a.index == b.index)


@contextlib.contextmanager
def borrowed_model(model: nn.Module, device: torch.device) -> Iterator[nn.Module]:
    """Yields ``model`` on ``device``; afterwards the model is exactly as found.

    A model already on ``device`` is used in place; buffers a training-mode forward
    may update (BatchNorm running statistics) are copied before and restored after.
    A model elsewhere is moved for the run and then given back its original tensors
    (the same parameter storages, gradients and buffer objects, not copies)."""
    tensors = list(_chain(model.parameters(), model.buffers()))
    needs_move = any(not _same_device(t.device, device) for t in tensors)
    if not needs_move:
        saved = []
        if any(m.training for m in model.modules()):
            saved = [(m, k, b.detach().clone()) for m in model.modules() for k, b in m._buffers.items() if b is not None]
        try:
            yield model
        finally:
            with torch.no_grad():
                for module, key, copy in saved:
                    current = module._buffers.get(key)
                    if current is not None and not torch.equal(current, copy):
                        current.copy_(copy)
        return
    params = [(p, p.data, None if p.grad is None else p.grad.data) for p in model.parameters()]
    slots = [(m, dict(m._parameters), dict(m._buffers)) for m in model.modules()]
    try:
        model.to(device)
        yield model
    finally:
        for module, original_params, original_buffers in slots:
            # .to() may replace Parameter objects (overwrite_module_params_on_conversion)
            module._parameters.clear()
            module._parameters.update(original_params)
            module._buffers.clear()
            module._buffers.update(original_buffers)
        for p, data, grad in params:
            p.data = data
            if grad is not None and p.grad is not None:
                p.grad.data = grad


def move_inputs(inputs: Any, kwargs: Optional[Mapping[str, Any]], device: torch.device) -> Tuple[Any, Optional[Dict[str, Any]]]:
    """Copies of ``inputs``/``kwargs`` with every tensor on ``device`` (untouched when
    already there; the caller's objects are never modified)."""
    tensors, rebuild = flatten_tensors((inputs, dict(kwargs or {})))
    if all(_same_device(t.device, device) for t in tensors):
        return inputs, (dict(kwargs) if kwargs is not None else None)
    moved_inputs, moved_kwargs = rebuild([t.to(device) for t in tensors])
    return moved_inputs, (moved_kwargs if kwargs is not None else None)


def bind_call(fn: Callable[..., Any], inputs: Any, kwargs: Optional[Mapping[str, Any]]) -> Callable[[], Any]:
    """A zero-argument callable for ``fn`` with flopcount's input convention, built
    once so the timed loop does no argument packing."""
    args, kw = as_call_args(inputs, kwargs)
    if kw:
        return lambda: fn(*args, **kw)
    if len(args) == 1:
        (only,) = args
        return lambda: fn(only)
    return lambda: fn(*args)


def leading_batch(inputs: Any, kwargs: Optional[Mapping[str, Any]]) -> int:
    """The leading dimension of the first tensor in ``inputs`` then ``kwargs``
    (1 when there is none or it is a scalar)."""
    tensors, _ = flatten_tensors((inputs, dict(kwargs or {})))
    for t in tensors:
        return int(t.shape[0]) if t.dim() > 0 else 1
    return 1


def autocast_context(device: torch.device, dtype: Optional[torch.dtype]) -> Any:
    if dtype is None or dtype == torch.float32:
        return contextlib.nullcontext()
    if dtype not in _AUTOCAST_DTYPES:
        raise UsageError(f"dtype must be torch.float16, torch.bfloat16, torch.float32 or None; got {dtype!r}")
    return torch.autocast(device_type=device.type, dtype=dtype)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def rss_bytes() -> Optional[int]:
    """Resident set size of this process (Linux ``/proc/self/statm``), or None."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, AttributeError):
        return None


# =========================================================================== the result


@dataclass(frozen=True)
class BenchmarkResult:
    """One benchmark: latency statistics plus what they were measured on.

    ``throughput`` = ``batch_size`` / median latency (samples/s); ``iters_per_s`` =
    1 / median latency; ``achieved_flops_per_s`` = ``flops`` / median latency;
    ``mfu`` = achieved / ``peak_flops`` (dense peak, FLOP/s). ``peak_memory_bytes`` is
    CUDA ``max_memory_allocated`` over the timed region (absolute, model included) or,
    on CPU, the growth of the process RSS from before warm-up to after timing
    (``memory_kind`` says which). ``compile_ms`` is the first (compiling) call of a
    ``compile=True`` run, excluded from the statistics.
    """

    stats: LatencyStats
    device: str
    timing: str  # "cuda_event" or "perf_counter"
    warmup: int
    batch_size: int
    dtype: Optional[str] = None
    compiled: bool = False
    compile_ms: Optional[float] = None
    wall_s: float = 0.0
    flops: Optional[float] = None
    peak_flops: Optional[float] = None
    peak_source: Optional[str] = None
    peak_memory_bytes: Optional[int] = None
    memory_kind: Optional[str] = None
    threads: int = 0
    training: bool = False
    noise_threshold: float = NOISE_SPREAD
    warnings: Tuple[str, ...] = ()

    # -- statistics, delegated -------------------------------------------------
    @property
    def median_ms(self) -> float:
        return self.stats.median_ms

    @property
    def mean_ms(self) -> float:
        return self.stats.mean_ms

    @property
    def p90_ms(self) -> float:
        return self.stats.p90_ms

    @property
    def p99_ms(self) -> float:
        return self.stats.p99_ms

    @property
    def min_ms(self) -> float:
        return self.stats.min_ms

    @property
    def max_ms(self) -> float:
        return self.stats.max_ms

    @property
    def std_ms(self) -> float:
        return self.stats.std_ms

    @property
    def cv(self) -> float:
        return self.stats.cv

    @property
    def iters(self) -> int:
        return self.stats.iters

    @property
    def noisy(self) -> bool:
        return self.stats.is_noisy(self.noise_threshold)

    # -- derived rates ------------------------------------------------------------
    @property
    def iters_per_s(self) -> float:
        return 1e3 / self.median_ms if self.median_ms > 0 else math.inf

    @property
    def throughput(self) -> float:
        """Samples per second: batch size / median latency."""
        return self.batch_size * self.iters_per_s

    @property
    def overhead_per_iter_us(self) -> float:
        """Wall time of the timed region per iteration minus the mean sample (µs): what
        the loop itself costs beyond the timed calls."""
        return (self.wall_s * 1e3 / self.iters - self.mean_ms) * 1e3 if self.iters else 0.0

    @property
    def achieved_flops_per_s(self) -> Optional[float]:
        if self.flops is None or self.median_ms <= 0:
            return None
        return self.flops / (self.median_ms * 1e-3)

    @property
    def mfu(self) -> Optional[float]:
        """Model FLOPs utilisation: achieved FLOP/s over the dense peak (0..1)."""
        achieved = self.achieved_flops_per_s
        if achieved is None or not self.peak_flops:
            return None
        return achieved / self.peak_flops

    # -- rendering ------------------------------------------------------------------
    def to_dict(self, samples: bool = False) -> Dict[str, Any]:
        """Plain JSON-ready data: statistics, context and derived rates."""
        out = self.stats.to_dict(samples=samples)
        out.update(
            device=self.device,
            timing=self.timing,
            warmup=self.warmup,
            batch_size=self.batch_size,
            dtype=self.dtype,
            compiled=self.compiled,
            compile_ms=self.compile_ms,
            wall_s=self.wall_s,
            throughput=self.throughput,
            iters_per_s=self.iters_per_s,
            flops=self.flops,
            achieved_flops_per_s=self.achieved_flops_per_s,
            peak_flops=self.peak_flops,
            peak_source=self.peak_source,
            mfu=self.mfu,
            peak_memory_bytes=self.peak_memory_bytes,
            memory_kind=self.memory_kind,
            threads=self.threads,
            training=self.training,
            noisy=self.noisy,
            warnings=list(self.warnings),
        )
        return out

    def __str__(self) -> str:
        s = self.stats
        mode = "torch.compile" if self.compiled else "eager"
        lines = [
            f"latency on {self.device} ({self.timing}, {mode}, dtype {self.dtype or 'as model'}, "
            f"{s.iters} iterations after {self.warmup} warm-up)",
            f"  median {s.median_ms:.4g} ms | mean {s.mean_ms:.4g} | p90 {s.p90_ms:.4g} | p99 {s.p99_ms:.4g} | "
            f"min {s.min_ms:.4g} | max {s.max_ms:.4g} | std {s.std_ms:.3g} (CV {100 * s.cv:.1f}%, IQR/median {100 * s.rel_iqr:.1f}%)",
            f"  throughput {_si(self.throughput)}samples/s (batch {self.batch_size}), {_si(self.iters_per_s)}it/s",
        ]
        if self.compile_ms is not None:
            lines.append(f"  compile warm-up (first call) {self.compile_ms:.4g} ms, not in the statistics")
        if self.achieved_flops_per_s is not None:
            line = f"  achieved {_si(self.achieved_flops_per_s)}FLOP/s"
            if self.mfu is not None:
                line += f", MFU {100 * self.mfu:.2f}% of {_si(self.peak_flops or 0)}FLOP/s ({self.peak_source})"
            lines.append(line)
        if self.peak_memory_bytes is not None:
            lines.append(f"  memory {_si(self.peak_memory_bytes)}B ({self.memory_kind})")
        lines.extend(f"  warning: {w}" for w in self.warnings)
        return "\n".join(lines)


def _si(value: float) -> str:
    """Minimal SI rendering for summaries ("1.23 G"); reports use flopcount.report.units."""
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.3g} {prefix}"
    return f"{value:.3g} "


# =========================================================================== benchmark()


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
    dtype: Optional[torch.dtype] = None,
    compile: Union[bool, Mapping[str, Any]] = False,
    batch_size: Optional[int] = None,
    flops: Any = None,
    peak_flops: Optional[float] = None,
    gpu_name: Optional[str] = None,
    noise_threshold: float = NOISE_SPREAD,
    timer: Optional[Clock] = None,
    progress: Optional[Progress] = None,
) -> BenchmarkResult:
    """Median (and spread) latency of ``model(inputs, **kwargs)`` under
    ``torch.inference_mode()``, after ``warmup`` untimed calls.

    ``inputs``: a tuple is unpacked as positional arguments, anything else is one
    argument. ``iters`` times exactly that many calls; without it calls are timed
    until ``budget_s`` seconds passed and at least ``min_iters`` ran. ``device`` runs
    on that device (the model is moved for the run and moved back); ``dtype``
    (float16/bfloat16) runs under ``torch.autocast``. ``compile=True`` (or a dict of
    ``torch.compile`` options) times ``torch.compile(model)``; its compiling first call
    is reported as ``compile_ms``. ``flops`` (a number or a ``FlopResult``) gives
    achieved FLOP/s = flops / median; ``mfu`` uses ``peak_flops`` (FLOP/s) or the
    dense peak of ``gpu_name`` (default: the CUDA device's name) from
    :mod:`flopcount.peaks`. ``timer``: a nanosecond clock replacing
    ``time.perf_counter_ns`` (tests). The model's flags, parameters, buffers and
    gradients are left as found.
    """
    if not isinstance(model, nn.Module):
        raise UsageError(f"benchmark expects a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(warmup, int) or warmup < 0:
        raise UsageError(f"warmup must be a non-negative int, got {warmup!r}")
    plan = LoopPlan(iters=iters, min_iters=min_iters, budget_s=budget_s, max_iters=max_iters)
    plan.validate()
    if batch_size is not None and (not isinstance(batch_size, int) or batch_size < 1):
        raise UsageError(f"batch_size must be a positive int, got {batch_size!r}")
    flop_count = _flops_value(flops)
    dev = resolve_device(model, inputs, kwargs, device)
    amp = autocast_context(dev, dtype)  # validates dtype before any work
    clock: Clock = timer if timer is not None else time.perf_counter_ns
    batch = batch_size if batch_size is not None else leading_batch(inputs, kwargs)
    notes: List[str] = []
    training = any(m.training for m in model.modules())
    if any(m.training and isinstance(m, _TRAIN_SENSITIVE) for m in model.modules()):
        notes.append("model is in training mode: dropout/batch-norm run as in training (call model.eval() to time inference)")

    run_inputs, run_kwargs = move_inputs(inputs, kwargs, dev)
    compile_ms: Optional[float] = None
    peak_mem: Optional[int] = None
    with borrowed_model(model, dev) as on_device:
        fn: Callable[..., Any] = on_device
        if compile:
            options = dict(compile) if isinstance(compile, Mapping) else {}
            fn = torch.compile(on_device, **options)
        call = bind_call(fn, run_inputs, run_kwargs)
        rss_before = rss_bytes() if dev.type == "cpu" else None
        with torch.inference_mode(), amp:
            if compile:
                t0 = clock()
                call()
                synchronize(dev)
                compile_ms = (clock() - t0) * 1e-6
            for _ in range(warmup):
                call()
            synchronize(dev)
            if dev.type == "cuda":
                torch.cuda.reset_peak_memory_stats(dev)
                runner = cuda_block_runner(call, dev)
            else:
                runner = cpu_block_runner(call, clock)
            samples, wall_ns = run_iterations(runner, plan, clock, progress)
            if dev.type == "cuda":
                peak_mem = int(torch.cuda.max_memory_allocated(dev))
        if dev.type == "cpu":
            rss_after = rss_bytes()
            if rss_before is not None and rss_after is not None:
                peak_mem = max(0, rss_after - rss_before)

    stats = compute_stats(samples)
    if stats.is_noisy(noise_threshold):
        notes.append(
            f"noisy measurement: IQR/median {100 * stats.rel_iqr:.1f}% > {100 * noise_threshold:.0f}% "
            f"(CV {100 * stats.cv:.1f}%): other load, frequency scaling or too short a budget"
        )
    peak, source = _peak(dev, dtype, peak_flops, gpu_name)
    for note in notes:
        warnings.warn(note, FlopcountWarning, stacklevel=2)
    return BenchmarkResult(
        stats=stats,
        device=str(dev),
        timing="cuda_event" if dev.type == "cuda" else "perf_counter",
        warmup=warmup,
        batch_size=batch,
        dtype=None if dtype is None else str(dtype).replace("torch.", ""),
        compiled=bool(compile),
        compile_ms=compile_ms,
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


def _peak(dev: torch.device, dtype: Optional[torch.dtype], peak_flops: Optional[float], gpu_name: Optional[str]) -> Tuple[Optional[float], Optional[str]]:
    """The MFU denominator and where it came from."""
    if peak_flops is not None:
        if not peak_flops > 0:
            raise UsageError(f"peak_flops must be > 0 FLOP/s, got {peak_flops!r}")
        return float(peak_flops), "given"
    name = gpu_name
    if name is None and dev.type == "cuda":
        name = torch.cuda.get_device_name(dev)
    if name is None:
        return None, None
    value = peaks.peak_flops(name, dtype)
    if value is None:
        return None, None
    return value, f"{peaks.match_gpu(name)} {peaks.dtype_key(dtype)} dense, flopcount.peaks"
