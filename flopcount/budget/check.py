"""Budgets (limits on params, FLOPs, MACs, weight size, latency, peak memory) and checking
a result against them: plain data in, a pass/fail list out. The CLI's ``check`` prints it.

A budget passes when ``actual <= limit``. Size is the serialised bytes of parameters
and buffers by their dtypes, in MB of 10^6 bytes. Memory is the estimated peak of
:func:`flopcount.memory.estimate.estimate_memory` in bytes, written with byte units
(``16GB`` = 16 * 10^9, ``16GiB`` = 16 * 2^30). Budgets come from flags or from
``[tool.flopcount]`` in pyproject.toml (``max-params = "25M"``, ``max-memory = "16GiB"``...).

Latency is in seconds in the data (``Budget.max_latency_s``, ``check_budget(latency_s=)``, the
``latency`` line's limit and actual, unit ``s``); the table and the messages show milliseconds.
The 0.2 millisecond spellings (``max_latency_ms=``, ``latency_ms=``, the file key
``max-latency-ms``) work until 0.4 with a DeprecationWarning.

The verdict is one of PASS, FAIL and INCOMPLETE. FLOPs and MACs come from the count, which
may be short (:attr:`FlopResult.complete`); params, size and latency never depend on it.
A budget line is FAIL only when the failure is certain: its value is exact, or it is a
lower bound (ops without a handler ran, nothing else) already over the limit. A FLOPs or
MACs line of an incomplete count is INCOMPLETE otherwise, and so is the verdict, unless
``allow_incomplete``: then the numbers as counted decide. A certain FAIL wins over
INCOMPLETE (exit 1 before 3 in the CLI): more work can only make an exceeded budget worse.
"""

from __future__ import annotations

import csv
import io
import math
import numbers
import re
from dataclasses import asdict, dataclass, fields, replace
from decimal import Decimal
from pathlib import Path
from typing import Any, Dict, List, Literal, Mapping, Optional, Sequence, Tuple, Union

from flopcount.core.deprecation import in_ms, ms_aliases, seconds_or_ms, warn_renamed
from flopcount.core.rendering import render
from flopcount.errors import UsageError, close_names, did_you_mean
from flopcount.types import Status
from flopcount.units import show_apart

# decimal multipliers, like the units the reports print (1 G = 10^9, 1 P = 10^15, 1 E = 10^18);
# "1E" is 10^18, "1E5" is 10^5 (an exponent has digits)
_SUFFIXES = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}
_QUANTITY = re.compile(r"^\s*([+-]?(?:\d[\d_]*\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)\s*([KkMGTPE]?)\s*$")
#: a number with letters after it that are not a unit (``5X``, ``2p``: SI's p is pico, ``120MB`` as a count)
_TRAILING_LETTERS = re.compile(r"^\s*[+-]?(?:\d[\d_]*\.?\d*|\.\d+)(?:[eE][+-]?\d+)?\s*([A-Za-z]+)\s*$")
_UNITS_SAID = "K, M, G, T, P, E: 10^3 to 10^18"


Number = Union[int, float]
BYTES_PER_MB = 10**6

#: how far a budget line's value can be trusted: ``exact``; ``lower`` (the true value is
#: at least this: ops without a handler were not counted); ``estimate`` (could be either
#: way: a placeholder decided a value, or a tracer could not see some work)
Bound = Literal["exact", "lower", "estimate"]

#: budgets whose actual value comes from the count (and so may be incomplete)
COUNTED = ("flops", "macs")

#: the latency budget's name (its limit and actual in seconds; 0.2 called it ``latency_ms``, in ms)
LATENCY = "latency"

# budget name -> (the limit's field on Budget, unit printed after numbers)
_NAMES = {
    "params": ("max_params", ""),
    "flops": ("max_flops", "FLOPs"),
    "macs": ("max_macs", "MACs"),
    "size_mb": ("max_size_mb", "MB"),
    LATENCY: ("max_latency_s", "s"),
    "memory": ("max_memory", "bytes"),
}

#: a count with the unit a report prints after it ("10 GFLOPs", "4.000 GMACs", "25M params")
_COUNT_UNIT = re.compile(r"^\s*([+-]?(?:\d[\d_]*\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)\s*([KkMGTPE]?)\s*(?i:flops?|macs?|params?)\s*$")

