"""The roofs of a device: measured on this machine (cached per machine), or from the
datasheet table (:mod:`flopcount.bench.peaks`), or given by the user.

Measured: peak FLOP/s per dtype is the best rate of a large square GEMM (``2 n^3``
FLOPs, ``n`` grown until one product takes a tenth of the budget); bandwidth is the
best rate of a streaming ``out = a + b`` or ``out += b`` (reads 2, writes 1 buffer) or
``out.copy_(a)`` (reads 1, writes 1) over buffers far larger than the caches, in the byte
convention of a profile (inputs read + outputs written; the in-place add has no
write-allocate traffic beyond it, so it usually sets the roof). Seconds, not minutes. The
figures are cached in ``$XDG_CACHE_HOME/flopcount/roofs.json`` (``~/.cache`` without
it) under a key naming the machine, the device, the thread count and torch's version; a new
measurement (``refresh=True``) keeps the best of it and the cached one, since other load
only ever slows a measurement down.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import time
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Sequence, Tuple, Union

import torch

from ..errors import UsageError
from ..roofline import Roofs
from . import peaks

Clock = Callable[[], float]

CPU_DTYPES: Tuple[str, ...] = ("float32", "bfloat16")
CUDA_DTYPES: Tuple[str, ...] = ("float32", "float16", "bfloat16")
_STREAM_BYTES = 256 * 2**20  # per buffer: far beyond any CPU cache

#: ``predict(device=...)`` names -> datasheet table keys
DEVICE_ALIASES: Dict[str, str] = {
    "h100": "H100 SXM",
    "h100-sxm": "H100 SXM",
    "h100 sxm": "H100 SXM",
    "h100-pcie": "H100 PCIe",
    "h100 pcie": "H100 PCIe",
    "h200": "H200",
    "a100": "A100",
    "l4": "L4",
    "a10": "A10",
    "t4": "T4",
    "v100": "V100 SXM2",
    "rtx4090": "RTX 4090",
    "4090": "RTX 4090",
}
#: names that mean the roofs measured on this machine
THIS_MACHINE = ("this machine", "this-machine", "local", "cpu", "here")


def cache_path() -> Path:
    """``$XDG_CACHE_HOME/flopcount/roofs.json`` (``~/.cache/flopcount/roofs.json`` without it)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "flopcount" / "roofs.json"


def machine_key(device: torch.device) -> str:
    """What the cached roofs depend on: host, processor or GPU, threads, torch version."""
    if device.type == "cuda":
        what = torch.cuda.get_device_name(device)
    else:
        what = f"{_cpu_model()} x{torch.get_num_threads()} threads"
    return f"{platform.node()} | {device.type} | {what} | torch {torch.__version__}"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_roofs(
    device: Union[None, str, torch.device] = None,
    *,
    refresh: bool = False,
    cache: bool = True,
    measure: Optional[Callable[[torch.device], Roofs]] = None,
) -> Roofs:
    """This machine's measured roofs for ``device`` (default CPU), from the cache when it
    has them for this machine; otherwise measured (seconds) and cached. ``refresh``
    measures again (the cache keeps the best of both); ``cache=False`` neither reads nor
    writes the cache."""
    dev = torch.device(device or "cpu")
    key = machine_key(dev)
    path = cache_path()
    stored = _read_cache(path) if cache else {}
    if not refresh and key in stored:
        try:
            return Roofs.from_dict({**stored[key], "source": "measured (cached)"})
        except (KeyError, TypeError, ValueError, UsageError):
            pass  # a damaged entry: measure again
    roofs = (measure or measure_roofs)(dev)
    if cache:
        if key in stored:
            with contextlib.suppress(KeyError, TypeError, ValueError, UsageError):
                roofs = best_of(roofs, Roofs.from_dict(stored[key]))
        stored[key] = roofs.to_dict()
        _write_cache(path, stored)
    return roofs


def best_of(*measured: Roofs) -> Roofs:
    """The highest of each roof over several measurements of one machine: other load only
    slows a measurement, so every rate seen was attainable and the best is the roof."""
    peaks: Dict[str, float] = {}
    for roofs in measured:
        for dtype, value in roofs.peak_flops.items():
            peaks[dtype] = max(peaks.get(dtype, 0.0), value)
    first = measured[0]
    details = dict(first.details)
    details["measurements"] = sum(int(r.details.get("measurements", 1)) for r in measured)
    return Roofs(peaks, max(r.bandwidth for r in measured), first.device, first.source, details)


