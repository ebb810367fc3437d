"""``flopcount diff A B`` and the baseline of ``check --baseline``: each side an ENTRY (loaded
and counted as ``count`` does) or a saved JSON report."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Callable, List, Optional, Tuple

from flopcount.cli.output import emit
from flopcount.cli.parser import EXIT_OK, pairs_once
from flopcount.errors import UsageError

#: the options that shape an ENTRY side's count (meaningless for a saved report)
_SHARED = (("inputs", "--input"), ("kwargs", "--kwarg"), ("config", "--config"))


def is_report(text: str) -> bool:
    """A side is a saved report when it names a ``.json`` file (``count --format json``).
    A Hugging Face ``config.json`` is an ENTRY written ``hf:./path``."""
    lowered = text.strip().lower()
    return lowered.endswith(".json") and not lowered.startswith(("hf:", "transformers:"))


def _merged(shared: List[Tuple[str, Any]], own: List[Tuple[str, Any]], flag: str) -> List[Tuple[str, Any]]:
    """``--config``/``--kwarg`` pairs of both sides, then one side's, the side's winning per key."""
    return list({**pairs_once(shared, flag), **pairs_once(own, flag)}.items())


def side_args(args: argparse.Namespace, side: str, entry: str) -> argparse.Namespace:
    """The options ``count`` would get for one side: the shared ones with the side's own over them."""
    ns = argparse.Namespace(**vars(args))
    ns.entry = entry
    ns.inputs = list(getattr(args, f"{side}_inputs")) or list(args.inputs)
    ns.kwargs = _merged(args.kwargs, getattr(args, f"{side}_kwargs"), f"--{side}-kwarg")
    ns.config = _merged(args.config, getattr(args, f"{side}_config"), f"--{side}-config")
    ns.output = ns.plot = ns.generate = ns.optimizer = None
    return ns


def _side_options(args: argparse.Namespace, side: str) -> List[str]:
    return [f"--{side}-{flag[2:]}" for attr, flag in _SHARED if getattr(args, f"{side}_{attr}")]


#: counts one ENTRY side (the command's options for it) into a FlopResult carrying its
#: ``entry`` (and ``memory``) sections: cli.commands' count, handed in (no import cycle)
CountEntry = Callable[[argparse.Namespace, str], Any]


def count_side(args: argparse.Namespace, side: str, text: str, count_entry: CountEntry) -> Any:
    """One side of a diff as a FlopResult: a saved report read back, or an ENTRY counted
    (with its peak memory under ``--memory``), labelled as ``count`` labels it."""
    from flopcount.core.results import load_report

    name = side.upper()
    if is_report(text):
        own = _side_options(args, side)
        if own:
            raise UsageError(f"{', '.join(own)}: {name} is a saved report ({text}), not an ENTRY to count")
        return load_report(text)
    return count_entry(side_args(args, side, text), name)


def run_diff(args: argparse.Namespace, count_entry: CountEntry) -> int:
    from flopcount.diffs import diff

    reports = [is_report(text) for text in (args.a, args.b)]
    if all(reports):
        used = [flag for attr, flag in _SHARED if getattr(args, attr)]
        used += [flag for flag, on in (("--backward", args.backward), ("--memory", args.memory)) if on]
        if used:
            raise UsageError(f"{', '.join(used)}: A and B are both saved reports; these options shape a count of an ENTRY")
    result_a = count_side(args, "a", args.a, count_entry)
    result_b = count_side(args, "b", args.b, count_entry)
    change = diff(result_a, result_b, a_label=_label(args.a, result_a), b_label=_label(args.b, result_b))
    emit(render_diff(change, args.format, depth=args.depth, top=args.top), args)
    return EXIT_OK


def _label(text: str, result: Any) -> str:
    """What a side is called: a report's path (with the ENTRY it was counted from), or the
    ENTRY with its --config overrides."""
    entry = result.sections.get("entry")
    if is_report(text):
        return f"{text} ({entry})" if entry else text
    return str(entry or text)


def render_diff(change: Any, fmt: str, *, depth: Optional[int], top: Optional[int]) -> str:
    if fmt == "markdown":
        return str(change.to_markdown(max_depth=depth, top=top or 10))
    if fmt == "json":
        return str(change.to_json(max_depth=depth))
    if fmt == "csv":
        return str(change.to_csv(max_depth=depth))
    return str(change.table(max_depth=depth, top=top))


def baseline_report(path: str) -> Any:
    """The saved report ``check --baseline`` compares with."""
    from flopcount.core.results import load_report

    if not Path(path).is_file():
        raise UsageError(f"--baseline {path}: no such file (write it with: flopcount count ENTRY --format json --output {path})")
    return load_report(path)