# signed, so that "-1GB" is refused as negative, not as "not a size"
_BYTES = re.compile(r"^\s*([+-]?[0-9][0-9_]*(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?)\s*([KMGTPE]i?B|B)?\s*$", re.IGNORECASE)
_BYTE_UNITS = {"": 1, "B": 1, **{p + "B": 1000**i for i, p in enumerate("KMGTPE", 1)}}
_BYTE_UNITS.update({p + "IB": 1024**i for i, p in enumerate("KMGTPE", 1)})
_BYTE_UNITS_SAID = "B, kB, MB, GB, TB, PB, EB: 10^3 to 10^18 bytes; KiB ... EiB: 2^10 to 2^60"


def _parse(text: Union[str, int, float], what: str, pattern: Any, units: Mapping[str, int], noun: str, expected: str,
           examples: str, units_said: str) -> Union[int, float]:
    """``text`` (a number, or digits with an optional unit of ``units`` as ``pattern`` reads
    them) as a finite value >= 0; a UsageError naming ``what`` otherwise (``units_said``: the
    units, named where the text has letters that are none). Exact: digits times a unit are
    multiplied as decimals (``2.3E`` is 2,300,000,000,000,000,000, where 2.3 * 10^18 in floats
    is 2,299,999,999,999,999,744), an integral value comes back as an ``int``."""
    if isinstance(text, bool):
        raise UsageError(f"{what}: expected {expected}, got a bool")
    value: Union[int, float]
    if isinstance(text, (int, float)):
        value = text
    else:
        match = pattern.match(str(text))
        if not match:
            letters = _TRAILING_LETTERS.match(str(text))
            hint = f"; {letters.group(1)!r} is not a unit ({units_said})" if letters else ""
            raise UsageError(f"{what}: {text!r} is not a {noun} (examples: {examples}){hint}")
        number, unit = match.groups()
        exact = Decimal(number.replace("_", "")) * units[(unit or "").upper()]
        value = float(exact)
        if math.isfinite(value) and exact == exact.to_integral_value():
            value = int(exact)
    if value < 0:
        raise UsageError(f"{what}: {text!r} is negative: a {noun} below 0 is not allowed (examples: {examples})")
    if not math.isfinite(value):
        raise UsageError(f"{what}: {text!r} must be a finite {noun} >= 0")
    return value


def parse_bytes(text: Union[str, int, float], what: str = "memory") -> int:
    """``"16GB" -> 16 * 10**9``, ``"16GiB" -> 16 * 2**30``, ``"512MiB"``, ``2e9`` (bytes)."""
    return int(_parse(text, what, _BYTES, _BYTE_UNITS, "size", "a size in bytes", "16GB, 16GiB, 512MiB, 2e9", _BYTE_UNITS_SAID))


def parse_memory_budget(text: Union[str, int, float], what: str) -> int:
    """A memory budget written on the command line or in a budget file (``what`` names the flag
    or the key): :func:`parse_bytes`, with the rule of every budget whose flag or key does not
    name its unit (``--max-latency 10ms``): the value says it, ``16GB``, ``16GiB`` or ``16B``.
    A bare number is still read as bytes until 0.4, with a DeprecationWarning (``16`` meant 16
    bytes, a budget no step meets, where ``16GB`` was meant); 0 is 0 in every unit."""
    value = parse_bytes(text, what)
    bare = isinstance(text, (int, float)) or not _BYTES.match(text).group(2)  # type: ignore[union-attr]  # parse_bytes matched it
    if bare and value:
        shown = text.strip() if isinstance(text, str) else (str(int(text)) if float(text).is_integer() else repr(text))
        # said as a 0.2 spelling is (the CLI shows these): the sentence names the release that refuses it
        warn_renamed(f"{what}: a bare {shown} (read as {value:,} bytes)",
                     f"the unit in the value, as a latency budget has it (10ms): {shown}B for bytes, "
                     "or e.g. 16GB (16 x 10^9 bytes), 16GiB (16 x 2^30)", stacklevel=3)
    return value


#: what a budget's number looks like, by its file key (the CLI's flag without ``--``)
QUANTITY_EXAMPLES = {"max-size-mb": "120, 0.5, 2K", "max-latency-s": "0.01, 2.5", "max-latency-ms": "10, 2.5, 0.8"}