def _read_cache(path: Path) -> Dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_cache(path: Path, data: Dict[str, Any]) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        scratch = path.with_suffix(f".{os.getpid()}.tmp")
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
) -> Roofs:
    """Measure peak FLOP/s (GEMM per dtype) and bandwidth (streaming add/copy over buffers
    of ``stream_bytes``) on ``device``, each within about ``budget_s`` seconds of timed
    calls (the buffers' allocation aside); ``clock`` (seconds) replaces ``time.perf_counter`` (tests)."""
    dev = torch.device(device or "cpu")
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    wanted = tuple(dtypes or (CUDA_DTYPES if dev.type == "cuda" else CPU_DTYPES))
    timer = _timer(dev, clock)
    details: Dict[str, Any] = {"threads": torch.get_num_threads()} if dev.type == "cpu" else {}
    flops: Dict[str, float] = {}
    with torch.inference_mode():
        for name in wanted:
            dtype = getattr(torch, name, None)
            if not isinstance(dtype, torch.dtype):
                raise UsageError(f"measure_roofs: not a torch dtype: {name!r}")
            try:
                rate, n = _gemm_rate(dev, dtype, budget_s, timer)
            except RuntimeError:  # no GEMM kernel for this dtype here
                continue
            flops[name] = rate
            details[f"gemm_{name}"] = f"{n}x{n}x{n} mm"
        bandwidth, how = _stream_rate(dev, budget_s, timer, stream_bytes)
    details["bandwidth"] = how
    label = torch.cuda.get_device_name(dev) if dev.type == "cuda" else f"{_cpu_model()} ({torch.get_num_threads()} threads)"
    return Roofs(flops, bandwidth, label, "measured", details)


def _timer(dev: torch.device, clock: Optional[Clock]) -> Callable[[Callable[[], Any]], float]:
    """Seconds one call of ``fn`` takes: CUDA events on a GPU, else ``clock`` (perf_counter)."""
    if dev.type == "cuda" and clock is None:

        def cuda_time(fn: Callable[[], Any]) -> float:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) * 1e-3

        return cuda_time
    now = clock or time.perf_counter

    def cpu_time(fn: Callable[[], Any]) -> float:
        t0 = now()
        fn()
        return now() - t0

    return cpu_time


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
    best, repeats = once, 1
    while repeats < 3 or (spent < budget_s / 2 and spent + best <= budget_s):  # other load only slows
        took = timer(product)
        repeats += 1
        best = min(best, took)
        spent += took
    return 2.0 * n**3 / max(best, 1e-12), n


def _gemm(n: int, dev: torch.device, dtype: torch.dtype) -> Callable[[], Any]:
    a = torch.randn(n, n, device=dev).to(dtype)
    b = torch.randn(n, n, device=dev).to(dtype)
    out = torch.empty(n, n, device=dev, dtype=dtype)
    return lambda: torch.mm(a, b, out=out)


def _stream_rate(
    dev: torch.device, budget_s: float, timer: Callable[[Callable[[], Any]], float], size: int
) -> Tuple[float, str]:
    """Best bytes/s of ``out = a + b``, ``out += b`` (3 buffers moved) and ``out.copy_(a)`` (2)."""
    numel = size // 4
    a = torch.rand(numel, device=dev)
    b = torch.rand(numel, device=dev)
    out = torch.empty_like(a)
    rates = {}
    for name, moved, fn in (
        ("add", 3 * numel * 4, lambda: torch.add(a, b, out=out)),
        # writes lines it has just read: no write-allocate traffic beyond the 3 buffers counted
        ("add_", 3 * numel * 4, lambda: out.add_(b)),
        ("copy", 2 * numel * 4, lambda: out.copy_(a)),
    ):
        spent = timer(fn)  # warm: first touch of the output pages
        best, repeats = float("inf"), 0
        while repeats < 3 or (spent < budget_s / 6 and spent + best <= budget_s / 3):
            took = timer(fn)
            best, spent, repeats = min(best, took), spent + took, repeats + 1
        rates[name] = moved / max(best, 1e-12)
    name = max(rates, key=lambda k: rates[k])
    shown = ", ".join(f"{rates[k] / 1e9:.4g} GB/s {k}" for k in rates)
    return rates[name], f"best of {name} over {numel} float32 ({shown})"


def datasheet_roofs(gpu_name: str) -> Roofs:
    """Roofs of a GPU from the datasheet table (dense peaks; float32 without TF32)."""
    key = peaks.match_gpu(gpu_name)
    if key is None or key not in peaks.BANDWIDTH_GBPS:
        known = ", ".join(sorted(DEVICE_ALIASES))
        raise UsageError(f"no datasheet roofs for {gpu_name!r}; known: {known}, or 'this machine'")
    flops = {dtype: tflops * 1e12 for dtype, tflops in peaks.PEAK_TFLOPS[key].items()}
    return Roofs(flops, peaks.BANDWIDTH_GBPS[key] * 1e9, key, "datasheet (flopcount.bench.peaks)")


def named_roofs(name: str) -> Roofs:
    """Roofs for a device name: a datasheet GPU ("h100", "t4", "NVIDIA A100-SXM4-80GB"...)
    or "this machine" (measured here, cached)."""
    lowered = name.strip().lower()
    if lowered in THIS_MACHINE:
        return machine_roofs("cpu")
    return datasheet_roofs(DEVICE_ALIASES.get(lowered, name))


def roofs_for(device: torch.device, given: Optional[Roofs] = None) -> Roofs:
    """The roofs a profile on ``device`` uses: ``given``, else measured on this machine
    (cached). On CUDA the datasheet figures are kept in ``details`` as the second source."""
    if given is not None:
        return given
    measured = machine_roofs(device)
    if device.type != "cuda":
        return measured
    try:
        sheet = datasheet_roofs(torch.cuda.get_device_name(device))
    except UsageError:
        return measured
    details = dict(measured.details)
    details["datasheet"] = sheet.to_dict()
    return Roofs(measured.peak_flops, measured.bandwidth, measured.device, measured.source, details)
