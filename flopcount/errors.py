"""flopcount's exceptions and warning class. Each error names what is wrong and where; a count
argument (an int of at least some bound, not a bool) is checked by :func:`int_at_least`."""

from __future__ import annotations

import difflib
from typing import Any, Iterable, List


def close_names(word: str, names: Iterable[str]) -> List[str]:
    """Up to three of ``names`` close to ``word``, closest first (what a typo most likely meant)."""
    return difflib.get_close_matches(word, list(names), n=3)


def did_you_mean(word: str, names: Iterable[str]) -> str:
    """``"; did you mean a, b?"`` with up to three names close to ``word`` (``""`` when none is)."""
    close = close_names(word, names)
    return f"; did you mean {', '.join(close)}?" if close else ""


class FlopcountError(Exception):
    """Base class of every error flopcount raises."""


class UsageError(FlopcountError, ValueError):
    """Bad arguments to a flopcount function (wrong type, unknown option...)."""


class TensorParallelPlanError(UsageError):
    """The built-in tensor-parallel plan cannot split this model (``flopcount.plan`` with
    ``tp > 1`` and no ``tp_plan``). ``reason`` says why, ``choice`` is a remedy of the reason's
    own ("choose a tp that divides both"; "" when none); the message adds the Python API's
    remedies (:data:`REMEDY`), which the CLI, taking no ``tp_plan``, replaces by its own."""

    #: what a caller of flopcount.plan can do instead
    REMEDY = "pass tp_plan={module path: ParallelStyle}, or plan with tp=1"

    def __init__(self, reason: str, choice: str = ""):
        remedies = f"{choice}, {self.REMEDY}" if choice else self.REMEDY
        super().__init__(f"{reason}: {remedies}")
        self.reason = reason
        self.choice = choice


class TraceError(FlopcountError, RuntimeError):
    """The model's forward failed, or the tracer could not record it.

    ``module_path`` is the qualified name of the innermost module that was running
    ("" for the root), ``input_shapes`` describes the example inputs. ``decode_step``: the
    decode step of ``count_generation`` (counted from 0) whose forward failed, None for any
    other forward (the prefill's, a count's): the prompt itself ran.
    """

    def __init__(self, message: str, module_path: str | None = None, input_shapes: str | None = None):
        super().__init__(message)
        self.module_path = module_path
        self.input_shapes = input_shapes
        self.decode_step: int | None = None


class NeedsDataError(UsageError, TraceError):
    """The forward cannot run on the meta device or on fake tensors: an op of module
    ``module_path`` needs the tensors' values (``.cpu()``, ``.numpy()``, ``.tolist()`` of a meta
    tensor, ``nonzero``, an op without a meta kernel), which such tensors do not have. A
    :class:`UsageError` (the remedy is the caller's: real weights and inputs, or
    ``tracer="dispatch"`` on real tensors) and a :class:`TraceError` (it names the module)."""


class HandlerError(FlopcountError, RuntimeError):
    """A handler failed on an op's shapes; names the op, module and shapes."""


class UnsupportedOpError(FlopcountError, RuntimeError):
    """Raised under ``strict=True`` when ops without a handler ran."""


class DuplicateHandlerError(FlopcountError, ValueError):
    """A handler is already registered for that op (pass ``replace=True`` to override)."""


class FlopcountWarning(UserWarning):
    """Warnings flopcount emits; filter with ``warnings.filterwarnings(..., category=FlopcountWarning)``."""


class UnsupportedOpsWarning(FlopcountWarning):
    """Ops without a handler ran and were not counted (the result lists them in
    ``unsupported_ops()``); filter this class alone to silence just that warning."""


class EstimatedBoundWarning(FlopcountWarning):
    """A reading's bounds (``predict``, ``profile``'s attainable times, ``serve``) rest on this
    machine's roofs measured under load, which failed the sanity check (``Roofs.doubts``): rates
    below what the machine does, so each bound is an estimate, not a bound (the result's
    ``bound_certain`` is False); filter this class alone to silence just that warning."""


def is_int_at_least(value: object, low: int) -> bool:
    """Whether ``value`` is an int of at least ``low``; a bool is not one here (Python's True is
    an int equal to 1, never a count a caller means)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def int_at_least(value: Any, low: int, name: str) -> int:
    """``value``, when :func:`is_int_at_least` holds; else a :class:`UsageError` naming the
    parameter (``name``, with the reading that takes it: ``"serve: tp"``) and what was given."""
    if not is_int_at_least(value, low):
        raise UsageError(f"{name} must be an int >= {low}, got {value!r}")
    return value