def parse_quantity(text: Union[str, int, float], what: str = "number", *,
                   examples: str = "25M, 5G, 1.5T, 3e9, 120") -> Union[int, float]:
    """``"25M" -> 25_000_000``, ``"1.5T" -> 1.5e12``, ``"5e9" -> 5_000_000_000``.

    Suffixes are decimal (K = 10^3, M = 10^6, G = 10^9, T = 10^12, P = 10^15, E = 10^18; ``1E``
    is 10^18, ``1E5`` 10^5), multiplied exactly (``2.3E`` is 23 * 10^17); the value must be
    finite and >= 0 (``examples`` are named where it is not a number or negative). Integral
    values come back as ``int``."""
    unit = _COUNT_UNIT.match(text) if isinstance(text, str) else None
    if unit is not None:  # "4.000 GMACs" as the budget table prints it: the metric's unit is implied
        bare = "".join(unit.groups())
        raise UsageError(f"{what}: {text!r} is not a number: give it without the unit, in the budget's own "
                         f"(max-flops in FLOPs, max-macs in MACs, max-params in parameters), e.g. {bare}")
    value = _parse(text, what, _QUANTITY, _SUFFIXES, "number", "a number", examples, _UNITS_SAID)
    return int(value) if float(value).is_integer() else float(value)


def refuse_bad_limit(limit: Any, where: str, *, latency: bool = False) -> None:
    """A :class:`UsageError` naming ``where`` unless ``limit`` is None or a number a budget can
    hold: finite and >= 0 (a count, a size), or > 0 for a latency, which no run meets at 0
    (the CLI's ``--max-latency 0ms`` is refused alike; a FLOPs or parameter limit of 0 is met by a
    model without any)."""
    if limit is None:
        return
    if isinstance(limit, bool) or not isinstance(limit, numbers.Real):
        raise UsageError(f"{where}{limit!r}: a budget's limit is a number, got {type(limit).__name__}")
    if not math.isfinite(limit) or limit < 0 or (latency and limit == 0):
        rule = "finite and > 0" if latency else "finite and >= 0"
        why = " (a latency budget of 0 is met by no run)" if latency and limit == 0 else ""
        raise UsageError(f"{where}{limit!r}: a budget's limit must be {rule}{why}")


@ms_aliases("max_latency")
@dataclass(frozen=True, init=False)
class Budget:
    """Upper limits; ``None`` means not checked. ``max_latency_s`` is in seconds.

    ``max_latency_ms=`` (0.2, milliseconds; also 0.2's fifth positional argument) still works
    until 0.4: it warns and is stored as ``max_latency_s = max_latency_ms / 1000``; giving both
    is a :class:`UsageError`. Reading ``budget.max_latency_ms`` warns and returns milliseconds."""

    max_params: Optional[Number] = None
    max_flops: Optional[Number] = None
    max_macs: Optional[Number] = None
    max_size_mb: Optional[Number] = None
    max_latency_s: Optional[Number] = None
    max_memory: Optional[Number] = None

    def __init__(
        self,
        max_params: Optional[Number] = None,
        max_flops: Optional[Number] = None,
        max_macs: Optional[Number] = None,
        max_size_mb: Optional[Number] = None,
        max_latency_ms: Optional[Number] = None,
        max_memory: Optional[Number] = None,
        *,
        max_latency_s: Optional[Number] = None,
    ) -> None:
        # 0.2's milliseconds keep their positional slot, so Budget(..., 5) is still 5 ms (with a warning)
        latency_s = seconds_or_ms(max_latency_s, max_latency_ms, "Budget", "max_latency_s=", "max_latency_ms=")
        given = {"max_params": max_params, "max_flops": max_flops, "max_macs": max_macs, "max_size_mb": max_size_mb,
                 "max_latency_s": latency_s, "max_memory": max_memory}
        for name, limit in given.items():
            refuse_bad_limit(limit, f"Budget: {name}=", latency=name == "max_latency_s")
            object.__setattr__(self, name, limit)

    def merged(self, override: Budget) -> Budget:
        """This budget with every limit ``override`` sets replaced (flags win over the file)."""
        return replace(self, **{f.name: getattr(override, f.name) for f in fields(self) if getattr(override, f.name) is not None})

    def limits(self) -> Dict[str, Number]:
        """``{budget name: limit}`` of the limits that are set, in a fixed order."""
        return {name: getattr(self, key) for name, (key, _) in _NAMES.items() if getattr(self, key) is not None}

    @property
    def needs_latency(self) -> bool:
        return self.max_latency_s is not None

    @property
    def needs_memory(self) -> bool:
        return self.max_memory is not None

    @property
    def needs_count(self) -> bool:
        """A FLOPs or MACs limit is set: the only budgets the count's completeness decides."""
        return any(name in COUNTED for name in self.limits())

    def __bool__(self) -> bool:
        return bool(self.limits())


