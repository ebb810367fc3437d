"""This machine's roofs, measured here: compute per dtype (the best of BLAS GEMM, oneDNN
convolutions and a batched ``linear``; int8 on a CPU), bandwidth per memory level (the best
stream over working sets sized to each data cache and to main memory), sanity-checked
(:func:`sanity`: roofs that fail it twice are used for the call, never cached, and carry
``Roofs.doubts``) and cached in ``$XDG_CACHE_HOME/flopcount/roofs.json`` unless
``FLOPCOUNT_NO_ROOFS_CACHE=1``. Measuring and the cache's read-modify-write hold one lock in
this process; the file is replaced atomically. Details: docs/devices.md, "This machine's roofs".
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import threading
import time
import warnings
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import torch

from flopcount.bench.loop import cuda_block_runner
from flopcount.devices.cpu import CpuFacts, cpu_facts
from flopcount.devices.roofline import CONV, MATMUL, MemoryLevel, Roofs, op_family
from flopcount.errors import UsageError

Clock = Callable[[], float]
LoadAvg = Callable[[], Tuple[float, float, float]]

CPU_DTYPES: Tuple[str, ...] = ("float32", "bfloat16", "int8")
CUDA_DTYPES: Tuple[str, ...] = ("float32", "float16", "bfloat16")
# per buffer (3 buffers): beyond any private cache. A smaller stream that a large shared cache
# partly holds reads faster than main memory: a higher roof, so the bound stays a lower bound
_STREAM_BYTES = 64 * 2**20
_LLC_STREAM_CAP = 64 * 2**20  # a shared last-level cache is streamed at no more than this per level
NO_CACHE_ENV = "FLOPCOUNT_NO_ROOFS_CACHE"
CACHE_VERSION = 4  # 3: float32 work run as TF32 (cuDNN convs) priced in its own column; 4: a CPU's int8 roof
#: the lowest plausible compute roof, as a fraction of the ISA peak
PLAUSIBLE_FRACTION = 0.1
#: two passes further apart than this are inconsistent
REPEAT_SPREAD = 0.25
#: each of machine_roofs' two passes keeps to this budget per kernel family (about the old single pass)
PASS_BUDGET_S = 0.5
#: how often :class:`_OthersRunning` counts the threads of other processes while the passes run
RUN_QUEUE_EVERY_S = 0.02


def cache_path() -> Path:
    """``$XDG_CACHE_HOME/flopcount/roofs.json`` (``~/.cache/flopcount/roofs.json`` without it)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "flopcount" / "roofs.json"


def cache_enabled() -> bool:
    """False when ``FLOPCOUNT_NO_ROOFS_CACHE`` is set to anything but "" or "0"."""
    return os.environ.get(NO_CACHE_ENV, "") in ("", "0")


def math_flags() -> str:
    """The host's math-mode flags a measurement depends on."""
    cuda_tf32 = torch.backends.cuda.matmul.allow_tf32
    return (f"matmul_tf32={int(cuda_tf32)} cudnn_tf32={int(torch.backends.cudnn.allow_tf32)} "
            f"fp32_precision={torch.get_float32_matmul_precision()} mkldnn={int(torch.backends.mkldnn.is_available())}")


def reduced_precision_families(device: torch.device) -> Tuple[str, ...]:
    """The op families whose float32 work runs on TF32 tensor cores on ``device`` under this
    process's flags: cuDNN convolutions by default (``torch.backends.cudnn.allow_tf32``), matmuls
    when ``torch.backends.cuda.matmul.allow_tf32`` or a float32 matmul precision below "highest"
    allows it. None on a CPU."""
    if device.type != "cuda":
        return ()
    families = []
    if torch.backends.cuda.matmul.allow_tf32 or torch.get_float32_matmul_precision() != "highest":
        families.append(MATMUL)
    if torch.backends.cudnn.allow_tf32:
        families.append(CONV)
    return tuple(families)


