"""Tables and JSON of a generation count (prefill + decode steps)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List

from flopcount.core.rendering import renders
from flopcount.report.table import grid
from flopcount.types import CONVENTION
from flopcount.units import format_bytes, format_count, with_unit

if TYPE_CHECKING:
    from flopcount.generation.count import GenerationResult


def _rows(result: GenerationResult) -> List[List[str]]:
    batch, prompt, steps = result.batch, result.prompt_tokens, len(result.steps)
    prefill_what = "encoder + first decoder token" if result.encoder_decoder else f"{prompt} prompt positions"
    rows = [
        ["prefill", prefill_what, format_count(result.prefill.macs), format_count(result.prefill.flops),
         f"{format_count(result.prefill_flops_per_token)} / prompt token"],
    ]
    if steps:
        first, last = result.steps[0], result.steps[-1]
        rows.append([
            "decode", f"{steps} steps, context {prompt + 1}..{prompt + steps}" if not result.encoder_decoder
            else f"{steps} steps, decoder context 2..{steps + 1}",
            format_count(result.decode_macs), format_count(result.decode_flops),
            f"{format_count(result.decode_flops_per_token)} / new token (first {format_count(first.flops / batch)}, "
            f"last {format_count(last.flops / batch)})",
        ])
    rows.append(["total", f"{result.new_tokens} new tokens x batch {batch}", format_count(result.macs),
                 format_count(result.flops), ""])
    return rows


@renders("GenerationResult", "table")
def generation_table(result: GenerationResult, fmt: str = "simple") -> str:
    """Prefill, decode and total rows, then the KV cache, parameters and the convention."""
    table = grid(_rows(result), ["phase", "work", "MACs", "FLOPs", "per token"], fmt, ("left", "left", "right", "right", "left"))
    params = result.prefill
    active = "" if params.parameters.active is None else f" ({format_count(params.active_params)} active per token)"
    lines = [
        table,
        f"Total: {with_unit(result.flops, 'FLOPs')}, {with_unit(result.macs, 'MACs')}; KV cache after the last step "
        f"{format_bytes(result.kv_cache_bytes)}{f' ({result.kv_cache_dtype})' if result.kv_cache_dtype else ''} held, "
        f"{format_bytes(result.kv_cache_position_bytes)} in the positions it keeps; {format_count(params.params)} params{active}; "
        f"batch {result.batch}, prompt {result.prompt_tokens} positions",
        CONVENTION,
    ]
    lines += [f"note: {w}" for w in result.warnings]
    reasons = result.incomplete_reasons()
    if reasons:
        lines.append("WARNING: the count may be short: " + "; ".join(reasons))
    return "\n".join(lines)


@renders("GenerationResult", "dict")
def generation_to_dict(result: GenerationResult) -> Dict[str, Any]:
    """JSON-safe: totals, per-token figures, the KV cache, and each step's MACs and FLOPs."""
    return {
        "convention": CONVENTION,
        **{key: getattr(result, key) for key in ("batch", "prompt_tokens", "new_tokens", "encoder_decoder", "macs", "flops")},
        "prefill": {"macs": result.prefill.macs, "flops": result.prefill.flops},
        "decode": {"macs": result.decode_macs, "flops": result.decode_flops},
        "prefill_flops_per_token": result.prefill_flops_per_token,
        "decode_flops_per_token": result.decode_flops_per_token,
        "steps": [{"macs": s.macs, "flops": s.flops} for s in result.steps],
        **{key: getattr(result, key) for key in ("kv_cache_bytes", "kv_cache_position_bytes", "kv_cache_dtype")},
        "params": result.prefill.params,
        "active_params": result.prefill.active_params,
        "complete": result.complete,
        "incomplete_reasons": list(result.incomplete_reasons()),
        "warnings": list(result.warnings),
    }