@dataclass(frozen=True)
class BudgetLine:
    """One limit and the measured value."""

    name: str
    limit: Number
    actual: Number
    unit: str
    bound: Bound = "exact"
    #: what a bound is for, e.g. "any-implementation lower bound on H100 SXM" ("" for a measured value)
    basis: str = ""

    @property
    def passed(self) -> bool:
        """The value as measured is within the limit (see :attr:`status` for the verdict)."""
        return self.actual <= self.limit

    @property
    def status(self) -> Status:
        """PASS (exact and within), FAIL (certainly over: exact or a lower bound over the
        limit), INCOMPLETE (an incomplete count that does not decide) or UNDECIDED (a latency
        lower bound within the limit, or an estimated one: a bound on roofs measured under load,
        which may be below what the machine does, decides nothing)."""
        if self.name == LATENCY and self.bound == "estimate":
            return Status.UNDECIDED
        if self.passed:
            if self.bound == "exact":
                return Status.PASS
            # a latency lower bound (flopcount.predict) within the limit: only measuring decides
            return Status.UNDECIDED if self.name == LATENCY and self.bound == "lower" else Status.INCOMPLETE
        return Status.FAIL if self.bound in ("exact", "lower") else Status.INCOMPLETE

    def describe(self) -> str:
        """``'flops 8.216 G > 5.000 G'`` (``'flops >= 8.216 G > ...'`` for a lower bound);
        latency in milliseconds (``'latency 1.500 ms <= 5.000 ms'``)."""
        relation = "<=" if self.passed else ">"
        at_least = {"exact": "", "lower": ">= ", "estimate": "~"}[self.bound]
        basis = f" ({self.basis})" if self.basis else ""
        actual, limit = show_apart(self.actual, self.limit, self.unit)
        return f"{self.name} {at_least}{actual} {relation} {limit}{basis}"


