"""Typed diagnostics for every reading (issue #27 item 6): each result's ``diagnostics()``
turns what it already keeps (ops without a handler, gaps, its warnings and notes) into
:class:`~flopcount.types.Diagnostic` records, each once, so a report or a CI gate reads
records instead of parsing sentences."""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any, Dict, Iterable, Mapping, Tuple

from flopcount.errors import EstimatedBoundWarning
from flopcount.types import Diagnostic
from flopcount.units import ROOT_LABEL

if TYPE_CHECKING:
    from flopcount.devices.roofline import Roofs


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


def estimated_text(roofs: Roofs, figures: str) -> str:
    """The sentence a reading on ``roofs`` with doubts stores and warns, ``figures`` naming what
    it computed on them ("predict: each latency bound"): "... is an estimate, not a bound: roofs
    measured under load (load average 5.60 above the 2 cores)"; "" without doubts."""
    from flopcount.devices.roofline import doubts_text

    return f"{figures} is {doubts_text(roofs.doubts)}" if roofs.doubts else ""


def warn_estimated(roofs: Roofs, figures: str, stacklevel: int = 3) -> Tuple[str, ...]:
    """Warn once (:class:`~flopcount.errors.EstimatedBoundWarning`, at the reading's caller) that
    ``figures`` on ``roofs`` are estimates, where the roofs have doubts; the sentence, to store
    on the result (none without doubts). ``stacklevel``: the caller's frame as seen from here
    (3: the caller of the function that called this one)."""
    text = estimated_text(roofs, figures)
    say_estimated(text, stacklevel + 1)
    return (text,) if text else ()


def say_estimated(text: str, stacklevel: int = 3) -> None:
    """Warn :func:`estimated_text`'s sentence ``text``, made already (:class:`~flopcount.errors.EstimatedBoundWarning`,
    at the reading's caller: ``stacklevel`` as :func:`warn_estimated`'s); nothing for ""."""
    if text:
        warnings.warn(text, EstimatedBoundWarning, stacklevel=stacklevel)


def estimate_diagnostics(roofs: Roofs, figures: str) -> Tuple[Diagnostic, ...]:
    """One "estimate" record, :func:`estimated_text`'s sentence, where ``roofs`` have doubts."""
    text = estimated_text(roofs, figures)
    return (Diagnostic("estimate", text),) if text else ()


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


class OnRoofs:
    """A reading whose figures are computed on its ``roofs`` (a mixin of its dataclass:
    ``predict``, ``profile``, ``serve``), naming them in ``ESTIMATED`` ("predict: each latency
    bound"): where the roofs have doubts (this machine's, measured under load:
    :attr:`~flopcount.devices.roofline.Roofs.doubts`) each figure is an estimate, not a bound."""

    roofs: Roofs
    warnings: Tuple[str, ...]
    ESTIMATED = ""

    @property
    def bound_certain(self) -> bool:
        """False when the roofs have doubts: each figure is then an estimate, not a bound."""
        return self.roofs.certain

    def bound_fields(self) -> Dict[str, Any]:
        """``bound_certain`` and the doubts (``bound_doubts``), as the result's JSON has them."""
        return {"bound_certain": self.bound_certain, "bound_doubts": list(self.roofs.doubts)}

    def diagnostics(self) -> Tuple[Diagnostic, ...]:
        """That the figures are estimates ("estimate": roofs measured under load), then the
        warnings ("warning"), each once."""
        return from_texts(estimate_diagnostics(self.roofs, self.ESTIMATED), self.warnings)
