"""The baseline gate: how much each metric may grow from a saved report, and the verdict.

An allowance is relative (``flops=2%``: B <= A x 1.02) or absolute (``params=0``: no growth;
``params=1M``: at most 10^6 more; ``memory=512MiB``). Checked on a :class:`DiffResult` whose A is
the baseline: PASS within every allowance, FAIL when a metric certainly grew past its
allowance, INCOMPLETE when a counted metric (FLOPs, MACs, bytes) rests on an incomplete count
on either side (unless ``allow_incomplete``). Params and peak memory never depend on the count,
so their FAIL is certain and wins over INCOMPLETE, as with budgets.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Tuple, Union

from flopcount.core.rendering import render
from flopcount.diffs.result import Change, DiffResult, Number
from flopcount.errors import UsageError, did_you_mean
from flopcount.types import Status
from flopcount.units import ROOT_LABEL, format_bytes, format_count

#: allowance name -> the diff metric it limits
GROWTH_METRICS: Dict[str, str] = {"params": "params", "flops": "flops", "macs": "macs", "bytes": "bytes", "memory": "peak_memory"}
#: metrics that come from the count, so an incomplete count cannot decide them
COUNTED = ("flops", "macs", "bytes")
#: what ``check --baseline`` allows when no allowance is given: no growth of the count
DEFAULT_GROWTH = "params=0,flops=0,macs=0"
#: an amount allowance under this share of its baseline is remarked on (:attr:`GrowthLine.note`):
#: ``flops=2`` is 2 FLOPs, as documented, which a user who wrote it most likely meant as 2%
TINY_SHARE = Fraction(1, 1_000_000)
#: what an amount allowance of each metric counts
AMOUNT_UNITS: Dict[str, str] = {"params": "parameters", "flops": "FLOPs", "macs": "MACs", "bytes": "bytes", "memory": "bytes"}


@dataclass(frozen=True)
class Allowance:
    """How much one metric may grow: ``percent`` of the baseline, or ``absolute`` units."""

    metric: str
    percent: Optional[Fraction] = None
    absolute: Optional[int] = None

    def limit(self, baseline: Number) -> Fraction:
        """The highest value allowed: baseline x (1 + percent/100), or baseline + absolute."""
        if self.percent is not None:
            return Fraction(baseline) * (1 + self.percent / 100)
        return Fraction(baseline) + (self.absolute or 0)

    def __str__(self) -> str:
        return f"+{_number(self.percent)}%" if self.percent is not None else f"+{self.absolute:,}"


def _number(value: Fraction) -> str:
    return str(int(value)) if value.denominator == 1 else f"{float(value):g}"


def parse_allowance(metric: str, text: Union[str, int, float], source: str) -> Allowance:
    """``("flops", "2%")``, ``("params", 0)``, ``("params", "1M")``, ``("memory", "512MiB")``,
    ``("bytes", "4KiB")``."""
    from flopcount.budget.check import parse_bytes, parse_quantity

    name = metric.strip().lower()
    if name not in GROWTH_METRICS:
        raise UsageError(f"{source}: unknown metric {metric!r}{did_you_mean(metric, GROWTH_METRICS)} (known: {', '.join(GROWTH_METRICS)})")
    if isinstance(text, bool) or not isinstance(text, (str, int, float)):
        raise UsageError(f"{source}: {name} must be a number or a string like \"2%\", got {type(text).__name__}")
    raw = str(text).strip()
    if raw.endswith("%"):
        try:
            percent = Fraction(raw[:-1].strip())
        except (ValueError, ZeroDivisionError):
            raise UsageError(f"{source}: {name}={raw!r} is not a percentage (e.g. 2%)") from None
        if percent < 0:
            raise UsageError(f"{source}: {name}={raw!r}: an allowance cannot be negative")
        return Allowance(name, percent=percent)
    # both parsers refuse a negative amount ("must be a finite ... >= 0"); bytes moved are bytes
    # as a peak is: 4KiB and 1MB read as sizes, 4K as a count
    in_bytes = name == "memory" or (name == "bytes" and raw.upper().endswith("B"))
    value = parse_bytes(raw, f"{source}: {name}") if in_bytes else parse_quantity(raw, f"{source}: {name}")
    return Allowance(name, absolute=int(value))


def parse_growth(text: str, source: str = "--max-growth") -> Dict[str, Allowance]:
    """``"flops=2%,params=0,memory=5%"`` -> one :class:`Allowance` per metric."""
    found: Dict[str, Allowance] = {}
    if ";" in str(text):  # no allowance holds one: the list was written with the wrong separator
        raise UsageError(f"{source}: {str(text)!r}: allowances are separated by commas (e.g. flops=2%,params=0)")
    for part in str(text).split(","):
        if not part.strip():
            continue
        metric, sep, value = part.partition("=")
        if not sep:
            raise UsageError(f"{source}: {part.strip()!r} is not METRIC=ALLOWANCE (e.g. flops=2%,params=0)")
        allowance = parse_allowance(metric, value, source)
        if allowance.metric in found:
            raise UsageError(f"{source}: {allowance.metric} is given twice")
        found[allowance.metric] = allowance
    if not found:
        raise UsageError(f"{source}: no allowance given (e.g. flops=2%,params=0)")
    return found


def growth_from_mapping(value: Any, source: str) -> Dict[str, Allowance]:
    """``max-growth`` of ``[tool.flopcount]``: a string like the flag's, or a table
    ``{flops = "2%", params = 0}``."""
    if isinstance(value, str):
        return parse_growth(value, source)
    if isinstance(value, Mapping):
        found = {a.metric: a for a in (parse_allowance(str(metric), allowed, source) for metric, allowed in value.items())}
        if not found:
            raise UsageError(f"{source}: an empty table allows nothing; give e.g. flops = \"2%\"")
        return found
    raise UsageError(f"{source}: must be a string like \"flops=2%,params=0\" or a table, got {type(value).__name__}")


@dataclass(frozen=True)
class GrowthSettings:
    """What ``[tool.flopcount]`` says about the gate: the allowances and the baseline file
    (relative paths are taken from the pyproject.toml's folder)."""

    allowances: Optional[Dict[str, Allowance]] = None
    baseline: Optional[Path] = None


def table_growth(found: Optional[Mapping[str, Any]], path: Union[str, Path]) -> GrowthSettings:
    """``max-growth`` and ``baseline`` of ``[tool.flopcount]`` as ``flopcount_table`` read it from
    ``path`` (nothing when the file or the keys are missing)."""
    if found is None:
        return GrowthSettings()
    path = Path(path)
    table = {str(key).replace("_", "-"): value for key, value in found.items()}
    source = f"{path} [tool.flopcount]"
    allowances = growth_from_mapping(table["max-growth"], f"{source}: max-growth") if "max-growth" in table else None
    baseline = table.get("baseline")
    if baseline is not None and not isinstance(baseline, str):
        raise UsageError(f"{source}: baseline must be a path string, got {type(baseline).__name__}")
    return GrowthSettings(allowances, (path.parent / baseline) if baseline else None)


@dataclass(frozen=True)
class GrowthLine:
    """One metric: baseline, current, the allowance, and whether it held."""

    metric: str
    baseline: Number
    current: Number
    allowance: Allowance
    #: exact; ``lower`` when the current count is short only by ops without a handler and the
    #: baseline is complete (the current value, so the growth, can only be higher: over the
    #: allowance is a certain FAIL); ``estimate`` when it rests on an incomplete count otherwise
    bound: str = "exact"

    @property
    def limit(self) -> Fraction:
        return self.allowance.limit(self.baseline)

    @property
    def passed(self) -> bool:
        return self.current <= self.limit

    @property
    def delta(self) -> Number:
        return self.current - self.baseline

    @property
    def relative(self) -> Optional[float]:
        return None if self.baseline == 0 else self.delta / self.baseline

    @property
    def status(self) -> Status:
        if self.bound == "exact":
            return Status.PASS if self.passed else Status.FAIL
        return Status.FAIL if self.bound == "lower" and not self.passed else Status.INCOMPLETE

    def growth_text(self) -> str:
        """The growth in the allowance's own terms, with the digits that keep it apart from the
        allowance: ``+49.505%`` against ``+49.5%`` (not ``+49.50%``), ``+3,136`` against an
        amount of ``+3,135``; ``new`` for a percentage of a baseline of 0."""
        if self.allowance.percent is None:
            return f"{self.delta:+,}" if self.delta else "0"
        if self.baseline == 0:
            return "new"
        percent = Fraction(self.delta) / Fraction(self.baseline) * 100
        allowed = self.allowance.percent
        for digits in range(2, 16):  # more digits while the rounded growth reads as within the allowance
            text = f"{float(percent):+.{digits}f}"
            if (Fraction(text) > allowed) == (percent > allowed) and (Fraction(text) != allowed or percent == allowed):
                break
        return text + "%"

    @property
    def note(self) -> str:
        """A remark on an amount allowance above 0 and under :data:`TINY_SHARE` of the baseline
        (``flops=2`` on a baseline of millions: 2 FLOPs, as documented, not 2%), else ""."""
        amount = self.allowance.absolute
        if not amount or self.baseline <= 0 or amount >= self.baseline * TINY_SHARE:
            return ""
        return (f"the {self.metric} allowance {self.allowance} is an amount, {amount:,} {AMOUNT_UNITS[self.metric]}, under "
                f"one part per million of the baseline's {self.baseline:,}; a percentage is written with %: {self.metric}=N%")


@dataclass(frozen=True)
class GrowthReport:
    """Every allowance checked against the baseline, the verdict, and for each metric that
    grew past its allowance the modules that grew most."""

    lines: Tuple[GrowthLine, ...]
    diff: DiffResult
    allow_incomplete: bool = False

    @property
    def status(self) -> Status:
        """FAIL when a metric certainly grew past its allowance; else INCOMPLETE when a
        counted metric rests on an incomplete count (unless ``allow_incomplete``); else
        FAIL when one grew past it as counted; else PASS."""
        return Status.of(self.lines, self.allow_incomplete)

    @property
    def notes(self) -> Tuple[str, ...]:
        """Each line's :attr:`GrowthLine.note` that says something."""
        return tuple(line.note for line in self.lines if line.note)

    @property
    def exceeded(self) -> Tuple[GrowthLine, ...]:
        return tuple(line for line in self.lines if not line.passed)

    def grew_most(self, n: int = 3) -> Dict[str, Tuple[Change, ...]]:
        """``{metric: the modules whose growth of it was largest}`` for each exceeded metric
        that modules carry (params, MACs, FLOPs, bytes)."""
        return {
            line.metric: self.diff.grew_most(GROWTH_METRICS[line.metric], n)
            for line in self.exceeded
            if GROWTH_METRICS[line.metric] in ("params", "macs", "flops", "bytes")
        }

    def verdict(self) -> str:
        """One sentence: PASS / FAIL (naming the metrics and the modules that grew most) / INCOMPLETE."""
        status = self.status
        n = len(self.lines)
        if status == Status.INCOMPLETE:
            names = ", ".join(line.metric for line in self.lines if line.status == Status.INCOMPLETE)
            return (f"INCOMPLETE: a count may be short (baseline or current), so growth of {names} cannot be decided "
                    "(--allow-incomplete lets the counts decide)")
        if status == Status.FAIL:
            parts = []
            for line in self.exceeded:
                grew = self.grew_most().get(line.metric, ())
                where = f" (most in {', '.join(f'{row.name or ROOT_LABEL} ({row.type_name}{_times(row.repeats)}) +{_amount(line.metric, row.delta(GROWTH_METRICS[line.metric]))}' for row in grew)})" if grew else ""
                at_least = ">= " if line.bound == "lower" else ""
                share = f" ({100 * line.relative:+.2f}%)" if line.allowance.percent is None and line.relative is not None else ""
                parts.append(f"{line.metric} {at_least}{line.growth_text()}{share} > {line.allowance}{where}")
            return f"FAIL: {len(parts)} of {n} metric(s) grew past the allowance{self._short()}: " + "; ".join(parts)
        return f"PASS: all {n} metric(s) within the allowed growth{self._short()}"

    def _short(self) -> str:
        """`` (on an incomplete count[, allowed])`` when a counted metric rests on an incomplete
        count, as a budget's verdict says it; "" when only params and peak memory were checked."""
        if all(line.bound == "exact" for line in self.lines):
            return ""
        return " (on an incomplete count" + (", allowed)" if self.allow_incomplete else ")")

    def to_dict(self) -> Dict[str, Any]:
        return {
            "status": str(self.status),
            "baseline": self.diff.a_label,
            "allow_incomplete": self.allow_incomplete,
            "lines": [
                {
                    "metric": line.metric, "baseline": line.baseline, "current": line.current, "delta": line.delta,
                    "relative": line.relative, "allowance": str(line.allowance), "limit": float(line.limit),
                    "bound": line.bound, "status": str(line.status),
                }
                for line in self.lines
            ],
            "notes": list(self.notes),
            "grew_most": {
                metric: [{"module": row.name, "type": row.type_name, "repeats": row.repeats, "delta": row.delta(GROWTH_METRICS[metric])}
                         for row in rows]
                for metric, rows in self.grew_most().items()
            },
        }

    def table(self, fmt: str = "simple") -> str:
        """Metric, baseline, current, change, allowance, status per line."""
        return str(render(self, "table", fmt=fmt))


def _amount(metric: str, value: Optional[Number]) -> str:
    """A module's growth in its metric's unit: bytes as a size (``1.34 kB``), counts with K/M/G."""
    return format_bytes(value or 0) if metric == "bytes" else format_count(value)


def _times(repeats: int) -> str:
    return f" x{repeats}" if repeats > 1 else ""


def check_growth(diff: DiffResult, allowances: Mapping[str, Allowance], *, allow_incomplete: bool = False) -> GrowthReport:
    """Each allowance checked on ``diff`` (A = the baseline, B = the current count). A metric
    one side lacks (peak memory without ``count --memory``) raises a :class:`UsageError`
    saying how to write it."""
    lines = []
    counted = _counted_bound(diff)
    for name, allowance in allowances.items():
        metric = GROWTH_METRICS[name]
        baseline, current = diff.totals.before(metric), diff.totals.after(metric)
        if baseline is None or current is None:
            side = "the baseline" if baseline is None else "the current count"
            hint = " (write the baseline with count --memory --format json)" if name == "memory" else ""
            raise UsageError(f"max-growth {name}: {side} has no {metric.replace('_', ' ')}{hint}")
        lines.append(GrowthLine(name, baseline, current, allowance, counted if name in COUNTED else "exact"))
    return GrowthReport(tuple(lines), diff, allow_incomplete)


def _counted_bound(diff: DiffResult) -> str:
    """How far a counted metric's growth can be trusted: exact (both counts complete); lower
    (the baseline complete, the current count short only by ops without a handler: it can only
    be higher); else an estimate (a short baseline's growth may be smaller or larger)."""
    if diff.complete:
        return "exact"
    return "lower" if not diff.a_incomplete and diff.b_lower else "estimate"