@dataclass(frozen=True)
class BudgetReport:
    """Every checked budget with its status, and the verdict.

    ``incomplete_reasons``: why the count may be short (empty when complete);
    ``allow_incomplete``: let the numbers as counted decide instead of INCOMPLETE."""

    lines: Tuple[BudgetLine, ...]
    incomplete_reasons: Tuple[str, ...] = ()
    allow_incomplete: bool = False

    @property
    def status(self) -> Status:
        """FAIL when a budget is certainly exceeded; else INCOMPLETE when a counted budget
        (FLOPs, MACs) rests on an incomplete count (unless ``allow_incomplete``); else
        FAIL when a budget is exceeded as counted; else PASS (UNDECIDED: a latency lower bound
        within its limit)."""
        return Status.of(self.lines, self.allow_incomplete)

    @property
    def passed(self) -> bool:
        """True only for the PASS verdict: never for an incomplete count (unless allowed)."""
        return self.status == "PASS"

    @property
    def complete(self) -> bool:
        return not self.incomplete_reasons

    @property
    def exceeded(self) -> Tuple[BudgetLine, ...]:
        """Lines over their limit as counted (certain or not: see each line's status)."""
        return tuple(line for line in self.lines if not line.passed)

    @property
    def undecided(self) -> Tuple[BudgetLine, ...]:
        """Lines an incomplete count cannot decide."""
        return tuple(line for line in self.lines if line.status == "INCOMPLETE")

    def verdict(self) -> str:
        """One sentence: ``'PASS: all 2 budget(s) met'``, ``'FAIL: ...'`` or ``'INCOMPLETE: ...'``."""
        status = self.status
        n = len(self.lines)
        if status == Status.UNDECIDED:
            line = next((line for line in self.lines if line.name == LATENCY), None)
            basis = line.basis if line is not None and line.basis else "roofline lower bound"
            where = "within the budget" if line is None or line.passed else "over the budget, but not a certain bound"
            return f"UNDECIDED: {LATENCY} is not decided without measuring (its {basis} is {where})"
        if status == "INCOMPLETE":
            names = ", ".join(line.name for line in self.undecided)
            return (
                f"INCOMPLETE: the count may be short, so {names} cannot be checked "
                f"({len(self.incomplete_reasons)} reason(s); --allow-incomplete lets the count decide)"
            )
        if status == "FAIL":
            failed = [f"{line.name} ({line.basis})" if line.basis else line.name for line in self.exceeded]
            text = f"FAIL: {len(failed)} of {n} budget(s) exceeded: {', '.join(failed)}"
        else:
            text = f"PASS: all {n} budget(s) met"
        if self.incomplete_reasons:
            text += " (on an incomplete count" + (", allowed)" if self.allow_incomplete else ")")
        return text

    def to_dict(self) -> Dict[str, Any]:
        """JSON-safe data: the verdict, and per line its fields (raw numbers: latency in seconds),
        ``passed`` and ``status``. The ``latency`` line also carries 0.2's ``limit_ms`` and
        ``actual_ms`` until 0.4."""
        return {
            "status": str(self.status),
            **{key: getattr(self, key) for key in ("passed", "complete", "allow_incomplete")},
            "incomplete_reasons": list(self.incomplete_reasons),
            "exceeded": [line.name for line in self.exceeded],
            "lines": [_line_data(line) for line in self.lines],
        }

    def table(self, fmt: str = "simple") -> str:
        """Budget, limit, actual, PASS/FAIL/INCOMPLETE per line (human units)."""
        return render(self, "table", fmt=fmt)

    def to_csv(self) -> str:
        """Raw numbers (latency in seconds, unit ``s``): ``budget,limit,actual,unit,status``, then
        an ``overall`` row with the verdict."""
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(["budget", "limit", "actual", "unit", "status"])
        for line in self.lines:
            writer.writerow([line.name, line.limit, line.actual, line.unit, line.status])
        writer.writerow(["overall", "", "", "", self.status])
        return out.getvalue()


def _line_data(line: BudgetLine) -> Dict[str, Any]:
    data = {**asdict(line), "passed": line.passed, "status": str(line.status)}
    if line.name == LATENCY:  # 0.2's milliseconds beside the seconds, one release
        data.update(limit_ms=in_ms(line.limit), actual_ms=in_ms(line.actual))
    return data


def check_budget(
    budget: Budget,
    *,
    params: Optional[Number] = None,
    flops: Optional[Number] = None,
    macs: Optional[Number] = None,
    size_bytes: Optional[Number] = None,
    latency_s: Optional[Number] = None,
    memory_bytes: Optional[Number] = None,
    incomplete_reasons: Sequence[str] = (),
    lower_bound: bool = False,
    allow_incomplete: bool = False,
    latency_bound: Bound = "exact",
    latency_basis: str = "",
    latency_ms: Optional[Number] = None,
) -> BudgetReport:
    """Compare each limit that is set with its actual value (size in MB = bytes / 10^6;
    ``latency_s`` in seconds: 0.2's ``latency_ms=`` in milliseconds still works until 0.4, with a
    DeprecationWarning).
    A limit whose actual value was not given is a usage error, never a pass.

    ``incomplete_reasons``: why the counted values (FLOPs, MACs) may be short;
    ``lower_bound=True`` says they can only be short (ops without a handler, nothing
    else), so a counted value over its limit is a certain FAIL. The reasons are kept only
    when a FLOPs or MACs limit is set: params, size, latency and memory do not rest on the
    count's completeness (a memory verdict rests on the memory estimate alone). ``latency_bound="lower"``:
    ``latency_s`` is a lower bound (``flopcount.predict``): over the limit is a certain
    FAIL, within it is not decided without measuring (UNDECIDED); ``latency_basis`` says which
    bound it is (eager or any implementation, on which device), shown on the line."""
    if isinstance(incomplete_reasons, str):
        raise UsageError("incomplete_reasons must be a sequence of sentences, not one string")
    latency_s = seconds_or_ms(latency_s, latency_ms, "check_budget", "latency_s=", "latency_ms=")
    reasons = tuple(incomplete_reasons) if budget.needs_count else ()
    counted_bound: Bound = "exact" if not reasons else ("lower" if lower_bound else "estimate")
    actuals = {
        "params": params,
        "flops": flops,
        "macs": macs,
        "size_mb": None if size_bytes is None else size_bytes / BYTES_PER_MB,
        LATENCY: latency_s,
        "memory": memory_bytes,
    }
    lines: List[BudgetLine] = []
    for name, limit in budget.limits().items():
        actual = actuals[name]
        if actual is None:
            raise UsageError(f"budget {name} is set but no {name} value was measured")
        bound: Bound = counted_bound if name in COUNTED else (latency_bound if name == LATENCY else "exact")
        lines.append(BudgetLine(name, limit, actual, _NAMES[name][1], bound, latency_basis if name == LATENCY else ""))
    return BudgetReport(tuple(lines), reasons, bool(allow_incomplete))


