"""flopcount's exceptions and warning class. Each error names what is wrong and where."""

from __future__ import annotations


class FlopcountError(Exception):
    """Base class of every error flopcount raises."""


class UsageError(FlopcountError, ValueError):
    """Bad arguments to a flopcount function (wrong type, unknown option...)."""


class TraceError(FlopcountError, RuntimeError):
    """The model's forward failed, or the tracer could not record it.

    ``module_path`` is the qualified name of the innermost module that was running
    ("" for the root), ``input_shapes`` describes the example inputs.
    """

    def __init__(self, message: str, module_path: str | None = None, input_shapes: str | None = None):
        super().__init__(message)
        self.module_path = module_path
        self.input_shapes = input_shapes


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