def float32_columns(rates: Mapping[str, float], tf32: Sequence[str]) -> Tuple[Dict[str, float], Dict[str, str]]:
    """Split float32 candidates' rates (kernel label -> FLOP/s) by the math their family ran in:
    a family in ``tf32`` ran on TF32 tensor cores, so its rate is a "tfloat32" roof and that
    family's float32 work is priced there (``Roofs.math``); the others make the "float32" roof.
    On an H100 a cuDNN convolution in float32 (TF32 by default) ran at 72-77 TFLOP/s while a
    true float32 GEMM reached 52 (the datasheet's float32 peak is 67): booked as one float32
    roof, the conv's rate priced float32 matmuls 1.4x too fast (docs/performance.md, "On a GPU")."""
    columns: Dict[str, float] = {}
    for label, rate in rates.items():
        # every candidate is a convolution or a matrix product ("4096x4096x4096 mm", "linear ...")
        family = CONV if op_family(label) == CONV else MATMUL
        column = "tfloat32" if family in tf32 else "float32"
        columns[column] = max(columns.get(column, 0.0), rate)
    math = {family: "tfloat32" for family in tf32} if "tfloat32" in columns else {}
    return columns, math


def machine_key(device: torch.device) -> str:
    """What the cached roofs depend on: host, processor or GPU, threads, math flags, torch version."""
    what = torch.cuda.get_device_name(device) if device.type == "cuda" else f"{_cpu_model()} x{torch.get_num_threads()} threads"
    return f"v{CACHE_VERSION} | {platform.node()} | {device.type} | {what} | {math_flags()} | torch {torch.__version__}"


def _cpu_model() -> str:
    return cpu_facts().model or platform.processor() or platform.machine()


#: measuring and the cache's read-modify-write, one thread at a time (see the module docstring)
_CACHE_LOCK = threading.RLock()


def machine_roofs(
    device: Union[None, str, torch.device] = None,
    *,
    refresh: bool = False,
    cache: bool = True,
    measure: Optional[Callable[[torch.device], Roofs]] = None,
    loadavg: Optional[LoadAvg] = None,
    cores: Optional[int] = None,
    tries: int = 2,
    now: Optional[Callable[[], datetime]] = None,
    running: Optional[Callable[[], Optional[int]]] = None,
) -> Roofs:
    """This machine's measured roofs for ``device`` (default CPU), from the cache when it
    has sane ones for this key; otherwise measured (seconds), checked by :func:`sanity`
    (twice per try: the two passes must agree) and cached only when sane. ``refresh``
    measures again (the cache keeps the best of both); ``cache=False`` (or the environment
    variable ``FLOPCOUNT_NO_ROOFS_CACHE=1``) neither reads nor writes the cache.
    ``loadavg``, ``cores`` and ``now`` replace ``os.getloadavg``, the usable CPUs and the
    clock (tests); ``running`` replaces :func:`others_running` (the threads of other processes
    running now, counted every 20 ms while the passes run: the load average lags a minute). Writes: ``$XDG_CACHE_HOME/flopcount/roofs.json`` (:func:`cache_path`),
    only after measuring. Thread-safe: one thread measures at a time."""
    dev = torch.device(device or "cpu")
    with _CACHE_LOCK:
        cache = cache and cache_enabled()
        key = machine_key(dev)
        path = cache_path()
        stored = _read_cache(path) if cache else {}
        if not refresh and key in stored:
            try:
                found = Roofs.from_dict(stored[key])
                when = found.details.get("measured_at", "?")
                return replace(found, source=f"measured (cached; measured {when}, {found.details.get('how', 'micro-benchmarks')})")
            except (KeyError, TypeError, ValueError, UsageError):
                pass  # a damaged entry: measure again
        take = measure or (lambda d: measure_roofs(d, budget_s=PASS_BUDGET_S))
        load = loadavg or os.getloadavg
        ncores = cores or (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))
        problems: List[str] = []
        roofs: Optional[Roofs] = None
        for _ in range(max(1, tries)):
            before = load()[0]
            with _OthersRunning(running or others_running) as others:
                first, second = take(dev), take(dev)
            after = load()[0]
            roofs = best_of(first, second) if roofs is None else best_of(roofs, first, second)
            problems = sanity(first, second, max(before, after), ncores if dev.type == "cpu" else None,
                              others.median if dev.type == "cpu" else None)
            if not problems or any(p.startswith(BUSY) for p in problems):
                break  # sane, or the machine is busy: measuring again now would not help
        assert roofs is not None
        stamp = (now or (lambda: datetime.now(timezone.utc)))().strftime("%Y-%m-%dT%H:%M:%SZ")
        details = {**roofs.details, "measured_at": stamp, "load": round(float(load()[0]), 2)}
        details.setdefault("how", "best of GEMM/conv/linear per dtype; streams per memory level")
        if problems:
            details["not_cached"] = problems
            # rates below what the machine does: a bound on them may be above a real run (Roofs.doubts)
            return replace(roofs, source="measured (not cached: " + "; ".join(problems) + ")", details=details,
                           doubts=tuple(problems))
        roofs = replace(roofs, details=details)
        if cache:
            if key in stored:
                with contextlib.suppress(KeyError, TypeError, ValueError, UsageError):
                    roofs = best_of(roofs, Roofs.from_dict(stored[key]))
                    roofs = replace(roofs, details={**roofs.details, "measured_at": stamp})
            stored[key] = roofs.to_dict()
            _write_cache(path, stored)
        return roofs


