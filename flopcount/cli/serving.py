"""``flopcount serve``: load the ENTRY on the meta device, count generate()'s forwards once
for a --prompt-long prompt, and price them on each --on part at each --batch size."""

from __future__ import annotations

import argparse
import json
from typing import List

from flopcount.cli.deadline import stage
from flopcount.cli.output import emit, progress
from flopcount.cli.parser import EXIT_INCOMPLETE, EXIT_OK, pairs_once
from flopcount.errors import UsageError

__all__ = ["run_serve"]


def _ints(text: str, flag: str) -> List[int]:
    values: List[int] = []
    for part in text.split(","):
        try:
            value = int(part.strip())
        except ValueError:
            raise UsageError(f"{flag}: {part.strip()!r} is not an integer (e.g. {flag} 1,8,64)") from None
        if value < 1:
            raise UsageError(f"{flag}: batch sizes must be >= 1, got {value}")
        values.append(value)
    return values


def run_serve(args: argparse.Namespace) -> int:
    """Count once, price on every part, render once (and draw --plot)."""
    import torch

    from flopcount.cli.entry import load_entry
    from flopcount.cli.generating import _without_cache_rename_notice
    from flopcount.cli.specs import parse_dtype
    from flopcount.core.rendering import render
    from flopcount.serving.serve import _part, serve_facts, serve_on

    batches = _ints(args.batch, "--batch")
    parts = [p.strip() for p in args.on.split(",") if p.strip()]
    if not parts:
        raise UsageError("--on needs a part: h100, l4, 'a100 40gb', 'this machine'...")
    if not 0 <= args.reserve < 1:
        raise UsageError(f"--reserve must be a fraction in [0, 1), got {args.reserve}")
    targets = [(name, _part(name, args.tp)) for name in parts]  # bad --on / --tp: one line before any work
    cast = parse_dtype(args.dtype, "--dtype") if args.dtype else None
    config = pairs_once(args.config, "--config")
    stage(args, f"the import and construction of the model ({args.entry}, on the meta device)")
    model = load_entry(args.entry, device="meta", config=config).model
    if cast is not None:
        model = model.to(cast)
    ids = torch.zeros(1, args.prompt, dtype=torch.int64, device="meta")
    progress(args, f"counting generate() of {args.new} new tokens after a {args.prompt}-token prompt (meta) ...")
    stage(args, f"the generation count of {args.entry}")
    with _without_cache_rename_notice():
        facts = serve_facts(model, ids, args.new)
    results = [
        serve_on(facts, roofs, part, capacity, link, batch=batches, weight_dtype=args.weight_dtype, tp=args.tp,
                 reserve=args.reserve)
        for _, (roofs, part, capacity, link) in targets
    ]
    if args.plot:
        from flopcount.report.serving import plot_serving

        plot_serving(results, args.plot, batches)
    if args.format == "json":
        text = json.dumps({"entry": args.entry, "parts": [r.to_dict() for r in results]}, indent=2)
    else:
        heading = f"{args.entry} | serve: prompt {args.prompt}, {args.new} new tokens"
        text = "\n\n".join([heading] + [render(r, args.format) for r in results])
    emit(text, args)
    return EXIT_OK if facts.complete else EXIT_INCOMPLETE
