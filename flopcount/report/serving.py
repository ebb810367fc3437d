"""Tables, JSON and the tokens/s-against-batch plot of a serving reading."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, Optional, Sequence

from flopcount.core.rendering import renders
from flopcount.devices.roofline import ESTIMATE_MARK, Roofs, float32_math_text
from flopcount.report.notes import estimate_line, marked
from flopcount.report.table import grid
from flopcount.units import format_bytes, format_count, format_seconds

if TYPE_CHECKING:
    from flopcount.serving.result import Phase, ServeResult


def _rate(value: Optional[float], roofs: Roofs) -> str:
    return "-" if value is None else marked(f"{value:,.1f}" if value < 1e6 else format_count(value), roofs)


def _phase(phase: Optional[Phase], roofs: Roofs) -> str:
    return "-" if phase is None else marked(f"{format_seconds(phase.seconds)} ({phase.bound})", roofs)


@renders("ServeResult", "table")
def serve_table(result: ServeResult, fmt: str = "simple") -> str:
    """One row per batch size, then memory, capacity and what the bounds leave out."""
    facts = result.facts
    roofs = result.roofs
    rows = [
        [str(row.batch), _phase(row.prefill, roofs), _phase(row.first_step, roofs), _phase(row.last_step, roofs),
         _rate(row.tokens_per_s_per_sequence, roofs), _rate(row.tokens_per_s, roofs), format_bytes(row.memory_bytes),
         "-" if row.fits is None else ("yes" if row.fits else "NO")]
        for row in result.batches
    ]
    at_least, at_most = (">=", "<=") if roofs.certain else (ESTIMATE_MARK, ESTIMATE_MARK)
    heads = ["batch", f"TTFT {at_least}", f"ITL first {at_least}", f"ITL last {at_least}", f"tok/s/seq {at_most}",
             f"tok/s {at_most}", "memory", "fits"]
    table = grid(rows, heads, fmt)
    steps = len(facts.steps)
    context = (f"prompt {facts.prompt_tokens}, {facts.new_tokens} new tokens (decode context "
               f"{facts.prompt_tokens + 1}..{facts.prompt_tokens + steps})" if steps else
               f"prompt {facts.prompt_tokens}, 1 new token (prefill only)")
    rank = f", per rank of tp={result.tp} over {result.link}" if result.tp > 1 else ""
    math = float32_math_text(result.float32_math())
    lines = [
        f"{result.part}: compute {result.dtype}{f' ({math})' if math else ''}, {result.weight_note}{rank}; {context}",
        table,
        f"weights {format_bytes(result.weight_bytes)}; KV cache {format_bytes(result.kv_bytes_per_token)} per token, "
        f"{format_bytes(result.kv_bytes_per_sequence)} per sequence at the final context"
        f"{f' ({facts.cache_dtype})' if facts.cache_dtype else ''}; activations >= "
        f"{format_bytes(facts.activation_bytes / result.tp)} per sequence (the largest tensor one op writes)",
        f"prefill {format_count(facts.prefill.flops)}FLOPs per sequence; decode "
        f"{format_count(sum(s.flops for s in facts.steps) / max(1, steps))}FLOPs per token per sequence (mean)",
    ]
    if result.capacity_bytes is not None:
        fits = "none" if result.max_batch == 0 else str(result.max_batch)
        lines.append(
            f"capacity: {format_bytes(result.capacity_bytes)} less a {result.reserve:.0%} reserve = "
            f"{format_bytes(result.usable_bytes or 0)} usable: at most {fits} sequences of this length fit"
        )
    lines.append("decode turns compute-bound at batch " + (str(result.compute_bound_batch) if result.compute_bound_batch
                                                            else "- (never: the cache's bytes grow with the FLOPs)"))
    lines += [line for line in (estimate_line(roofs),) if line]
    lines.append(result.leaves_out)
    lines += [f"note: {d.text}" for d in result.diagnostics() if d.kind == "warning"]  # the estimate: its ~ line
    return "\n".join(lines)


@renders("ServeResult", "markdown")
def serve_markdown(result: ServeResult) -> str:
    return serve_table(result, "github")


@renders("ServeResult", "dict")
def serve_dict(result: ServeResult) -> Dict[str, Any]:
    facts = result.facts
    return {
        "part": result.part, "dtype": result.dtype, "weight_dtype": result.weight_dtype, "tp": result.tp,
        "link": result.link, "roofs": result.roofs.to_dict(), "float32_math": result.float32_math(),
        "prompt_tokens": facts.prompt_tokens, "sequence_lengths": list(facts.sequence_lengths),
        "new_tokens": facts.new_tokens, "batches": [row.to_dict() for row in result.batches],
        "weight_bytes": result.weight_bytes, "weight_note": result.weight_note,
        "kv_bytes_per_token": result.kv_bytes_per_token, "kv_bytes_per_sequence": result.kv_bytes_per_sequence,
        "kv_cache_dtype": facts.cache_dtype, "activation_bytes_per_sequence": facts.activation_bytes / result.tp,
        "capacity_bytes": result.capacity_bytes, "reserve": result.reserve, "usable_bytes": result.usable_bytes,
        "max_batch": result.max_batch, "compute_bound_batch": result.compute_bound_batch,
        "prefill_flops_per_sequence": facts.prefill.flops,
        "decode_flops_per_token": sum(s.flops for s in facts.steps) / max(1, len(facts.steps)),
        "complete": result.complete, "leaves_out": result.leaves_out, "warnings": list(result.warnings),
        **result.bound_fields(),
    }


def plot_serving(results: Sequence[ServeResult], path: str, batches: Sequence[int] = ()) -> None:
    """Decode tokens/s ceiling against batch for each result's part, the memory wall (the
    largest batch that fits) drawn as a vertical line in the part's colour; batches past the
    wall dotted and faint (they do not fit)."""
    from flopcount.report.plot import new_figure

    fig = new_figure(figsize=(7, 4.5))
    ax = fig.add_subplot()
    top = max([64, *batches, *[(r.max_batch or 0) * 2 for r in results]])
    grid = sorted({*batches, *[2**i for i in range(0, max(1, top).bit_length() + 1)]})
    for index, result in enumerate(results):
        colour = f"C{index}"
        xs = [b for b in grid if b <= top]
        ys = [result.at(b).tokens_per_s or 0.0 for b in xs]
        wall = result.max_batch if result.max_batch is not None else top
        fits = [(x, y) for x, y in zip(xs, ys) if x <= wall]
        label = f"{result.part} ({result.weight_dtype}, tp={result.tp})" + (
            "" if result.bound_certain else f" {ESTIMATE_MARK} estimates: roofs measured under load")
        if fits:
            ax.plot(*zip(*fits), marker="o", color=colour, label=label)
        beyond = [(x, y) for x, y in zip(xs, ys) if x >= (fits[-1][0] if fits else 0)]
        if len(beyond) > 1:  # past the memory wall: does not fit, drawn faint
            ax.plot(*zip(*beyond), linestyle=":", color=colour, alpha=0.4)
        if result.max_batch:
            ax.axvline(result.max_batch, color=colour, linestyle="--", linewidth=1)
            ax.annotate(f"memory wall {result.max_batch}", (result.max_batch, max(ys) * 0.05), color=colour,
                        rotation=90, fontsize=8)
    ax.set_xscale("log", base=2)
    ax.set(yscale="log", xlabel="batch (sequences)", ylabel="decode tokens/s ceiling (all sequences)")
    first = results[0].facts
    ax.set_title(f"prompt {first.prompt_tokens}, {first.new_tokens} new tokens: ceilings (any implementation)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