def check_result(
    result: Any,
    budget: Budget,
    latency_ms: Optional[Number] = None,
    memory_bytes: Optional[Number] = None,
    *,
    latency_s: Optional[Number] = None,
    allow_incomplete: bool = False,
    latency_bound: Bound = "exact",
    latency_basis: str = "",
) -> BudgetReport:
    """:func:`check_budget` with the numbers of a :class:`~flopcount.core.results.FlopResult`,
    its completeness included: an incomplete count never PASSes a FLOPs or MACs budget
    (status INCOMPLETE) unless ``allow_incomplete``. Its FLOPs and MACs are a lower bound
    when the only reason is ops without a handler. ``memory_bytes``:
    ``estimate_memory(...).peak_bytes`` when a memory budget is set. ``latency_s``: the latency
    in seconds (0.2's ``latency_ms``, also its third positional argument, in milliseconds, still
    works until 0.4 with a DeprecationWarning)."""
    latency_s = seconds_or_ms(latency_s, latency_ms, "check_result", "latency_s=", "latency_ms=")
    reasons = tuple(result.incomplete_reasons())
    return check_budget(
        budget,
        params=result.params,
        flops=result.flops,
        macs=result.macs,
        size_bytes=result.parameters.size_bytes,
        latency_s=latency_s,
        memory_bytes=memory_bytes,
        incomplete_reasons=reasons,
        lower_bound=bool(reasons) and not result.gaps,
        allow_incomplete=allow_incomplete,
        latency_bound=latency_bound,
        latency_basis=latency_basis,
    )


# --------------------------------------------------------------------------- pyproject.toml

#: accepted keys of [tool.flopcount] (dashes or underscores) -> Budget field
FILE_KEYS = {key.replace("_", "-"): key for key, _ in _NAMES.values()}

#: 0.2's latency key (milliseconds), read until 0.4 with a DeprecationWarning: ``max-latency-s`` now
FILE_KEY_MS = "max-latency-ms"


def budget_from_mapping(table: Mapping[str, Any], source: str) -> Budget:
    """A :class:`Budget` from ``{"max-flops": "5G", ...}``; ``source`` names where the
    table came from in error messages. Unknown keys and non-numbers are errors. 0.2's
    ``max-latency-ms`` (milliseconds) warns and becomes ``max-latency-s`` (/ 1000); both is an error."""
    values: Dict[str, Optional[Number]] = {}
    latency_ms: Optional[Number] = None
    spelled: Dict[str, Any] = {}  # each key as dashes -> as written, so one key given twice is named
    for raw_key, raw in table.items():
        key = str(raw_key).replace("_", "-")
        if key in spelled:
            raise UsageError(f"{source}: {spelled[key]!r} and {raw_key!r} are the same key; keep one")
        spelled[key] = raw_key
        if key == FILE_KEY_MS:
            latency_ms = parse_quantity(_file_value(raw, raw_key, source), f"{source}: {raw_key}",
                                        examples=QUANTITY_EXAMPLES[FILE_KEY_MS])
            continue
        if key == "max-latency":  # the CLI's --max-latency 10ms: the file's key names its unit instead
            raise UsageError(f"{source}: unknown key {raw_key!r}: the latency budget's key is max-latency-s, in seconds "
                             f"(max-latency-s = 0.01 for --max-latency 10ms)")
        if key not in FILE_KEYS:
            known = ", ".join(FILE_KEYS)
            hint = did_you_mean(key, [*FILE_KEYS, *GATE_KEYS])
            raise UsageError(f"{source}: unknown key {raw_key!r}{hint} (known: {known}, {', '.join(GATE_KEYS)})")
        value, where = _file_value(raw, raw_key, source), f"{source}: {raw_key}"
        values[FILE_KEYS[key]] = parse_memory_budget(value, where) if key == "max-memory" else \
            parse_quantity(value, where, **({"examples": QUANTITY_EXAMPLES[key]} if key in QUANTITY_EXAMPLES else {}))
    latency_s = values.get("max_latency_s")
    values["max_latency_s"] = seconds_or_ms(latency_s, latency_ms, source, "max-latency-s", FILE_KEY_MS)
    written = spelled.get("max-latency-s", spelled.get(FILE_KEY_MS))
    refuse_bad_limit(values["max_latency_s"], f"{source}: {written} = ", latency=True)
    return Budget(**values)


