"""The number formatters, kept importable here (``flopcount.report.units.format_count``);
they live in :mod:`flopcount.units`, which readings may import too."""

from __future__ import annotations

from ..units import (
    SIZE_UNITS,
    escape_markdown,
    format_bytes,
    format_count,
    format_ms,
    format_share,
    show_value,
    with_unit,
)

__all__ = ["SIZE_UNITS", "escape_markdown", "format_bytes", "format_count", "format_ms", "format_share", "show_value", "with_unit"]
