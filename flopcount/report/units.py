"""The one place numbers become human-readable text."""

from __future__ import annotations

from typing import Optional

_PREFIXES = ((10**12, "T"), (10**9, "G"), (10**6, "M"), (10**3, "K"))


def format_count(value: Optional[float], digits: int = 3) -> str:
    """``4_089_184_256 -> '4.089 G'``; small values stay exact (``'512'``)."""
    if value is None:
        return "-"
    sign = "-" if value < 0 else ""
    value = abs(value)
    for scale, prefix in _PREFIXES:
        if value >= scale:
            return f"{sign}{value / scale:.{digits}f} {prefix}"
    return f"{sign}{value:g}" if isinstance(value, float) else f"{sign}{value}"


def with_unit(value: Optional[float], unit: str) -> str:
    """``(4.089e9, "MACs") -> '4.089 GMACs'``; ``(12, "FLOPs") -> '12 FLOPs'``."""
    text = format_count(value)
    return f"{text}{unit}" if text[-1:].isalpha() else f"{text} {unit}"


def format_bytes(value: int) -> str:
    """Binary units: ``102_760_448 -> '98.00 MiB'``."""
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.2f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def format_share(part: int, whole: int) -> str:
    if whole <= 0:
        return "-"
    return f"{100.0 * part / whole:.1f}%"


def format_ms(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.3f} ms"