def _file_value(raw: Any, raw_key: Any, source: str) -> Union[str, int, float]:
    """A budget file's value: a number or a string (``"25M"``); a UsageError otherwise."""
    if not isinstance(raw, (str, int, float)) or isinstance(raw, bool):
        raise UsageError(f"{source}: {raw_key} must be a number or a string like \"25M\", got {type(raw).__name__}")
    return raw


def load_budget_file(path: Union[str, Path], *, required: bool = False) -> Budget:
    """The budget in ``[tool.flopcount]`` of a pyproject.toml; an empty budget when the
    file (unless ``required``) or the table is missing. Malformed TOML or values raise
    :class:`UsageError` naming the file and the key. The baseline gate's keys
    (``max-growth``, ``baseline``: :mod:`flopcount.diffs.gate`) and what ``check`` counts
    without an ENTRY argument (``entry``, ``input``: the CLI) are read there, not here."""
    return table_budget(flopcount_table(Path(path), required=required), path)


def table_budget(table: Optional[Mapping[str, Any]], path: Union[str, Path]) -> Budget:
    """The budget of ``[tool.flopcount]`` as :func:`flopcount_table` read it from ``path``
    (None: an empty budget); the gate's and the bare check's keys left to their readers."""
    if table is None:
        return Budget()
    return budget_from_mapping({k: v for k, v in table.items() if str(k).replace("_", "-") not in GATE_KEYS}, f"{path} [tool.flopcount]")


#: keys of [tool.flopcount] that are not budgets: the baseline gate's (flopcount.diffs.gate) and
#: the model check counts when no ENTRY is given (entry = "model.py:build", input = ["8x16"])
GATE_KEYS = ("max-growth", "baseline", "entry", "input")


def flopcount_table(path: Path, *, required: bool = False) -> Optional[Dict[str, Any]]:
    """``[tool.flopcount]`` of the TOML file ``path`` (keys as written), or None when the file
    (unless ``required``) or the table is missing; malformed TOML raises :class:`UsageError`
    naming the file. ``flopcount check`` reads it once for its budgets, gate and ENTRY."""
    if not path.is_file():
        if required:
            raise UsageError(f"config file not found: {path}")
        return None
    import tomllib  # the standard library's from Python 3.11, the oldest flopcount supports

    try:
        with open(path, "rb") as fh:
            document = tomllib.load(fh)
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{path}: not valid TOML: {exc}") from exc
    except UnicodeDecodeError as exc:
        raise UsageError(f"{path}: not valid UTF-8 (byte {exc.start}): TOML files must be UTF-8") from exc
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from exc
    tool = document.get("tool", {})
    if not isinstance(tool, Mapping):
        raise UsageError(f"{path}: [tool] must be a table")
    table = tool.get("flopcount")
    if table is None:
        misspelt = close_names("flopcount", [str(name) for name in tool])
        if misspelt:  # its budgets would go unchecked
            raise UsageError(f"{path}: [tool.{misspelt[0]}] is not read: flopcount's table is [tool.flopcount]")
        return None
    if not isinstance(table, Mapping):
        raise UsageError(f"{path}: [tool.flopcount] must be a table, got {type(table).__name__}")
    return dict(table)
