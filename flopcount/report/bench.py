"""Text renderings of benchmark results: the summary of ``str(BenchmarkResult)`` and the
rows the CLI's ``bench`` command prints."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, List, Tuple

from .units import format_bytes, format_count, format_ms, with_unit

if TYPE_CHECKING:
    from ..bench.result import BenchmarkResult


def benchmark_text(result: BenchmarkResult) -> str:
    """A few lines: device and mode, the statistics, throughput, achieved FLOP/s, memory, warnings."""
    s = result.stats
    mode = "torch.compile" if result.compiled else "eager"
    lines = [
        f"latency on {result.device} ({result.timing}, {mode}, dtype {result.dtype or 'as model'}, "
        f"{s.iters} iterations after {result.warmup} warm-up)",
        f"  median {s.median_ms:.4g} ms | mean {s.mean_ms:.4g} | p90 {s.p90_ms:.4g} | p99 {s.p99_ms:.4g} | "
        f"min {s.min_ms:.4g} | max {s.max_ms:.4g} | std {s.std_ms:.3g} (CV {100 * s.cv:.1f}%, IQR/median {100 * s.rel_iqr:.1f}%)",
        f"  throughput {with_unit(result.throughput, 'samples/s')} (batch {result.batch_size}), {with_unit(result.iters_per_s, 'it/s')}",
    ]
    if result.compile_ms is not None:
        lines.append(f"  compile warm-up (first call) {result.compile_ms:.4g} ms, not in the statistics")
    if result.achieved_flops_per_s is not None:
        line = f"  achieved {with_unit(result.achieved_flops_per_s, 'FLOP/s')}"
        if result.mfu is not None:
            line += f", MFU {100 * result.mfu:.2f}% of {with_unit(result.peak_flops or 0, 'FLOP/s')} ({result.peak_source})"
        lines.append(line)
    if result.peak_memory_bytes is not None:
        lines.append(f"  memory {format_bytes(result.peak_memory_bytes)} ({result.memory_kind})")
    lines.extend(f"  warning: {w}" for w in result.warnings)
    return "\n".join(lines)


def bench_rows(result: Any, timing: BenchmarkResult) -> List[Tuple[str, str, Any]]:
    """(label, human text, raw value) for each line of the CLI's bench summary."""
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
    achieved = timing.achieved_flops_per_s
    if achieved is not None:
        rows.append(("achieved", with_unit(achieved, "FLOP/s"), achieved))
    if timing.mfu is not None:
        rows.append(("MFU", f"{100 * timing.mfu:.2f}%", timing.mfu))
    memory = timing.peak_memory_bytes
    if memory is not None:
        rows.append((f"memory ({timing.memory_kind})", format_bytes(memory), memory))
    return rows
