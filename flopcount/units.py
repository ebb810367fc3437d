"""The one place numbers become human-readable text. Neutral: imports nothing from flopcount,
so a reading (``budget``) and the renderers in ``report`` share one spelling of a number."""

from __future__ import annotations

from typing import Optional, Union

_PREFIXES = ((10**12, "T"), (10**9, "G"), (10**6, "M"), (10**3, "K"))

#: the whole model's row in every per-module table (its qualified name is "")
ROOT_LABEL = "(model)"


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


#: the one definition of a byte size flopcount prints: decimal units, like the K/M/G of
#: counts and the ``--max-size-mb`` budget (1 kB = 10^3 bytes, 1 MB = 10^6, 1 GB = 10^9)
SIZE_UNITS = "1 MB = 10^6 bytes"


def format_bytes(value: float) -> str:
    """Decimal units: ``102_440_000 -> '102.44 MB'`` (1 MB = 10^6 bytes)."""
    size = float(value)
    for unit in ("B", "kB", "MB", "GB"):
        if abs(size) < 1000:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.2f} {unit}"
        size /= 1000
    return f"{size:.2f} TB"


def escape_markdown(cell: object) -> str:
    """A table cell safe inside a GitHub markdown table (``|`` would end the cell)."""
    return str(cell).replace("\\", "\\\\").replace("|", "\\|")


def format_share(part: float, whole: float) -> str:
    return "-" if whole <= 0 else f"{100.0 * part / whole:.1f}%"


def format_seconds(value: Optional[float], decimals: int = 3) -> str:
    """The one spelling of a time: ``0.00123 -> '1.230 ms'``, ``2.5 -> '2.500 s'``; microseconds
    below a millisecond, nanoseconds below a microsecond, minutes from two (``'3 min 20 s'``).
    ``decimals`` sets the digits of seconds and milliseconds (fewer for an estimate)."""
    if value is None:
        return "-"
    if value >= 120:
        return f"{int(value // 60)} min {int(value % 60)} s"
    if value >= 1.0:
        return f"{value:.{decimals}f} s"
    if value >= 1e-3:
        return f"{value * 1e3:.{decimals}f} ms"
    return f"{value * 1e6:.1f} us" if value >= 1e-6 or value == 0 else f"{value * 1e9:.1f} ns"


def format_ms(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.3f} ms"


def show_value(value: Union[int, float], unit: str) -> str:
    """A budget's limit or actual value in its unit (``s``, shown in milliseconds; ``MB``; ``bytes``
    or a count)."""
    if unit == "s":
        return format_ms(float(value) * 1e3)
    if unit == "ms":
        return format_ms(float(value))
    if unit == "MB":
        return format_bytes(float(value) * 10**6)
    if unit == "bytes":
        return format_bytes(int(value))
    return with_unit(value, unit) if unit else format_count(value)
