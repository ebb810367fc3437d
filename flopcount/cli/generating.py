"""``count --generate N``: the cost of generation, with transformers' cache-rename notice
silenced for that call only."""

from __future__ import annotations

import argparse
import contextlib
from typing import Any, Iterator

from flopcount.cli.deadline import stage
from flopcount.cli.output import emit, progress
from flopcount.cli.parser import EXIT_OK
from flopcount.errors import UsageError

__all__ = ["count_generation_command"]


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


class _CacheRenameFilter:
    """Drops transformers' "`past_key_values`/`cache_params` are deprecated" log line: it
    is about the argument name flopcount's decoding loop passes, not about the user's code."""

    def filter(self, record: Any) -> bool:
        return "are deprecated. Use `cache` instead" not in record.getMessage()


@contextlib.contextmanager
def _without_cache_rename_notice() -> Iterator[None]:
    """transformers' notices that ``past_key_values`` is now called ``cache`` (a log line, and a
    FutureWarning on some models' forward), silenced for this call only: the filters go after."""
    import logging
    import warnings

    logger = logging.getLogger("transformers.utils.generic")
    notice = _CacheRenameFilter()
    logger.addFilter(notice)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r"`past_key_values` is deprecated", category=FutureWarning)
            yield
    finally:
        logger.removeFilter(notice)
