"""Moved to :mod:`flopcount.devices.roofline` (the one roofline function); these names stay
importable from here as plain aliases."""

from __future__ import annotations

from .devices.roofline import (  # noqa: F401
    DEFAULT_DTYPE,
    PROFILE_CONVENTION,
    AnyBound,
    Bound,
    MemoryLevel,
    OpTime,
    Roofs,
    any_implementation,
    attainable,
    bound,
    compute_time,
    efficiency,
    intensity,
    memory_time,
    op_time,
)
