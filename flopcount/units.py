"""The one place numbers become human-readable text. Neutral: imports nothing from flopcount,
so a reading (``budget``) and the renderers in ``report`` share one spelling of a number."""

from __future__ import annotations

import math
from typing import Optional, Tuple, Union

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


def format_seconds(value: Optional[float], decimals: int = 3, *, like: Optional[float] = None) -> str:
    """The one spelling of a time: ``0.00123 -> '1.230 ms'``, ``2.5 -> '2.500 s'``; microseconds
    below a millisecond, nanoseconds below a microsecond, minutes from two (``'3 min 20 s'``).
    ``decimals`` sets the digits of seconds and milliseconds (fewer for an estimate). ``like``: a
    figure shown beside it (the largest of a column), whose unit it takes, so that figures side
    by side share one (``0.0 ns`` beside ``0.1 ns``, not ``0.0 us``), each as precise as in its
    own unit up to 4 significant digits (517.8 ns beside 13.8 us: ``0.5178 us``). A figure that
    is not 0 never reads 0: it gets the digits that show two significant ones (``2e-12 -> '0.0020 ns'``)."""
    if value is None:
        return "-"
    if value >= 120:
        return f"{int(value // 60)} min {int(value % 60)} s"
    own_scale, _ = _time_unit(value)
    scale, name = _time_unit(value if like is None else min(like, 119.0))
    digits = _digits(scale, decimals)
    scaled = value / scale
    if scaled and scale > own_scale:  # in a larger unit than its own: as precise as in its own, to 4 significant digits
        own = _digits(own_scale, decimals) + round(math.log10(scale / own_scale))
        digits = max(digits, min(own, 3 - math.floor(math.log10(abs(scaled)))))
    if scaled and abs(scaled) < 10.0 ** -digits / 2:  # would round to 0 at the unit's digits
        digits = 1 - math.floor(math.log10(abs(scaled)))
    return f"{scaled:.{digits}f} {name}"


def _digits(scale: float, decimals: int) -> int:
    """The decimals :func:`format_seconds` gives a unit of ``scale`` seconds."""
    return decimals if scale >= 1e-3 else 1


def _time_unit(value: float) -> Tuple[float, str]:
    """The unit :func:`format_seconds` spells ``value`` (below two minutes) in: (its seconds, its name);
    0 in microseconds."""
    if value >= 1.0:
        return 1.0, "s"
    if value >= 1e-3:
        return 1e-3, "ms"
    return (1e-6, "us") if value >= 1e-6 or value == 0 else (1e-9, "ns")


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
