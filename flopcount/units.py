"""The one place numbers become human-readable text. Neutral: imports nothing from flopcount,
so a reading (``budget``) and the renderers in ``report`` share one spelling of a number."""

from __future__ import annotations

import math
from typing import Optional, Tuple, Union

#: decimal, as budgets read them back (``flopcount.budget.check``): a 70B model's training step
#: (~10^18 FLOPs) reads ``1.680 EFLOPs``, not ``1680000.000 TFLOPs``
_PREFIXES = ((10**18, "E"), (10**15, "P"), (10**12, "T"), (10**9, "G"), (10**6, "M"), (10**3, "K"))

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


def with_unit(value: Optional[float], unit: str, digits: int = 3) -> str:
    """``(4.089e9, "MACs") -> '4.089 GMACs'``; ``(12, "FLOPs") -> '12 FLOPs'``."""
    text = format_count(value, digits)
    return f"{text}{unit}" if text[-1:].isalpha() else f"{text} {unit}"


#: the one definition of a byte size flopcount prints: decimal units, like the K/M/G of
#: counts and the ``--max-size-mb`` budget (1 kB = 10^3 bytes, 1 MB = 10^6, 1 GB = 10^9)
SIZE_UNITS = "1 MB = 10^6 bytes"


def format_bytes(value: float, decimals: int = 2) -> str:
    """Decimal units: ``102_440_000 -> '102.44 MB'`` (1 MB = 10^6 bytes), up to EB (10^18)."""
    size = float(value)
    for unit in ("B", "kB", "MB", "GB", "TB", "PB"):
        if abs(size) < 1000:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.{decimals}f} {unit}"
        size /= 1000
    return f"{size:.{decimals}f} EB"


def escape_markdown(cell: object) -> str:
    """Text that GitHub markdown shows as written, in a table cell or a paragraph: ``|`` would end
    the cell, two ``*`` (``layers.*.experts.*.w1``, a diff's repeated layers) or ``_`` at a word's
    edge (``__x__``) would pair into emphasis, ``<b>`` would be HTML, a backtick would open code;
    ``_`` inside a word (``q_proj``) is never emphasis and stays as it is."""
    text = str(cell)
    out = []
    for i, ch in enumerate(text):
        if ch in "\\|*`<" or (ch == "_" and not (0 < i < len(text) - 1 and text[i - 1].isalnum() and text[i + 1].isalnum())):
            out.append("\\")
        out.append(ch)
    return "".join(out)


def markdown_code(text: object) -> str:
    """``text`` as a markdown code span, shown exactly as written (backslashes of a Windows path
    included: a code span has no escapes), its fence longer than any run of backticks inside."""
    text = str(text)
    longest = run = 0
    for ch in text:
        run = run + 1 if ch == "`" else 0
        longest = max(longest, run)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


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


def show_value(value: Union[int, float], unit: str, extra: int = 0, *, time_unit: Tuple[float, str] = (1e-3, "ms")) -> str:
    """A budget's limit or actual value in its unit (``s``, shown in milliseconds, or in
    ``time_unit``; ``MB``; ``bytes`` or a count); ``extra`` digits more than the usual (:func:`show_apart`)."""
    if unit in ("s", "ms"):
        seconds = float(value) * (1.0 if unit == "s" else 1e-3)
        scale, name = time_unit
        return f"{seconds / scale:.{3 + extra}f} {name}"
    if unit in ("MB", "bytes"):
        return format_bytes(float(value) * 10**6 if unit == "MB" else int(value), 2 + extra)
    return with_unit(value, unit, 3 + extra) if unit else format_count(value, 3 + extra)


#: how many digits :func:`show_apart` adds at most
_MOST_EXTRA_DIGITS = 12


def show_apart(actual: Union[int, float], limit: Union[int, float], unit: str) -> Tuple[str, str]:
    """``actual`` and ``limit`` as :func:`show_value` spells them, with the digits that keep
    them apart: two different values never read the same (``6.2720 KFLOPs`` beside ``6.2719
    KFLOPs``, not ``6.272`` twice: both get digits) and a value that is not 0 never reads 0 (a
    0.1 ns latency bound beside a 1 ms budget: ``0.0000001 ms``, not ``0.000 ms``: that value gets
    them; below a microsecond a time takes the larger value's unit: ``0.094 ns`` beside
    ``0.050 ns``), so a verdict never reads "x > x"."""
    time_unit = (1e-3, "ms")

    def spelt(value: Union[int, float], extra: int) -> str:
        return show_value(value, unit, extra, time_unit=time_unit)

    if unit in ("s", "ms") and not _kept_apart(actual, limit, spelt(actual, 0), spelt(limit, 0)):
        largest = max(abs(float(actual)), abs(float(limit))) * (1.0 if unit == "s" else 1e-3)
        time_unit = _time_unit(largest) if 0 < largest < 1e-3 else time_unit

    common = next((extra for extra in range(_MOST_EXTRA_DIGITS) if actual == limit or spelt(actual, extra) != spelt(limit, extra)),
                  _MOST_EXTRA_DIGITS)

    def own(value: Union[int, float]) -> str:
        extra = next((e for e in range(common, _MOST_EXTRA_DIGITS) if not value or _reads_nonzero(spelt(value, e))), _MOST_EXTRA_DIGITS)
        return spelt(value, extra)

    return own(actual), own(limit)


def _kept_apart(actual: Union[int, float], limit: Union[int, float], actual_text: str, limit_text: str) -> bool:
    """Different values read differently, and no value but 0 reads 0."""
    if actual != limit and actual_text == limit_text:
        return False
    return all(_reads_nonzero(text) for value, text in ((actual, actual_text), (limit, limit_text)) if value)


def _reads_nonzero(text: str) -> bool:
    return any(ch in "123456789" for ch in text.split(" ")[0])
