"""What generate() runs: ``count --generate N`` (prefill plus N-1 decode steps of the loaded model) and
``flopcount serve`` (the ENTRY loaded on the meta device, generate()'s forwards counted once for a
--prompt-long prompt and priced on each --on part at each --batch size); transformers' notice that
the cache argument was renamed silenced for those calls only."""

from __future__ import annotations

import argparse
import contextlib
import json
from typing import Any, Iterator, List

from flopcount.cli.deadline import stage
from flopcount.cli.latency import math_modes
from flopcount.cli.output import emit, progress, written
from flopcount.cli.parser import EXIT_INCOMPLETE, EXIT_OK
from flopcount.errors import UsageError

__all__ = ["count_generation_command", "run_serve"]


def _ints(text: str, flag: str, what: str = "batch sizes", example: str = "1,8,64") -> List[int]:
    values: List[int] = []
    for part in text.split(","):
        try:
            value = int(part.strip())
        except ValueError:
            raise UsageError(f"{flag}: {part.strip()!r} is not an integer (e.g. {flag} {example})") from None
        if value < 1:
            raise UsageError(f"{flag}: {what} must be >= 1, got {value}")
        values.append(value)
    return values


def run_serve(args: argparse.Namespace) -> int:
    """Count once, price on every part, render once (and draw --plot)."""
    import torch

    from flopcount.cli.entry import meta_builder
    from flopcount.core.rendering import render
    from flopcount.decoding.forwards import is_encoder_decoder
    from flopcount.serving.serve import _part, check_before_count, serve_facts, serve_on

    lengths = _ints(args.prompt_lengths, "--prompt-lengths", "lengths", "512,2048") if args.prompt_lengths else None
    prompt = args.prompt if args.prompt is not None else max(lengths) if lengths else 2048
    longer = [n for n in lengths or () if n > prompt]
    if longer:  # in the flags' terms, before the model is built
        raise UsageError(f"--prompt-lengths: lengths must each be 1..{prompt} (the rows are left-padded to --prompt "
                         f"{prompt}), got {', '.join(map(str, longer))}: raise --prompt or leave it out (the longest)")
    batches = _ints(args.batch, "--batch") if args.batch else [len(lengths) if lengths else 1]
    parts = [p.strip() for p in args.on.split(",") if p.strip()]
    if not parts:
        raise UsageError("--on needs a part: h100, l4, 'a100 40gb', 'this machine'...")
    if not 0 <= args.reserve < 1:
        raise UsageError(f"--reserve must be a fraction in [0, 1), got {args.reserve}")
    # bad --on / --tp / math flags on this machine: one line before any work
    targets = [(name, _part(name, args.tp, modes=math_modes(args, name))) for name in parts]
    build = meta_builder(args, args.dtype, generating=True)
    stage(args, f"the import and construction of the model ({args.entry}, on the meta device)")
    model = build()
    check_before_count(model, args.tp, None, args.weight_dtype)
    if lengths and is_encoder_decoder(model):  # in the flag's terms (the API's names kwargs), before the count
        raise UsageError(f"--prompt-lengths prices a decoder-only model's padded prompt, and {args.entry} is an "
                         "encoder-decoder: leave --prompt-lengths out (its --prompt is priced unpadded)")
    ids = torch.zeros(len(lengths) if lengths else 1, prompt, dtype=torch.int64, device="meta")
    prompts = f"{len(lengths)} prompts of {','.join(map(str, lengths))} tokens left-padded to {prompt}" if lengths \
        else f"a {prompt}-token prompt"
    progress(args, f"counting generate() of {args.new} new tokens after {prompts} (meta) ...")
    stage(args, f"the generation count of {args.entry}")
    with _without_cache_rename_notice():
        facts = serve_facts(model, ids, args.new, prompt_lengths=lengths)
    results = [
        serve_on(facts, roofs, part, capacity, link, batch=batches, weight_dtype=args.weight_dtype, tp=args.tp,
                 reserve=args.reserve)
        for _, (roofs, part, capacity, link) in targets
    ]
    if args.plot:
        from flopcount.report.serving import plot_serving

        written(args, "--plot", args.plot, lambda: plot_serving(results, args.plot, batches))
    if args.format == "json":
        text = json.dumps({"entry": args.entry, "parts": [r.to_dict() for r in results]}, indent=2)
    else:
        shown = f"prompts {','.join(map(str, lengths))} padded to {prompt}" if lengths else f"prompt {prompt}"
        heading = f"{args.entry} | serve: {shown}, {args.new} new tokens"
        text = "\n\n".join([heading] + [render(r, args.format) for r in results])
    emit(text, args)
    return EXIT_OK if facts.complete else EXIT_INCOMPLETE


def count_generation_command(run: Any, args: argparse.Namespace, label: str) -> int:
    """``count --generate N``: prefill plus N-1 decode steps, rendered once."""
    import torch

    from flopcount.generation.count import count_generation
    from flopcount.report.render import render_generation

    if args.backward or args.plot or args.optimizer:
        raise UsageError("--generate counts inference only: drop --backward, --optimizer and --plot")
    prompt = run.inputs[0] if isinstance(run.inputs, tuple) and len(run.inputs) == 1 else run.inputs
    if not isinstance(prompt, torch.Tensor):
        raise UsageError("--generate needs one prompt tensor: --input BATCHxLENGTH:int64 (token ids)")
    progress(args, f"counting generate() of {args.generate} new tokens after a {tuple(prompt.shape)} prompt ...")
    stage(args, f"the generation count of {label} ({args.generate} new tokens)")
    with _without_cache_rename_notice():
        result = count_generation(run.model, prompt, new_tokens=args.generate, kwargs=run.kwargs)
    emit(render_generation(result, args.format, entry=label), args)
    return EXIT_OK


@contextlib.contextmanager
def _without_cache_rename_notice() -> Iterator[None]:
    """transformers' notices that ``past_key_values`` is now called ``cache`` (a log line, and a
    FutureWarning on some models' forward), silenced for this call only: the filters go after."""
    import logging
    import warnings

    def notice(record: logging.LogRecord) -> bool:  # "`past_key_values`/`cache_params` are deprecated": our argument's name
        return "are deprecated. Use `cache` instead" not in record.getMessage()

    logger = logging.getLogger("transformers.utils.generic")
    logger.addFilter(notice)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r"`past_key_values` is deprecated", category=FutureWarning)
            yield
    finally:
        logger.removeFilter(notice)
