"""Text renderings of benchmark results: the summary of ``str(BenchmarkResult)`` and the
rows the CLI's ``bench`` command prints."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, Tuple

from flopcount.core.rendering import renders
from flopcount.units import format_bytes, format_count, format_ms, with_unit

if TYPE_CHECKING:
    from flopcount.bench.result import BenchmarkResult


#: the latency statistics a benchmark reports, in the order they are shown
_STATS = ("median", "mean", "p90", "p99", "min", "max", "std")


def _in_ms(stats: Any) -> Dict[str, float]:
    """Each of :data:`_STATS` in milliseconds (the data holds seconds; a rendering shows ms)."""
    return {name: 1e3 * getattr(stats, f"{name}_s") for name in _STATS}


@renders("BenchmarkResult", "text")
def benchmark_text(result: BenchmarkResult) -> str:
    """A few lines: device and mode, the statistics, throughput, achieved FLOP/s, memory, warnings."""
    s = result.stats
    ms = _in_ms(s)
    mode = "torch.compile" if result.compiled else "eager"
    lines = [
        f"latency on {device_text(result)} ({result.timing}, {mode}, dtype {result.dtype or 'as model'}, "
        f"{s.iters} iterations after {result.warmup} warm-up)",
        f"  median {ms['median']:.4g} ms | mean {ms['mean']:.4g} | p90 {ms['p90']:.4g} | p99 {ms['p99']:.4g} | "
        f"min {ms['min']:.4g} | max {ms['max']:.4g} | std {ms['std']:.3g} (CV {100 * s.cv:.1f}%, IQR/median {100 * s.rel_iqr:.1f}%)",
        f"  throughput {with_unit(result.throughput, 'samples/s')} ({batch_text(result)}), {with_unit(result.iters_per_s, 'it/s')}",
    ]
    caveat = tail_caveat(s.iters)
    if caveat:
        lines.insert(2, f"  {caveat}")
    if result.compile_s is not None:
        lines.append(f"  compile warm-up (first call) {result.compile_s * 1e3:.4g} ms, not in the statistics")
    if result.achieved_flops_per_s is not None:
        line = f"  achieved {with_unit(result.achieved_flops_per_s, 'FLOP/s')}"
        if result.mfu is not None:
            line += f", MFU {100 * result.mfu:.2f}% of {with_unit(result.peak_flops or 0, 'FLOP/s')} ({result.peak_source})"
        lines.append(line)
    if result.peak_memory_bytes is not None:
        lines.append(f"  memory {format_bytes(result.peak_memory_bytes)} ({result.memory_kind})")
    lines.extend(f"  warning: {w}" for w in result.warnings)
    return "\n".join(lines)


def device_text(result: BenchmarkResult) -> str:
    """``cpu, 2 threads``: on a CPU the latency depends on torch's thread count, which the
    result records (``threads``); a GPU's device alone."""
    if result.device.startswith("cpu") and result.threads:
        return f"{result.device}, {result.threads} thread{'s' if result.threads != 1 else ''}"
    return result.device


def batch_text(result: BenchmarkResult) -> str:
    """``batch 10: dim 0 of Tensor[10, 4, 16]``: the batch and which dimension it was read from."""
    return f"batch {result.batch_size}: {result.batch_source}" if result.batch_source else f"batch {result.batch_size}"


def tail_note(n: int, p: float) -> str:
    """A caveat for the ``p``-th percentile of ``n`` samples: ``""`` when about ten or more
    samples lie above it, else how little it rests on."""
    above = n * (100 - p) / 100
    if above < 1:
        return f" (only {n} samples: about the max)"
    return f" (rough: {n} samples)" if above < 10 else ""


def tail_caveat(n: int) -> str:
    """One sentence when p90/p99 rest on too few samples to be more than the largest ones."""
    if n >= 1000:
        return ""
    need = "p90" if n < 100 else "p99"
    return (f"note: {need} from {n} samples is little more than the largest sample"
            f" (about {1000 if need == 'p99' else 100} samples make it stable: raise --duration or --iters)")


#: the unit of each bench row's raw value (``--format csv``'s ``unit`` column)
BENCH_UNITS = {
    **dict.fromkeys(_STATS, "ms"), "iterations": "calls", "throughput": "samples/s", "FLOPs": "FLOPs", "MACs": "MACs", "params": "parameters",
    "achieved": "FLOP/s", "MFU": "fraction of peak",
}


def bench_unit(label: str) -> str:
    """The unit of a :func:`bench_rows` row's raw value (``memory (...)`` rows are bytes)."""
    return "bytes" if label.startswith("memory") else BENCH_UNITS.get(label, "")


def bench_rows(result: Any, timing: BenchmarkResult) -> List[Tuple[str, str, Any]]:
    """(label, human text, raw value) for each line of the CLI's bench summary (times in ms:
    the data holds seconds, a rendering shows milliseconds)."""
    ms = _in_ms(timing)
    tails = {"p90": tail_note(timing.iters, 90), "p99": tail_note(timing.iters, 99)}
    rows: List[Tuple[str, str, Any]] = [(name, format_ms(ms[name]) + tails.get(name, ""), ms[name]) for name in _STATS]
    rows += [
        ("iterations", str(timing.iters), timing.iters),
        ("throughput", f"{timing.throughput:.1f} samples/s ({batch_text(timing)})", timing.throughput),
        ("FLOPs", with_unit(result.flops, "FLOPs"), result.flops),
        ("MACs", with_unit(result.macs, "MACs"), result.macs),
        ("params", format_count(result.params), result.params),
    ]
    achieved = timing.achieved_flops_per_s
    if achieved is not None:
        rows.append(("achieved", with_unit(achieved, "FLOP/s"), achieved))
    if timing.mfu is not None:
        rows.append(("MFU", f"{100 * timing.mfu:.2f}%", timing.mfu))
    memory = timing.peak_memory_bytes
    if memory is not None:
        rows.append((f"memory ({timing.memory_kind})", format_bytes(memory), memory))
    return rows