def remember_roofs(roofs: Roofs, device: Union[None, str, torch.device] = None) -> Roofs:
    """Store ``roofs`` as this machine's for ``device`` under the current key, unchecked: for
    figures the caller vouches for (a benchmark of its own, a test's seed). Returns them.
    Writes ``$XDG_CACHE_HOME/flopcount/roofs.json`` unless ``FLOPCOUNT_NO_ROOFS_CACHE`` is set."""
    dev = torch.device(device or "cpu")
    if not cache_enabled():
        return roofs
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    entry = replace(roofs, details={"measured_at": stamp, "how": "given (remember_roofs)", **roofs.details})
    with _CACHE_LOCK:
        path = cache_path()
        stored = _read_cache(path)
        stored[machine_key(dev)] = entry.to_dict()
        _write_cache(path, stored)
    return roofs


#: how a sanity problem that says the machine was busy begins (measuring again now would not help)
BUSY = ("load average", "other processes")


def sanity(first: Roofs, second: Roofs, load: float, cores: Optional[int], others: Optional[float] = None) -> List[str]:
    """Why two passes of a measurement may not stand as this machine's roofs (empty: they may).
    ``others``: the threads of other processes running while the passes ran (the median of
    :class:`_OthersRunning`'s counts; None: not counted), which with the passes' own threads
    must fit in the ``cores``: the load average, a minute's mean, lags a job that started
    seconds before (two processes measuring at once each see the other's threads only here)."""
    problems = []
    if cores is not None and load > cores:
        problems.append(f"load average {load:.2f} above the {cores} cores")
    threads = int(first.details.get("threads", 1) or 1)
    if cores is not None and others is not None and others + threads > cores:
        problems.append(f"other processes ran {others:g} thread(s) beside this measurement's {threads} on the "
                        f"{cores} cores (the median of the counts taken while it ran)")
    isa = {**first.details.get("isa_peak_flops", {})}
    for dtype, value in first.peak_flops.items():
        other = second.peak_flops.get(dtype)
        if other is not None and abs(value - other) > REPEAT_SPREAD * max(value, other):
            problems.append(f"{dtype} roof {value / 1e9:.4g} vs {other / 1e9:.4g} GFLOP/s in two passes")
        ceiling = isa.get(dtype)
        if ceiling and max(value, other or 0.0) < PLAUSIBLE_FRACTION * ceiling:
            problems.append(f"{dtype} roof {max(value, other or 0.0) / 1e9:.4g} GFLOP/s below "
                            f"{PLAUSIBLE_FRACTION:.0%} of the ISA peak {ceiling / 1e9:.4g}")
    for a, b in zip(first.all_levels(), second.all_levels()):
        if a.bandwidth and b.bandwidth and abs(a.bandwidth - b.bandwidth) > REPEAT_SPREAD * max(a.bandwidth, b.bandwidth):
            problems.append(f"{a.name} bandwidth {a.bandwidth / 1e9:.4g} vs {b.bandwidth / 1e9:.4g} GB/s in two passes")
    flags = first.details.get("bf16_instructions")
    fp32, bf16 = first.peak_flops.get("float32"), first.peak_flops.get("bfloat16")
    if flags and fp32 and bf16 and bf16 < 0.5 * fp32:
        problems.append(f"bfloat16 roof {bf16 / 1e9:.4g} below half of float32's {fp32 / 1e9:.4g} GFLOP/s on a CPU with {flags}")
    return problems


