"""Budgets (limits on params, FLOPs, MACs, weight size, latency, peak memory) and checking
a result against them: plain data in, a pass/fail list out. The CLI's ``check`` prints it.

A budget passes when ``actual <= limit``. Size is the serialised bytes of parameters
and buffers by their dtypes, in MB of 10^6 bytes. Memory is the estimated peak of
:func:`flopcount.memory.estimate_memory` in bytes, written with byte units
(``16GB`` = 16 * 10^9, ``16GiB`` = 16 * 2^30). Budgets come from flags or from
``[tool.flopcount]`` in pyproject.toml (``max-params = "25M"``, ``max-memory = "16GiB"``...).
"""

from __future__ import annotations

import csv
import io
import math
import re
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

from .errors import UsageError
from .report.budget import budget_table, show_value

# decimal multipliers, like the units the reports print (1 G = 10^9)
_SUFFIXES = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
_QUANTITY = re.compile(r"^\s*([+-]?(?:\d[\d_]*\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)\s*([KkMGT]?)\s*$")


Number = Union[int, float]
BYTES_PER_MB = 10**6

# budget name -> (the limit's field on Budget, unit printed after numbers)
_NAMES = {
    "params": ("max_params", ""),
    "flops": ("max_flops", "FLOPs"),
    "macs": ("max_macs", "MACs"),
    "size_mb": ("max_size_mb", "MB"),
    "latency_ms": ("max_latency_ms", "ms"),
    "memory": ("max_memory", "bytes"),
}

_BYTES = re.compile(r"^\s*([0-9][0-9_]*(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?)\s*([KMGT]i?B|B)?\s*$", re.IGNORECASE)
_BYTE_UNITS = {"B": 1, **{p + "B": 1000**i for i, p in enumerate("KMGT", 1)}}
_BYTE_UNITS.update({p + "IB": 1024**i for i, p in enumerate("KMGT", 1)})


def parse_bytes(text: Union[str, int, float], what: str = "memory") -> int:
    """``"16GB" -> 16 * 10**9``, ``"16GiB" -> 16 * 2**30``, ``"512MiB"``, ``2e9`` (bytes)."""
    if isinstance(text, bool):
        raise UsageError(f"{what}: expected a size in bytes, got a bool")
    if isinstance(text, (int, float)):
        value = float(text)
    else:
        match = _BYTES.match(str(text))
        if not match:
            raise UsageError(f"{what}: {text!r} is not a size (examples: 16GB, 16GiB, 512MiB, 2e9)")
        number, unit = match.groups()
        value = float(number.replace("_", "")) * _BYTE_UNITS[(unit or "B").upper()]
    if not math.isfinite(value) or value < 0:
        raise UsageError(f"{what}: {text!r} must be a finite size >= 0")
    return int(value)


def parse_quantity(text: Union[str, int, float], what: str = "number") -> Union[int, float]:
    """``"25M" -> 25_000_000``, ``"1.5T" -> 1.5e12``, ``"5e9" -> 5_000_000_000``.

    Suffixes are decimal (K = 10^3, M = 10^6, G = 10^9, T = 10^12); the value must be
    finite and >= 0. Integral values come back as ``int``."""
    if isinstance(text, bool):
        raise UsageError(f"{what}: expected a number, got a bool")
    if isinstance(text, (int, float)):
        value: float = text
    else:
        match = _QUANTITY.match(str(text))
        if not match:
            raise UsageError(f"{what}: {text!r} is not a number (examples: 25M, 5G, 1.5T, 3e9, 120)")
        number, suffix = match.groups()
        value = float(number.replace("_", "")) * _SUFFIXES[suffix.upper()]
    if not math.isfinite(value) or value < 0:
        raise UsageError(f"{what}: {text!r} must be a finite number >= 0")
    return int(value) if float(value).is_integer() else float(value)


@dataclass(frozen=True)
class Budget:
    """Upper limits; ``None`` means not checked."""

    max_params: Optional[Number] = None
    max_flops: Optional[Number] = None
    max_macs: Optional[Number] = None
    max_size_mb: Optional[Number] = None
    max_latency_ms: Optional[Number] = None
    max_memory: Optional[Number] = None

    def merged(self, override: Budget) -> Budget:
        """This budget with every limit ``override`` sets replaced (flags win over the file)."""
        return replace(self, **{f.name: getattr(override, f.name) for f in fields(self) if getattr(override, f.name) is not None})

    def limits(self) -> Dict[str, Number]:
        """``{budget name: limit}`` of the limits that are set, in a fixed order."""
        return {name: getattr(self, key) for name, (key, _) in _NAMES.items() if getattr(self, key) is not None}

    @property
    def needs_latency(self) -> bool:
        return self.max_latency_ms is not None

    @property
    def needs_memory(self) -> bool:
        return self.max_memory is not None

    def __bool__(self) -> bool:
        return bool(self.limits())


@dataclass(frozen=True)
class BudgetLine:
    """One limit and the measured value."""

    name: str
    limit: Number
    actual: Number
    unit: str

    @property
    def passed(self) -> bool:
        return self.actual <= self.limit

    def describe(self) -> str:
        """``'flops 8.216 G > 5.000 G'``."""
        relation = "<=" if self.passed else ">"
        return f"{self.name} {show_value(self.actual, self.unit)} {relation} {show_value(self.limit, self.unit)}"


