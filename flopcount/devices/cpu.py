"""What this CPU says about itself: its ISA peak FLOP/s (the physical ceiling a measured
roof must stay under) and its data caches, read from /proc/cpuinfo and /sys. No torch.

ISA peak per dtype = cores x FMA units x vector lanes x 2 (an FMA is two FLOPs) x max clock,
each figure taken at its upper end (two FMA units, SMT siblings counted as cores), so it stays
a ceiling; lanes per flag, AMX tiles and the clock's sources: docs/devices.md, "This machine's
roofs" (ISA peak).
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, FrozenSet, List, Optional, Tuple

FMA_UNITS = 2


@dataclass(frozen=True)
class CacheLevel:
    """One data cache: ``size`` bytes per instance, shared by ``sharers`` logical CPUs."""

    level: int
    size: int
    sharers: int

    def capacity(self, threads: int) -> int:
        """Bytes ``threads`` threads (on distinct CPUs) can hold in this level together."""
        instances = max(1, -(-max(1, threads) // max(1, self.sharers)))
        return self.size * instances


@dataclass(frozen=True)
class CpuFacts:
    model: str
    flags: FrozenSet[str]
    cores: int
    max_hz: Optional[float]
    clock_source: str
    caches: Tuple[CacheLevel, ...] = ()
    notes: Tuple[str, ...] = field(default_factory=tuple)

    def lanes(self) -> int:
        """float32 lanes of one FMA instruction."""
        if "avx512f" in self.flags:
            return 16
        return 8 if "avx2" in self.flags and "fma" in self.flags else 4

    def isa_peak(self, threads: Optional[int] = None) -> Dict[str, float]:
        """FLOP/s ceilings per dtype for ``threads`` threads (default: every core)."""
        if not self.max_hz:
            return {}
        cores = min(self.cores, threads or self.cores)
        fp32 = cores * FMA_UNITS * self.lanes() * 2 * self.max_hz
        peaks = {"float32": fp32, "float64": fp32 / 2}
        # a dot-product instruction doubles float32's rate; AMX tiles do 1024 FLOPs per cycle per core
        for dtype, dot, tiles in (("bfloat16", "avx512_bf16", "amx_bf16"), ("float16", "avx512_fp16", "amx_fp16")):
            peaks[dtype] = max(fp32 * (2 if dot in self.flags else 1), cores * 1024 * self.max_hz if tiles in self.flags else 0.0)
        # int8: 4 byte products per float32 lane per instruction; AMX tiles 2048 per cycle per core
        peaks["int8"] = max(4 * fp32, cores * 2048 * self.max_hz if "amx_int8" in self.flags else 0.0)
        return peaks


def _read(path: str) -> Optional[str]:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def _cpuinfo(text: Optional[str] = None) -> Tuple[str, FrozenSet[str], List[float]]:
    text = _read("/proc/cpuinfo") if text is None else text
    model, flags, mhz = "", frozenset(), []  # type: Tuple[str, FrozenSet[str], List[float]]
    for line in (text or "").splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and not model:
            model = value.strip()
        elif key == "flags" and not flags:
            flags = frozenset(value.split())
        elif key == "cpu MHz":
            with contextlib.suppress(ValueError):
                mhz.append(float(value))
    return model, flags, mhz


def _lscpu_max_mhz() -> Optional[float]:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=5, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"CPU max MHz:\s*([\d.]+)", out)
    return float(match.group(1)) if match else None


def _cpu_list(text: str) -> int:
    count = 0
    for part in text.split(","):
        if "-" in part:
            lo, hi = part.split("-")
            count += int(hi) - int(lo) + 1
        elif part.strip():
            count += 1
    return count


def _size(text: str) -> int:
    match = re.fullmatch(r"(\d+)\s*([KMG]?)", text.strip().upper())
    return 0 if not match else int(match.group(1)) * {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}[match.group(2)]


def read_caches(root: str = "/sys/devices/system/cpu/cpu0/cache") -> Tuple[CacheLevel, ...]:
    """The data and unified caches of cpu0, by level (instruction caches left out)."""
    found: Dict[int, CacheLevel] = {}
    base = Path(root)
    if not base.is_dir():
        return ()
    for index in sorted(base.glob("index*")):
        kind = _read(str(index / "type")) or ""
        if kind not in ("Data", "Unified"):
            continue
        level = int(_read(str(index / "level")) or 0)
        size = _size(_read(str(index / "size")) or "")
        sharers = _cpu_list(_read(str(index / "shared_cpu_list")) or "0")
        if level and size:
            found[level] = CacheLevel(level, size, max(1, sharers))
    return tuple(found[k] for k in sorted(found))


def cpu_facts(cpuinfo: Optional[str] = None, cpufreq: Optional[str] = None, cache_root: Optional[str] = None) -> CpuFacts:
    """This CPU's model, flags, usable cores, max clock and caches (arguments: test doubles)."""
    model, flags, mhz = _cpuinfo(cpuinfo)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    notes = []
    freq = _read("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq") if cpufreq is None else cpufreq
    if freq:
        hz, source = float(freq) * 1e3, "cpufreq cpuinfo_max_freq"
    else:
        lscpu = _lscpu_max_mhz() if cpuinfo is None else None
        if lscpu:
            hz, source = lscpu * 1e6, "lscpu CPU max MHz"
        elif mhz:
            hz, source = max(mhz) * 1e6, "/proc/cpuinfo cpu MHz (no max clock published: turbo may exceed it)"
            notes.append("no maximum clock is published here; the current clock is used")
        else:
            hz, source = 0.0, "unknown"
    caches = read_caches(cache_root or "/sys/devices/system/cpu/cpu0/cache")
    return CpuFacts(model or "cpu", flags, cores, hz or None, source, caches, tuple(notes))
