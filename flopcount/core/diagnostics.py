"""Typed diagnostics for every reading (issue #27 item 6): each result's ``diagnostics()``
turns what it already keeps (ops without a handler, gaps, its warnings and notes) into
:class:`~flopcount.types.Diagnostic` records, each once, so a report or a CI gate reads
records instead of parsing sentences."""

from __future__ import annotations

from typing import Dict, Iterable, Mapping, Tuple

from flopcount.types import Diagnostic
from flopcount.units import ROOT_LABEL


def unsupported_ops(counts: Mapping[str, int]) -> Tuple[Diagnostic, ...]:
    """One "unsupported" record per op of ``{op: calls}``, worded as ``FlopResult``'s."""
    return tuple(Diagnostic("unsupported", f"{op} ran {n}x without a handler", op, (), n) for op, n in counts.items())


def module_place(path: str) -> str:
    """Where something happened, as a sentence names it: ``module 'path'``, or the root module
    with the label every per-module table gives the whole model (``units.ROOT_LABEL``)."""
    return f"module '{path}'" if path else f"the root module {ROOT_LABEL}"


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (its type's name when the message is empty)."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def unique(records: Iterable[Diagnostic]) -> Tuple[Diagnostic, ...]:
    """``records`` in order, each text once (the first record of a text wins)."""
    found: Dict[str, Diagnostic] = {}
    for record in records:
        found.setdefault(record.text, record)
    return tuple(found.values())


def from_texts(records: Iterable[Diagnostic], texts: Iterable[str]) -> Tuple[Diagnostic, ...]:
    """``records``, then each of ``texts`` no record already says as a "warning" record."""
    return unique([*records, *(Diagnostic("warning", text) for text in texts)])


class FromWarnings:
    """A reading whose only diagnostics are its ``warnings`` (a mixin of its dataclass)."""

    warnings: Tuple[str, ...]

    def diagnostics(self) -> Tuple[Diagnostic, ...]:
        """The reading's warnings as typed "warning" records, each once."""
        return from_texts((), self.warnings)