def others_running(path: str = "/proc") -> Optional[int]:
    """Threads of other processes running or runnable now: the kernel's count of runnable
    threads (``/proc/loadavg``'s fourth field, "running/total") less this process's running
    threads (state R in ``/proc/self/task/*/stat``); None where ``/proc`` has neither (not Linux)."""
    try:
        with open(os.path.join(path, "loadavg")) as fh:
            runnable = int(fh.read().split()[3].split("/")[0])
        own = 0
        for task in os.listdir(os.path.join(path, "self", "task")):
            with contextlib.suppress(OSError):
                with open(os.path.join(path, "self", "task", task, "stat")) as fh:
                    own += fh.read().rpartition(")")[2].split()[0] == "R"
    except (OSError, ValueError, IndexError):
        return None
    return max(0, runnable - own)


class _OthersRunning:
    """Counts the threads of other processes running (``count``, :func:`others_running`) every
    :data:`RUN_QUEUE_EVERY_S` in a thread of its own while the ``with`` block runs; ``median``
    is the median count, None with fewer than 3 counts (a block too short to judge) or where
    nothing could be counted."""

    def __init__(self, count: Callable[[], Optional[int]]) -> None:
        self._count = count
        self._counts: List[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="flopcount-run-queue", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(RUN_QUEUE_EVERY_S):
            found = self._count()
            if found is not None:
                self._counts.append(found)

    def __enter__(self) -> _OthersRunning:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def median(self) -> Optional[float]:
        counts = sorted(self._counts)
        if len(counts) < 3:
            return None
        middle = len(counts) // 2
        return float(counts[middle]) if len(counts) % 2 else (counts[middle - 1] + counts[middle]) / 2


def best_of(*measured: Roofs) -> Roofs:
    """The highest of each roof over several measurements of one machine: other load only
    slows a measurement, so every rate seen was attainable and the best is the roof."""
    peaks: Dict[str, float] = {}
    for roofs in measured:
        for dtype, value in roofs.peak_flops.items():
            peaks[dtype] = max(peaks.get(dtype, 0.0), value)
    first = measured[0]
    levels = []
    for i, level in enumerate(first.levels):
        rates = [r.levels[i].bandwidth for r in measured if len(r.levels) > i and r.levels[i].name == level.name]
        known = [x for x in rates if x]
        levels.append(MemoryLevel(level.name, level.capacity, max(known) if known else None))
    details = {**first.details, "measurements": sum(int(r.details.get("measurements", 1)) for r in measured)}
    return Roofs(peaks, max(r.bandwidth for r in measured), first.device, first.source, details, tuple(levels), first.math)


def raise_to_achieved(roofs: Roofs, achieved: Mapping[str, float], where: str = "a profiled op") -> Roofs:
    """``roofs`` with each dtype's compute roof raised to a rate ``achieved`` on this machine
    (a roof below what ran is no ceiling); the raise is recorded in ``details``."""
    peaks = dict(roofs.peak_flops)
    raised = {}
    for dtype, rate in achieved.items():
        if dtype in peaks and rate > peaks[dtype]:
            raised[dtype] = f"{peaks[dtype] / 1e9:.4g} -> {rate / 1e9:.4g} GFLOP/s ({where})"
            peaks[dtype] = rate
    if not raised:
        return roofs
    return replace(roofs, peak_flops=peaks, details={**roofs.details, "raised_to_achieved": raised})


def _read_cache(path: Path) -> Dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_cache(path: Path, data: Dict[str, Any]) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        scratch = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
        scratch.write_text(json.dumps(data, indent=1, sort_keys=True))
        os.replace(scratch, path)
    except OSError:
        pass  # a read-only home: the roofs are measured again next time


def measure_roofs(
    device: Union[None, str, torch.device] = None,
    dtypes: Optional[Sequence[str]] = None,
    *,
    budget_s: float = 1.0,
    clock: Optional[Clock] = None,
    stream_bytes: int = _STREAM_BYTES,
    levels: bool = True,
    facts: Optional[CpuFacts] = None,
) -> Roofs:
    """Measure compute roofs (GEMM, conv, linear per dtype; the best is the roof) and
    bandwidth (streams over ``stream_bytes`` per buffer for main memory, and per cache level
    when ``levels``) on ``device``, each within about ``budget_s`` seconds of timed calls;
    ``clock`` (seconds) replaces ``time.perf_counter`` (tests)."""
    dev = torch.device(device or "cpu")
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    wanted = tuple(dtypes or (CUDA_DTYPES if dev.type == "cuda" else CPU_DTYPES))
    timer = _timer(dev, clock)
    threads = torch.get_num_threads()
    details: Dict[str, Any] = {"threads": threads} if dev.type == "cpu" else {}
    cpu = (facts or cpu_facts()) if dev.type == "cpu" else None
    if cpu is not None:
        details["isa_peak_flops"] = cpu.isa_peak(threads)
        details["isa_clock"] = cpu.clock_source
        bf16 = sorted(f for f in cpu.flags if f in ("avx512_bf16", "amx_bf16"))
        if bf16:
            details["bf16_instructions"] = ", ".join(bf16)
    flops: Dict[str, float] = {}
    math: Dict[str, str] = {}
    with torch.inference_mode():
        for name in wanted:
            dtype = getattr(torch, name, None)
            if not isinstance(dtype, torch.dtype):
                raise UsageError(f"measure_roofs: not a torch dtype: {name!r}")
            rates: Dict[str, float] = {}
            integer = not (dtype.is_floating_point or dtype.is_complex)
            if not integer:
                with contextlib.suppress(RuntimeError):  # no GEMM kernel for this dtype here
                    rate, n = _gemm_rate(dev, dtype, budget_s / 2, timer)
                    rates[f"{n}x{n}x{n} mm"] = rate
            for label, kernel in (_int8_kernels(dev) if integer else _library_kernels(dev, dtype)):
                with contextlib.suppress(RuntimeError):
                    rates[label] = _best_rate(kernel, budget_s / 4, timer)
            if not rates:
                continue
            best = max(rates, key=lambda k: rates[k])
            details[f"compute_{name}"] = f"{best} ({', '.join(f'{k} {v / 1e9:.4g}' for k, v in rates.items())} GFLOP/s)"
            details[f"gemm_{name}"] = next((k for k in rates if k.endswith(" mm")), best)
            tf32 = reduced_precision_families(dev) if name == "float32" else ()
            if not tf32:
                flops[name] = rates[best]
                continue
            columns, math = float32_columns(rates, tf32)
            flops.update(columns)
            details["math"] = f"float32 {' and '.join(tf32)} ran as TF32 under this process's flags ({math_flags()})"
        bandwidth, how = _stream_rate(dev, budget_s, timer, stream_bytes)
        cache_levels: List[MemoryLevel] = []
        if levels and cpu is not None:
            for cache in cpu.caches:
                held = cache.capacity(threads)
                size = min(held // 2, _LLC_STREAM_CAP)
                if size < 3 * 4096:
                    continue
                rate, level_how = _stream_rate(dev, budget_s / 2, timer, size // 3)
                cache_levels.append(MemoryLevel(f"L{cache.level}", float(3 * (size // 3 // 4) * 4), max(rate, bandwidth)))
                details[f"bandwidth_L{cache.level}"] = level_how
    details["bandwidth"] = how
    for i in range(len(cache_levels) - 2, -1, -1):  # a faster level is never slower than the one below it
        lower = cache_levels[i + 1].bandwidth or 0.0
        if (cache_levels[i].bandwidth or 0.0) < lower:
            cache_levels[i] = MemoryLevel(cache_levels[i].name, cache_levels[i].capacity, lower)
    if levels and dev.type == "cuda":
        # A GPU's L2 serves a working set that fits it faster than DRAM: a bound that charged such
        # data at the measured DRAM rate was beaten on an H200 (docs/performance.md, "On a GPU").
        # Its bandwidth is not measured (any stream we time can be beaten by a better kernel), so,
        # as on the datasheet, the level claims nothing for data that fits it.
        l2 = int(getattr(torch.cuda.get_device_properties(dev), "L2_cache_size", 0) or 0)
        if l2:
            cache_levels.append(MemoryLevel("L2", float(l2), None))
            details["bandwidth_L2"] = f"not measured: data within the {l2 / 2**20:.0f} MiB L2 sets no memory term"
    if cpu is not None:
        for dtype, ceiling in details["isa_peak_flops"].items():
            if flops.get(dtype, 0.0) > ceiling:
                details.setdefault("isa_below_measured", []).append(dtype)
    label = torch.cuda.get_device_name(dev) if dev.type == "cuda" else f"{cpu.model if cpu else _cpu_model()} ({threads} threads)"
    return Roofs(flops, bandwidth, label, "measured", details, tuple(cache_levels), math)


def _timer(dev: torch.device, clock: Optional[Clock]) -> Callable[[Callable[[], Any]], float]:
    """Seconds one call of ``fn`` takes: CUDA events on a GPU (the benchmark's runner), else
    ``clock`` (perf_counter)."""
    if dev.type == "cuda" and clock is None:
        return lambda fn: cuda_block_runner(fn, dev)(1)[0]
    now = clock or time.perf_counter

    def cpu_time(fn: Callable[[], Any]) -> float:
        t0 = now()
        fn()
        return now() - t0

    return cpu_time


def _best_rate(kernel: Tuple[Callable[[], Any], float], budget_s: float, timer: Callable[[Callable[[], Any]], float]) -> float:
    """FLOP/s of the fastest of at least 3 timed calls (more while ``budget_s`` holds)."""
    fn, work = kernel
    return work / max(_fastest(fn, timer, budget_s, timer(fn)), 1e-12)  # the first call warms


def _fastest(fn: Callable[[], Any], timer: Callable[[Callable[[], Any]], float], budget_s: float, spent: float,
             best: float = float("inf"), repeats: int = 0) -> float:
    """Seconds of the fastest of at least 3 timed calls of ``fn`` (``repeats`` already timed, the
    fastest ``best``), more while ``budget_s`` holds: none starts once half of it is ``spent`` or
    when it would overrun it. Other load only slows a call, so the fastest is the measurement."""
    while repeats < 3 or (spent < budget_s / 2 and spent + best <= budget_s):
        took = timer(fn)
        best, spent, repeats = min(best, took), spent + took, repeats + 1
    return best


def _library_kernels(dev: torch.device, dtype: torch.dtype) -> List[Tuple[str, Tuple[Callable[[], Any], float]]]:
    """Two 3x3 convolutions in channels_last (oneDNN on CPU, cuDNN on CUDA): 8x128x28x28 and
    4x64x56x56 (a wide map of few channels, which oneDNN ran 5-9 % faster on the project's AMD VM:
    convolutions of 64-128 channels on 56x56 maps beat a roof measured on the first alone), and a
    batched linear with bias, with their FLOPs (2 per multiply-add)."""
    rows, width = 512, 1024
    a = _operand(dev, dtype, rows, width)
    lw = _operand(dev, dtype, width, width)
    lb = _operand(dev, dtype, width)
    linear_flops = 2.0 * rows * width * width
    return [
        *(_conv3x3(dev, dtype, n, c, hw) for n, c, hw in ((8, 128, 28), (4, 64, 56))),
        (f"linear {rows}x{width}x{width}", (lambda: torch.nn.functional.linear(a, lw, lb), linear_flops)),
    ]


def _conv3x3(dev: torch.device, dtype: torch.dtype, n: int, c: int, hw: int) -> Tuple[str, Tuple[Callable[[], Any], float]]:
    x = _operand(dev, dtype, n, c, hw, hw).contiguous(memory_format=torch.channels_last)
    w = _operand(dev, dtype, c, c, 3, 3).contiguous(memory_format=torch.channels_last)
    flops = 2.0 * n * c * hw * hw * c * 3 * 3  # padding 1: every output sees the full 3x3 window's MACs
    return f"conv2d {n}x{c}x{hw}x{hw} 3x3 channels_last", (lambda: torch.nn.functional.conv2d(x, w, padding=1), flops)


def _int8_kernels(dev: torch.device) -> List[Tuple[str, Tuple[Callable[[], Any], float]]]:
    """The int8 products a model can call on a CPU, each at three shapes (64 rows ran 10 % above
    256 on the project's AMD VM), with their FLOPs (2 per multiply-add): fbgemm's dynamic
    quantized linear, what ``quantize_dynamic``'s Linear calls (the activations quantized per
    call, the products int8 x int8 in int32; none on a build without fbgemm), and aten's
    ``_int_mm`` (int8 x int8 in int32, no quantized tensors), which ran above it here (843
    GFLOP/s at 1024^3 against fbgemm's best 646, under load 6.6: a roof without it was beaten
    by a model calling it). Read as a dispatcher key (``torch.ops.aten._int_mm.default``), as
    the handler tables name ops; none where this torch has no such operator."""
    if dev.type != "cpu":
        return []
    shapes = ((64, 2048), (256, 2048), (1024, 1024))
    kernels = []
    if "fbgemm" in torch.backends.quantized.supported_engines:
        for rows, width in shapes:
            with contextlib.suppress(RuntimeError):
                kernels.append((f"linear {rows}x{width}x{width} quantized dynamic", _quantized_linear(dev, rows, width)))
    for rows, width in shapes:
        with contextlib.suppress(AttributeError, RuntimeError):  # AttributeError: no such operator in this torch
            kernels.append((f"{rows}x{width}x{width} _int_mm", _int8_product(dev, rows, width)))
    return kernels


#: the operators read as dispatcher keys here (``_aten._int_mm.default``), as the tracers' are
_aten = torch.ops.aten
#: the deprecation ``torch.quantize_per_tensor`` raises (once per process, from C++), which
#: measuring the int8 roof is not the user's use of; every other warning stays as it was
_QUANTIZED_DEPRECATION = r"torch\.quantize_per_tensor, torch\.quantize_per_channel and other quantized tensor creation"


def _quantized_linear(dev: torch.device, rows: int, width: int) -> Tuple[Callable[[], Any], float]:
    with warnings.catch_warnings():
        # only this message, only around this call (simplefilter("ignore") around the whole
        # kernel silenced every warning, any thread's, while it ran)
        warnings.filterwarnings("ignore", message=_QUANTIZED_DEPRECATION, category=UserWarning)
        weight = torch.quantize_per_tensor(_operand(dev, torch.float32, width, width), 0.05, 0, torch.qint8)
    packed = torch.ops.quantized.linear_prepack(weight, None)
    x = _operand(dev, torch.float32, rows, width)
    return (lambda: torch.ops.quantized.linear_dynamic(x, packed, True)), 2.0 * rows * width * width


def _int8_product(dev: torch.device, rows: int, width: int) -> Tuple[Callable[[], Any], float]:
    """``(rows, width) @ (width, width)`` in int8, accumulated in int32."""
    product = _aten._int_mm.default
    a = _operand(dev, torch.int8, rows, width)
    b = _operand(dev, torch.int8, width, width)
    product(a, b)  # a shape or build it does not take raises here, before it is timed
    return (lambda: product(a, b)), 2.0 * rows * width * width


def _gemm_rate(dev: torch.device, dtype: torch.dtype, budget_s: float, timer: Callable[[Callable[[], Any]], float]) -> Tuple[float, int]:
    """Best FLOP/s of ``n x n @ n x n``: n doubled (256..8192) while the next size (8x the
    work) would still take at most a quarter of the budget; then the best of at least 3
    products, more while the budget holds. Every timed call, warm-ups and the smaller sizes
    included, counts against ``budget_s``, and no product starts that would overrun it
    (only the first three are always run)."""
    n, limit, spent = 256, 8192, 0.0
    while True:
        product = _gemm(n, dev, dtype)
        spent += timer(product)  # warm the kernel
        once = timer(product)
        spent += once
        if n >= limit or 8 * once > budget_s / 4:
            break
        n *= 2
    return 2.0 * n**3 / max(_fastest(product, timer, budget_s, spent, once, 1), 1e-12), n


def _operand(dev: torch.device, dtype: torch.dtype, *shape: int) -> torch.Tensor:
    """Random operands drawn on a generator of the measurement's own, seeded: the process's
    generators are neither advanced nor set back (issue #29 item 18: another thread drawing
    meanwhile is left alone)."""
    generator = torch.Generator(device=dev).manual_seed(0)
    return torch.randn(*shape, device=dev, generator=generator).to(dtype)


def _gemm(n: int, dev: torch.device, dtype: torch.dtype) -> Callable[[], Any]:
    a = _operand(dev, dtype, n, n)
    b = _operand(dev, dtype, n, n)
    out = torch.empty(n, n, device=dev, dtype=dtype)
    return lambda: torch.mm(a, b, out=out)


def _stream_rate(
    dev: torch.device, budget_s: float, timer: Callable[[Callable[[], Any]], float], size: int
) -> Tuple[float, str]:
    """Best bytes/s of ``out = a + b``, ``out += b`` (3 buffers moved) and ``out.copy_(a)`` (2),
    buffers of ``size`` bytes; a small buffer is timed over a loop of calls (one call would
    be mostly the timer)."""
    numel = max(1, size // 4)
    a = torch.full((numel,), 0.5, device=dev)  # filled, not random: the values do not matter, the pages do
    b = torch.full((numel,), 0.25, device=dev)
    out = torch.empty_like(a)
    loop = max(1, min(1000, (4 * 2**20) // max(1, numel * 4)))
    rates = {}
    for name, moved, op in (
        ("add", 3 * numel * 4, lambda: torch.add(a, b, out=out)),
        # writes lines it has just read: no write-allocate traffic beyond the 3 buffers counted
        ("add_", 3 * numel * 4, lambda: out.add_(b)),
        ("copy", 2 * numel * 4, lambda: out.copy_(a)),
    ):
        def fn(op: Callable[[], Any] = op) -> None:
            for _ in range(loop):
                op()

        # a third of the budget each; the first call warms: first touch of the output pages
        rates[name] = moved * loop / max(_fastest(fn, timer, budget_s / 3, timer(fn)), 1e-12)
    name = max(rates, key=lambda k: rates[k])
    shown = ", ".join(f"{rates[k] / 1e9:.4g} GB/s {k}" for k in rates)
    return rates[name], f"best of {name} over {numel} float32 x{loop} ({shown})"