@dataclass(frozen=True)
class BudgetReport:
    """Every checked budget with pass/fail."""

    lines: Tuple[BudgetLine, ...]

    @property
    def passed(self) -> bool:
        return all(line.passed for line in self.lines)

    @property
    def exceeded(self) -> Tuple[BudgetLine, ...]:
        return tuple(line for line in self.lines if not line.passed)

    def to_dict(self) -> Dict[str, Any]:
        return {
            "passed": self.passed,
            "exceeded": [line.name for line in self.exceeded],
            "lines": [
                {"name": line.name, "limit": line.limit, "actual": line.actual, "unit": line.unit, "passed": line.passed}
                for line in self.lines
            ],
        }

    def table(self, fmt: str = "simple") -> str:
        """Budget, limit, actual, PASS/FAIL per line (human units)."""
        return budget_table(self, fmt)

    def to_csv(self) -> str:
        """Raw numbers: ``budget,limit,actual,unit,status``."""
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(["budget", "limit", "actual", "unit", "status"])
        for line in self.lines:
            writer.writerow([line.name, line.limit, line.actual, line.unit, "PASS" if line.passed else "FAIL"])
        return out.getvalue()


def check_budget(
    budget: Budget,
    *,
    params: Optional[Number] = None,
    flops: Optional[Number] = None,
    macs: Optional[Number] = None,
    size_bytes: Optional[Number] = None,
    latency_ms: Optional[Number] = None,
    memory_bytes: Optional[Number] = None,
) -> BudgetReport:
    """Compare each limit that is set with its actual value (size in MB = bytes / 10^6).
    A limit whose actual value was not given is a usage error, never a pass."""
    actuals = {
        "params": params,
        "flops": flops,
        "macs": macs,
        "size_mb": None if size_bytes is None else size_bytes / BYTES_PER_MB,
        "latency_ms": latency_ms,
        "memory": memory_bytes,
    }
    lines: List[BudgetLine] = []
    for name, limit in budget.limits().items():
        actual = actuals[name]
        if actual is None:
            raise UsageError(f"budget {name} is set but no {name} value was measured")
        lines.append(BudgetLine(name, limit, actual, _NAMES[name][1]))
    return BudgetReport(tuple(lines))


def check_result(
    result: Any, budget: Budget, latency_ms: Optional[Number] = None, memory_bytes: Optional[Number] = None
) -> BudgetReport:
    """:func:`check_budget` with the numbers of a :class:`~flopcount.results.FlopResult`
    (``memory_bytes``: ``estimate_memory(...).peak_bytes`` when a memory budget is set)."""
    return check_budget(
        budget,
        params=result.params,
        flops=result.flops,
        macs=result.macs,
        size_bytes=result.parameters.size_bytes,
        latency_ms=latency_ms,
        memory_bytes=memory_bytes,
    )


# --------------------------------------------------------------------------- pyproject.toml

#: accepted keys of [tool.flopcount] (dashes or underscores) -> Budget field
FILE_KEYS = {key.replace("_", "-"): key for key, _ in _NAMES.values()}


def budget_from_mapping(table: Mapping[str, Any], source: str) -> Budget:
    """A :class:`Budget` from ``{"max-flops": "5G", ...}``; ``source`` names where the
    table came from in error messages. Unknown keys and non-numbers are errors."""
    values: Dict[str, Number] = {}
    for raw_key, raw in table.items():
        key = str(raw_key).replace("_", "-")
        if key not in FILE_KEYS:
            known = ", ".join(FILE_KEYS)
            raise UsageError(f"{source}: unknown key {raw_key!r} (known: {known})")
        if not isinstance(raw, (str, int, float)) or isinstance(raw, bool):
            raise UsageError(f"{source}: {raw_key} must be a number or a string like \"25M\", got {type(raw).__name__}")
        try:
            parse = parse_bytes if key == "max-memory" else parse_quantity
            values[FILE_KEYS[key]] = parse(raw, f"{source}: {raw_key}")
        except UsageError as exc:
            raise UsageError(str(exc)) from None
    return Budget(**values)


def load_budget_file(path: Union[str, Path], *, required: bool = False) -> Budget:
    """The budget in ``[tool.flopcount]`` of a pyproject.toml; an empty budget when the
    file (unless ``required``) or the table is missing. Malformed TOML or values raise
    :class:`UsageError` naming the file and the key."""
    path = Path(path)
    if not path.is_file():
        if required:
            raise UsageError(f"config file not found: {path}")
        return Budget()
    toml = _toml_module()
    try:
        with open(path, "rb") as fh:
            document = toml.load(fh)
    except toml.TOMLDecodeError as exc:
        raise UsageError(f"{path}: not valid TOML: {exc}") from exc
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from exc
    tool = document.get("tool", {})
    if not isinstance(tool, Mapping):
        raise UsageError(f"{path}: [tool] must be a table")
    table = tool.get("flopcount")
    if table is None:
        return Budget()
    if not isinstance(table, Mapping):
        raise UsageError(f"{path}: [tool.flopcount] must be a table, got {type(table).__name__}")
    return budget_from_mapping(table, f"{path} [tool.flopcount]")


def _toml_module() -> Any:
    try:
        import tomllib  # Python >= 3.11

        return tomllib
    except ImportError:
        pass
    try:
        import tomli

        return tomli
    except ImportError as exc:
        raise UsageError("reading pyproject.toml needs Python >= 3.11 or the tomli package (pip install tomli)") from exc
